"""An interrupted trial continues where it stopped: the driver SIGTERMed four times and SIGKILLed
four times (SWEEP_STRESS_ROUNDS each, for more) at random moments while a trial runs (once it has
made a step in that round, then a random while), each time followed by a rerun, with a trainer that
checkpoints every step. Exactly n_trials finish, every lineage ran each of its steps once plus at
most one per interruption that hit it, nothing is left RUNNING or queued, and no process outlives
the end by 5 s."""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from pathlib import Path

import pytest
from conftest import (
    TRAINERS,
    load_trials,
    processes_mentioning,
    run_cli,
    spawn_cli,
    study_dict,
    wait_until,
)

from sweep._core import names

CKPT_PROBE = TRAINERS / "ckpt_probe.py"
STEPS = 30
N_TRIALS = 8
CUT = ("interrupted", "driver died")


def steps_logged(study: Path) -> list[tuple[int, int, int]]:
    """(lineage, trial number, step) of every step any attempt ran."""
    out = []
    for log in (study.parent / "probe" / "checkpoints").glob("*/steps.log"):
        for line in log.read_text().splitlines():
            number, step = line.split()
            out.append((int(log.parent.name), int(number), int(step)))
    return out


@pytest.mark.slow
def test_sigterm_and_sigkill_at_random_moments_each_trial_continues_from_its_checkpoint(
        write_study, tmp_path, fake_gpus, capsys):
    rng = random.Random(int(os.environ.get("SWEEP_STRESS_SEED", "22")))
    study = write_study(study_dict(
        study={"n_trials": N_TRIALS, "heartbeat_interval": 1, "reclaim_after": 2},
        trainer={"script": str(CKPT_PROBE), "grace_period": 2.0,
                 "args": ["--steps", str(STEPS), "--sleep", "0.05"]},
    ))
    env = {"SWEEP_FAKE_GPUS": "2"}
    each = int(os.environ.get("SWEEP_STRESS_ROUNDS", "4"))
    kinds = [signal.SIGTERM] * each + [signal.SIGKILL] * each
    rng.shuffle(kinds)
    log = []
    for round_, kind in enumerate(kinds):
        before = len(steps_logged(study))
        driver = spawn_cli("run", str(study), env=env)
        # a moment while a trial runs: once it has made a step in this round, then a while
        assert wait_until(lambda b=before: len(steps_logged(study)) > b, 60), (round_, log)
        time.sleep(rng.uniform(0.0, 0.3))
        driver.send_signal(kind)
        _, err = driver.communicate(timeout=30)
        log.append((round_, kind.name, driver.returncode))
        if kind is signal.SIGTERM:
            assert driver.returncode == 130, err
            assert "Traceback" not in err
            assert not [t for t in load_trials(study) if t.state.name == "RUNNING"], log
        assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5), (
            f"round {round_} ({kind.name}): trial processes outlived the driver by 5 s")

    # the rerun in this process (as `sweep run`, without a second interpreter's imports)
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5)

    trials = load_trials(study)
    states = collections.Counter(t.state.name for t in trials)
    assert states["COMPLETE"] == N_TRIALS and states["RUNNING"] == states["WAITING"] == 0, states
    assert all(t.user_attrs[names.FAIL_REASON].startswith(CUT) for t in trials
               if t.state.name == "FAIL")
    # a kill between Optuna's ask and its params leaves a trial that never got them (no
    # trainer ran): told FAIL "driver died" (before recording itself, where the kill came
    # before its owner record too), and nothing is queued to continue it
    never_ran = [t for t in trials if t.state.name == "FAIL" and not t.params
                 and not t.system_attrs.get(names.FIXED_PARAMS)]
    assert all(t.user_attrs[names.FAIL_REASON].startswith("driver died") for t in never_ran)
    assert not [r for r in trials for t in never_ran
                if r.user_attrs.get(names.RETRY_OF) == t.number], "a trial without params queued"
    by_lineage: dict[int, list] = collections.defaultdict(list)
    for t in (t for t in trials if t not in never_ran):
        by_lineage[t.user_attrs.get(names.RETRY_OF, t.number)].append(t)
    assert len(by_lineage) == N_TRIALS
    hits_total = 0
    ran = collections.Counter(lineage for lineage, _, _ in steps_logged(study))
    steps = collections.defaultdict(set)
    for lineage, _, step in steps_logged(study):
        steps[lineage].add(step)
    for origin, attempts in by_lineage.items():
        done = [t for t in attempts if t.state.name == "COMPLETE"]
        assert len(done) == 1, (origin, attempts)
        hits = sum(t.state.name == "FAIL" for t in attempts)
        hits_total += hits
        assert steps[origin] == set(range(STEPS)), origin
        assert STEPS <= ran[origin] <= STEPS + hits, (origin, ran[origin], hits)
        # an attempt cut before its params has them queued only (fixed_params)
        assert {{**t.system_attrs.get(names.FIXED_PARAMS, {}), **t.params}["x"]
                for t in attempts} == {done[0].params["x"]}
        assert {t.user_attrs[names.RUN_ID] for t in attempts} == {done[0].user_attrs[names.RUN_ID]}
        # the continuation carries the curve of the attempts before it
        assert set(done[0].intermediate_values) >= set().union(
            *(t.intermediate_values for t in attempts))
        # the retries of max_retries are not spent by interruptions
        assert all(t.user_attrs.get(names.RETRIES, 0) == 0 for t in attempts)
    assert hits_total >= len(kinds), (hits_total, log)


