"""Issue 31's acceptance with real processes: asha (min_steps 2, max_steps 18, rf 3), 9
configurations, a trainer that checkpoints every step and resumes from its folder, 2
simulated GPUs shared by 2 drivers (the host's slot locks), with and without a kill -9 of
one driver mid-way (the run after the kill, alone, is this test's own process)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import TRAINERS, load_trials, processes_mentioning, spawn_cli, study_dict, wait_until
from conftest import run_cli as run_here

from sweep._core import names

CKPT_PROBE = TRAINERS / "ckpt_probe.py"
STEPS, N = 18, 9
XS = (0.3, 0.32, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)


def promoted_yet(study: Path) -> bool:
    try:
        return any(names.CONTINUES in t.user_attrs for t in load_trials(study))
    except KeyError:  # the study is not created yet
        return False


def steps_logged(study: Path) -> list[tuple[int, int]]:
    """(lineage, step) of every step any attempt ran."""
    out = []
    for log in (study.parent / "probe" / "checkpoints").glob("*/steps.log"):
        for line in log.read_text().splitlines():
            out.append((int(log.parent.name), int(line.split()[1])))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_asha_with_two_drivers_pauses_promotes_and_resumes_every_lineage(
        write_study, tmp_path, capsys, monkeypatch, kill):
    study = write_study(study_dict(
        study={"n_trials": N, "heartbeat_interval": 1, "reclaim_after": 2,
               # the best first: they are paused at rung 0 (too few there yet), and
               # promoted once worse ones have come
               "enqueue": [{"x": x} for x in XS],
               # every lineage's own step log stays: the evidence read below
               "scheduler": {"type": "asha", "min_steps": 2, "max_steps": STEPS,
                             "reduction_factor": 3, "keep_checkpoints": "all"}},
        trainer={"script": str(CKPT_PROBE), "grace_period": 5.0,
                 "args": ["--steps", str(STEPS), "--sleep", "0.1"],
                 "resume_args": ["--resume"]},
    ))
    env = {"SWEEP_FAKE_GPUS": "2"}
    first, second = spawn_cli("run", str(study), env=env), spawn_cli("run", str(study), env=env)
    if kill:  # once a lineage has been paused and promoted, mid-way
        assert wait_until(lambda: promoted_yet(study), 60)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    else:
        _, err = first.communicate(timeout=180)
        assert first.returncode == 0, err
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    assert "Traceback" not in err
    if kill:  # what the survivor may have left to another run (it waits for none of it)
        monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
        code = run_here("run", str(study))  # (in this process: both drivers have ended)
        err = capsys.readouterr().err
        assert code == 0, err
        assert "Traceback" not in err
    assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5)

    trials = load_trials(study)
    states = collections.Counter(t.state.name for t in trials)
    assert states["RUNNING"] == states["WAITING"] == 0, states
    lineages: dict[int, list] = collections.defaultdict(list)
    for t in trials:
        if t.params:  # a kill between the ask and the owner record: no trainer ran
            lineages[t.user_attrs.get(names.RETRY_OF, t.number)].append(t)
    assert len(lineages) == N  # n_trials counts configurations
    paused = [t for t in trials if names.PAUSED_AT in t.user_attrs]
    assert paused and {t.state.name for t in paused} <= {"PRUNED", "FAIL"}
    promoted = [t for t in trials if names.CONTINUES in t.user_attrs
                and names.PAUSED_AT in trials[t.user_attrs[names.CONTINUES]].user_attrs]
    assert promoted
    # every continuation resumed from its checkpoint; a step ran twice only where an attempt
    # was cut (a pause or a kill between the step's log line and its checkpoint)
    assert not [t.number for t in trials if names.STEPS_REPEATED in t.user_attrs]
    ran = collections.Counter(origin for origin, _ in steps_logged(study))
    distinct = collections.defaultdict(set)
    for origin, step in steps_logged(study):
        distinct[origin].add(step)
    for origin, attempts in lineages.items():
        assert distinct[origin] == set(range(max(distinct[origin]) + 1)), origin
        cuts = sum(t.state.name != "COMPLETE" for t in attempts)
        assert ran[origin] <= len(distinct[origin]) + cuts, (origin, ran[origin], cuts)
        # no lineage ran in two processes at once: each attempt began after the one before
        spans = sorted((t.datetime_start, t.datetime_complete) for t in attempts)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), origin
    # the best lineages reached max_steps: whatever was in the top of a rung was promoted
    done = [o for o, a in lineages.items() if any(t.state.name == "COMPLETE" for t in a)]
    assert done and all(max(distinct[o]) == STEPS - 1 for o in done)
    curves = {o: {s: v for t in a for s, v in t.intermediate_values.items()}
              for o, a in lineages.items()}
    # a lineage's value at rung 1: at the first step it reported at or after step 6
    at_rung_1 = {o: c[min(s for s in c if s >= 6)] for o, c in curves.items()
                 if any(s >= 6 for s in c)}
    if len(at_rung_1) >= 3:
        assert min(at_rung_1, key=at_rung_1.__getitem__) in done
    # fewer steps in all than training every configuration to the end
    assert sum(ran.values()) < N * STEPS


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fresh", "restores_x", "bounded"])
def test_pbt_exploits_start_from_their_donors_checkpoint_with_perturbed_params(
        write_study, tmp_path, mode):
    """A population of 4, n_trials 6: two exploits, each a new lineage whose folder is a copy
    of its donor's, started with the donor's x perturbed; the trainer's own output shows the
    step it started at and its x. `bounded` carries the trainer that resumes from its copy (the
    step it starts at, no steps repeated, its own perturbed x; the copy's record of its donor
    is checked under `fresh` and `restores_x`, which keep every folder). A trainer that
    ignores its folder (`--fresh`) is flagged, and so is one that takes x from the checkpoint
    (`--restore-x`: trainer.logged_params).
    `bounded`: 100 kB of weights a lineage, max_checkpoint_gb 0.55 MB, the folders of lineages
    that can never continue removed: the disk stays within its bound (6 folders would not;
    on a busy machine both exploits copied one pause of their donor before any trial ended,
    and the first one's replaced lineage was still there at the second copy: now each copy
    makes room first). On a busy machine an exploit may be called off (its donor at its last
    step when the driver read its reports): it is checked as such (`assert_called_off`)."""
    fresh, bounded = mode == "fresh", mode == "bounded"
    flags = {"fresh": ["--fresh"], "restores_x": ["--restore-x"],
             "bounded": ["--weights", "100000"]}[mode]
    # 0.4 s a step: the driver must read a lineage's report at a multiple of `interval` while
    # it runs; at 0.1 s (2 s a trial) a driver slowed by a busy machine read them only after
    # the trainers had ended, and no exploit was due (every run under load failed)
    args = ["--steps", "20", "--sleep", "0.4", *flags]
    study = write_study(study_dict(
        study={"n_trials": 6, "heartbeat_interval": 1,
               "enqueue": [{"x": x} for x in (0.3, 0.5, 0.7, 0.9)],
               "scheduler": {"type": "pbt", "population": 4, "interval": 5, "max_steps": 20,
                             "perturb": [0.8, 1.25], "resample_probability": 0, "seed": 0,
                             **({"max_checkpoint_gb": 0.00055} if bounded
                                else {"keep_checkpoints": "all"})}},
        trainer={"script": str(CKPT_PROBE), "args": args, "resume_args": ["--resume"],
                 names.LOGGED_PARAMS: {"x": {"stdout": r"with x=(?P<value>\S+)"}}},
    ))
    folder = study.parent / "probe"
    disk: list[int] = []
    done = threading.Event()

    def measure() -> None:  # the checkpoint folders' bytes, every 20 ms while it runs
        while not done.wait(0.02):
            with contextlib.suppress(OSError):
                disk.append(sum(f.stat().st_size for f in (folder / "checkpoints").rglob("*")
                                if f.is_file() and not f.name.startswith(".")))

    run = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "4"})  # before the thread: a fork
    watcher = threading.Thread(target=measure, daemon=True)
    watcher.start()
    out, err = run.communicate(timeout=180)
    done.set()
    watcher.join()
    assert run.returncode == 0, err
    trials = load_trials(study)
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    exploits = [t for t in trials if names.EXPLOIT_OF in t.user_attrs]
    assert len(exploits) == 2, err
    for t in exploits:
        donor = trials[t.user_attrs[names.EXPLOIT_OF]]
        assert t.params["x"] in (pytest.approx(donor.params["x"] * 0.8),
                                 pytest.approx(min(1.0, donor.params["x"] * 1.25)))
        assert trials[t.user_attrs[names.REPLACES]].state.name == "PRUNED"
        if t.user_attrs.get(names.CALLED_OFF):  # its donor trained to the end first: not started
            assert_called_off(t, trials, folder, out + err)
            continue
        said = (folder / "trials" / str(t.number) / "stdout.log").read_text().splitlines()[0]
        step = int(said.split()[3])
        root = donor  # restoring x, a donor that is itself an exploit ran with its own donor's
        while mode == "restores_x" and names.EXPLOIT_OF in root.user_attrs:
            root = trials[root.user_attrs[names.EXPLOIT_OF]]
        ran = root.params["x"] if mode == "restores_x" else t.params["x"]
        assert said == f"starting at step {step} with x={ran}"
        # (an exploit that reported no step, its donor at the end when it was copied under a
        # loaded machine, is not judged)
        assert t.user_attrs.get(names.RESTORED_PARAMS) == (
            {"x": root.params["x"]} if mode == "restores_x" and t.intermediate_values
            else None)
        # the donor's own record came with the copy: its start, and the steps it had made
        copied = folder / "checkpoints" / str(t.number) / "starts.log"
        if not bounded:  # (bounded: removed once it ended)
            # (a donor that is itself an exploit holds its own donor's record first)
            starts = copied.read_text().splitlines()
            assert any(line.startswith(f"{donor.number} ") for line in starts), starts
            assert starts[0].split()[1] == "0"  # the lineage it came from started at 0
        if fresh:
            assert step == 0
            assert t.user_attrs[names.RESUMED_AT] == 0
            assert t.user_attrs[names.STEPS_REPEATED] == t.user_attrs[names.EXPLOIT_STEP] + 1
        else:
            assert step > t.user_attrs[names.EXPLOIT_STEP]
            assert names.STEPS_REPEATED not in t.user_attrs
    assert ("steps repeated" in out + err) is fresh
    assert ("restored its donor's value" in out + err) is (
        mode == "restores_x" and any(t.intermediate_values for t in exploits))
    if bounded:
        assert 4 * 100_000 < max(disk) <= 550_000 < 6 * 100_000
        best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
        left = sorted(p.name for p in (folder / "checkpoints").iterdir() if p.is_dir())
        assert left == [str(best.user_attrs.get(names.RETRY_OF, best.number))]  # its lineage's
        assert "max_checkpoint_gb" not in out + err


def assert_called_off(exploit: Any, trials: list[Any], folder: Path, said: str) -> None:
    """`exploit` was called off as pbt's docs say: its donor trained to the end before a state
    of it with a step left could be copied (on a busy machine, the driver read the donor's
    reports late: the exploit, decided while the donor had steps left, found it at its last
    step). It is told FAIL with the reason and never started (no trial folder, no step), and
    the lineage it was to replace went on in its place, to the end."""
    number, donor = exploit.number, exploit.user_attrs[names.EXPLOIT_OF]
    replaced = exploit.user_attrs[names.REPLACES]
    why = (f"its donor trial {donor} trained to the end before a state of it could be copied: "
           f"its final state leaves the exploit no step to train; trial {replaced} goes on in "
           "its place")
    assert exploit.state.name == "FAIL"
    assert exploit.user_attrs[names.FAIL_REASON] == f"exploit called off: {why}"
    assert f"trial {number} is called off: {why}" in said
    assert not exploit.intermediate_values and not (folder / "trials" / str(number)).exists()
    steps = [s for t in trials if t.user_attrs.get(names.RETRY_OF, t.number) == donor
             for s in t.intermediate_values]
    assert max(steps) == 19  # the donor's last step
    went_on = [t for t in trials if t.user_attrs.get(names.RETRY_OF) == replaced]
    assert went_on and went_on[-1].state.name == "COMPLETE"


def pause_decided(study: Path) -> bool:
    """Whether an attempt has its pause recorded (`paused_at`) and is not told yet. Read
    once the driver has asked a trial (its study file made: a reader opening it while the
    driver makes it races it to the schema's tables)."""
    if not any((study.parent / "probe" / "trials").glob("[0-9]*")):  # no trial asked yet
        return False
    try:
        return any(t.state.name == "RUNNING" and names.PAUSED_AT in t.user_attrs
                   for t in load_trials(study))
    except KeyError:  # the study is not created yet
        return False


@pytest.mark.slow
def test_a_driver_killed_right_after_it_paused_a_trial_at_a_rung_leaves_it_paused(
        write_study, tmp_path, capsys, monkeypatch):
    """Item 8 of issue 38: a kill -9 of the driver between recording a pause at rung 0 and
    telling it (the trainer finishes its 1.5 s step on SIGTERM: the window) left the attempt
    `driver died`, and its continuation trained past the rung unjudged. Now the continuation
    is judged at the rung before it starts: it is told PRUNED, paused there without running,
    and the lineage is promoted as a paused one would be (the rung, final, keeps its best)."""
    study = write_study(study_dict(
        study={"n_trials": 1, "heartbeat_interval": 1, "reclaim_after": 2,
               "scheduler": {"type": "asha", "min_steps": 2, "max_steps": 6,
                             "reduction_factor": 3}},
        trainer={"script": str(CKPT_PROBE), "grace_period": 5.0,
                 "args": ["--steps", "6", "--sleep", "1.5"], "resume_args": ["--resume"]},
    ))
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    first = spawn_cli("run", str(study))
    # the window held open, not caught by polling: the trainer is stopped (SIGSTOP) once it
    # reported the rung's step, so the driver's SIGTERM after the pause waits until the kill
    reports = study.parent / "probe" / "trials" / "0" / "reports.jsonl"
    assert wait_until(reports.exists, 60, every=0.1)
    [trainer] = [p for p in psutil.Process(first.pid).children(recursive=True)
                 if str(CKPT_PROBE) in p.cmdline()[1:2]]  # not its guard
    assert wait_until(lambda: '"step": 2' in reports.read_text(), 60, every=0.02)
    trainer.suspend()
    assert wait_until(lambda: pause_decided(study), 60, every=0.25)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    with contextlib.suppress(psutil.Error):  # its guard kills it as its driver dies
        trainer.resume()
    code = run_here("run", str(study))  # the next run, in this process
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    trials = load_trials(study)
    killed, judged, *rest = trials
    assert (killed.state.name, killed.user_attrs[names.PAUSED_AT],
            killed.user_attrs[names.RUNG]) == ("FAIL", 2, 0)
    assert (judged.state.name, judged.user_attrs[names.RETRY_OF],
            judged.user_attrs[names.PAUSED_AT], judged.user_attrs[names.RUNG]) == (
        "PRUNED", 0, 2, 0)
    # it carries its lineage's curve, and reported nothing of its own: it never ran
    assert judged.intermediate_values == killed.intermediate_values
    assert not (study.parent / "probe" / "trials" / str(judged.number)).exists()
    assert f"trial {judged.number} does not start: its lineage, trial 0, paused at step 2" in (
        out + err)
    assert [t.state.name for t in rest] == ["COMPLETE"]  # promoted: it trained to the end
    assert max(rest[0].intermediate_values) == 5