TERM_SAVER = TRAINERS / "term_saver.py"


@pytest.mark.slow
def test_a_reclaim_gives_a_dead_drivers_trainer_its_grace_and_the_continuation_resumes(
        write_study, tmp_path, fake_gpus, capsys):
    """Issue 32: a new run that reclaimed the trial of a SIGKILLed driver SIGKILLed its
    trainer at once, inside its stop_grace: a trainer saving on SIGTERM lost its save and the
    continuation started at step 0. The reclaim now leaves the trainer its grace (its guard
    stops it) and queues the continuation only once it is gone; the continuation starts from
    the step the trainer saved."""
    study = write_study(study_dict(
        study={"n_trials": 1},
        trainer={"script": str(TERM_SAVER), "grace_period": 30.0,
                 "args": ["--steps", "80", "--sleep", "0.05", "--save-seconds", "10"]}))
    reports = tmp_path / "probe" / "trials" / "0" / "reports.jsonl"
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
    assert wait_until(lambda: reports.exists() and len(reports.read_text().splitlines()) >= 10,
                      60), driver.stderr
    os.kill(driver.pid, signal.SIGKILL)  # its guard TERMs the trainer, which saves for 10 s
    driver.communicate(timeout=10)
    capsys.readouterr()
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    first, continuation = sorted(load_trials(study), key=lambda t: t.number)
    assert first.state.name == "FAIL" and first.user_attrs[names.FAIL_REASON].startswith(
        "driver died"), err
    assert continuation.state.name == "COMPLETE"
    assert continuation.user_attrs[names.RETRY_OF] == 0
    folder = tmp_path / "probe" / "checkpoints" / "0"
    starts = [line.split() for line in (folder / "starts.log").read_text().splitlines()]
    assert starts[0][:2] == ["0", "0"] and starts[1][0] == "1", starts
    assert int(starts[1][1]) >= 10, (starts, err)  # from the step it saved, not from 0
    assert f'"next": {starts[1][1]}' in (folder / "state.json").read_text()
    assert "get trainer.stop_grace (30 s) to end" in err
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_a_trial_whose_lineage_folder_another_host_still_writes_is_continued_after(
        write_study, tmp_path, fake_gpus, capsys):
    """Issue 32: a frozen driver's trainer could still be writing the lineage's folder while
    its continuation ran elsewhere. Here the trial's driver is on another host and silent (its
    heartbeat stale), and a process holds the lineage's lock as that host's guard would on a
    shared file system, writing the folder for 10 s more: the reclaim waits for it, and the
    continuation starts only after it let go."""
    import subprocess
    import sys

    from sweep.spec import config, searchspace
    from sweep.study.opening import open_study
    from sweep.study.storage import open_storage

    study_file = write_study(study_dict(
        study={"n_trials": 1, "heartbeat_interval": 1, "reclaim_after": 2},
        trainer={"script": str(TERM_SAVER), "args": ["--steps", "5", "--sleep", "0.01"]}))
    spec = config.load(study_file)
    study = open_study(spec, open_storage(spec))
    trial = study.ask(searchspace.distributions(spec.searched))
    trial.set_user_attr(names.OWNER, {"host": "elsewhere", "pid": 1, "started": 1.0, "gpu": 0,
                                  "dir": str(tmp_path / "probe" / "trials" / "0")})
    study._storage.record_heartbeat(trial._trial_id)
    folder = tmp_path / "probe" / "checkpoints" / "0"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder.parent, 0o700)
    (folder.parent / ".0.sweep").write_text("0\n")  # the other host's sweep made it
    ready, ended = tmp_path / "ready", tmp_path / "ended"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "open(sys.argv[2], 'w').close()\n"
        "for _ in range(100):\n"
        "    open(sys.argv[4] + '/steps.log', 'a').write('elsewhere\\n')\n"
        "    time.sleep(0.1)\n"
        "open(sys.argv[3], 'w').write(repr(time.time()))\n"),
        str(folder.parent / ".0.lock"), str(ready), str(ended), str(folder)])
    try:
        assert wait_until(ready.exists, 10)
        time.sleep(3.5)  # stale: past the 2 s grace in SQLite's CURRENT_TIMESTAMP, whole seconds
        capsys.readouterr()
        assert run_cli("run", str(study_file)) == 0, capsys.readouterr().err
    finally:
        holder.wait(10)
    err = capsys.readouterr().err
    trials = sorted(load_trials(study_file), key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"], err
    assert trials[0].user_attrs[names.FAIL_REASON] == "driver on elsewhere died (no heartbeat)"
    [start] = [line.split() for line in (folder / "starts.log").read_text().splitlines()]
    assert start[0] == "1" and float(start[2]) >= float(ended.read_text()), err
    assert "its lineage's checkpoint folder is still in use" in err
