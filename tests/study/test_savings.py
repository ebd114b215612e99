"""Issue 38, items 5 and 15: the steps trained, the device-hours spent and saved, and the pauses
that `sweep report` and the run's closing line say, against what the trainers did."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from conftest import (
    TRAINERS,
    load_trials,
    run_cli,
    spawn_cli,
    study_dict,
    wait_until,
    with_orphan,
)
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from sweep._core import names
from sweep.analysis import figures, report
from sweep.study import savings

STEP_LOG = TRAINERS / "step_log.py"

SWEEP_OWN_S = 0.5  # the most sweep's own work adds to an attempt on a busy machine
# Each report interval (25 steps) takes about 10 s, its save included: sweep's own time
# around each attempt (its ask and files before the trainer starts, its tell after) is then
# well under 1 % of what the attempt held its device.
# (the study section, max_steps, devices)
SCHEDULERS = {
    "asha": ({"n_trials": 4, "scheduler": {"type": "asha", "min_steps": 25, "max_steps": 100,
                                           "reduction_factor": 2}}, 100, 2),
    # the worst configuration starts last: it reports step 25 after the others and is
    # replaced there by a copy of the best (paused for the copy, then continued)
    "pbt": ({"n_trials": 4, "enqueue": [{"x": 0.3}, {"x": 0.4}, {"x": 0.95}],
             "scheduler": {"type": "pbt", "population": 3, "interval": 25, "max_steps": 100,
                           "seed": 0}}, 100, 3),
    "none": ({"n_trials": 2}, 50, 2),
}


def logged(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SCHEDULERS))
def test_the_report_says_what_the_trainers_logged(write_study, tmp_path, kind):
    """Acceptance of issue 38 (the cross-check; item 5): under asha, pbt and no scheduler, a
    trainer that reports every 25 steps keeps its own log of the steps it trained, its stops,
    resumes and time; the report's steps trained, stops and pauses, and device-hours spent
    and saved are those the logs give (within 1 %), and so is the run's closing line."""
    study, steps, devices = SCHEDULERS[kind]
    log = tmp_path / "log"
    path = write_study(study_dict(
        study={"heartbeat_interval": 1, **study},
        trainer={"script": str(STEP_LOG), "grace_period": 30.0,
                 "args": ["--steps", str(steps), "--every", "25", "--sleep", "0.3",
                          "--save", "2.5", "--log", str(log)]}))
    run = spawn_cli("run", str(path), env={"SWEEP_FAKE_GPUS": str(devices)})
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stderr
    records = logged(log)
    trials = load_trials(path)
    assert len(records) == sum(t.datetime_start is not None for t in trials)

    # the figures, from the trainers' logs alone
    spent = sum(r["ended"] - r["started"] for r in records) / 3600
    trained = sum(r["steps"] for r in records)
    stops = [r for r in records if r["stopped"]]
    # a pause is a stop its lineage's folder may be continued from: one that was (the same
    # folder resumed by a later process), or a lineage no other replaced (asha's never
    # promoted); a PBT lineage replaced by an exploit is stopped for good
    resumed = {(r["folder"], r["start_step"]) for r in records if r["resumed"]}
    pauses = [r for r in stops if (r["folder"], r["end_step"]) in resumed or kind != "pbt"]
    lineages = {r["folder"] for r in records}
    per_step = spent / trained
    full = per_step * steps * len(lineages)

    s, study_ = report.load(path)
    said = figures.savings(s, study_)
    assert said["steps"] == pytest.approx(trained, rel=0.01)
    assert said["stops"] == len(stops)
    assert said["pauses"] == len(pauses)
    assert said["configurations"] == len(lineages)
    assert said["max_steps"] == steps
    # sweep holds a device from its ask to its tell, a little longer than the trainer's
    # process lives: its guard's start (a Python interpreter of its own: seconds on a busy
    # machine), its files before, its reading of the result after. From the guard's start
    # (the trainer's parent, in the kernel's record) that is within 1 % on a quiet machine;
    # on a busy one each attempt may take up to SWEEP_OWN_S more, never less than logged
    held = sum(r["ended"] - r["parent_started"] for r in records) / 3600
    own = SWEEP_OWN_S * len(records) / 3600
    assert spent <= said["device_hours"] <= held * 1.01 + own
    slack = (said["device_hours"] - spent) / spent  # what sweep's own work adds, relatively
    assert said["full_device_hours"] == pytest.approx(full * (1 + slack), rel=0.01)
    assert said["saved_device_hours"] == pytest.approx(
        (full - spent) * (1 + slack), rel=0.01, abs=0.01 * spent)
    if kind == "none":  # every configuration trained to the end: nothing saved
        assert abs(said["saved_device_hours"]) < 0.01 * spent
    else:
        assert said["saved_device_hours"] > 0.1 * spent
    page = report.render(s, study_)
    table = page[page.index('id="savings"'):]
    assert f"<td class=num>{said['saved_device_hours']:.3g}</td>" in table
    assert f"<td class=num>{said['steps']}</td>" in table
    closing = re.search(r"([\d.e-]+) device-hours spent on (\d+) steps trained.*: "
                        r"([\d.e-]+) saved", stderr)
    if kind == "none":  # nothing stopped early: no such line
        assert closing is None
    else:
        assert closing is not None, stderr
        assert float(closing[1]) == pytest.approx(said["device_hours"], rel=0.01)
        assert int(closing[2]) == said["steps"]
        assert float(closing[3]) == pytest.approx(said["saved_device_hours"], rel=0.01)


# ---- stored studies: steps, device-hours and ends, exactly ----------------------------------

T0 = dt.datetime(2026, 12, 1, 12, 0, 0)
X = FloatDistribution(0.0, 1.0)


def attempt(number: int, steps: list[int], seconds: float, state: TrialState = TrialState.PRUNED,
            start: float = 0.0, **attrs: Any) -> FrozenTrial:
    """Trial `number`, reporting `steps`, that held one device `seconds` from T0 + `start`."""
    begin = T0 + dt.timedelta(seconds=start)
    return FrozenTrial(
        number=number, trial_id=number, state=state,
        value=None, values=[0.1] if state is TrialState.COMPLETE else None,
        datetime_start=begin, datetime_complete=None if state is TrialState.RUNNING
        else begin + dt.timedelta(seconds=seconds),
        params={"x": 0.5}, distributions={"x": X},
        user_attrs={names.GPU: 0, names.HOST: "node1", names.ATTEMPT: 0, **attrs}, system_attrs={},
        intermediate_values={s: 1.0 / (s + 1) for s in steps})


def stored(write_study: Any, trials: list[FrozenTrial], **study: Any) -> tuple[Any, Any]:
    path = write_study(study_dict(study=study))
    created = optuna.create_study(study_name="probe",
                                  storage=f"sqlite:///{path.parent / 'probe.db'}")
    for t in trials:
        created.add_trial(t)
    return path, created


ASHA = {"scheduler": {"type": "asha", "min_steps": 25, "max_steps": 100,
                      "reduction_factor": 2}}


def test_steps_trained_are_the_step_numbers_reported_not_the_reports():
    """Item 5: a script that reports every 25 steps trained 25 steps a report; a continuation
    carries its lineage's curve (those steps are not its own); a PBT exploit trains from the
    step of its donor's state; one that started over (`resumed_at`) trained its steps again;
    a script counting from 0 (step 0 after one step) trained one step more than its last."""
    trials = [
        attempt(0, [25, 50], 50, paused_at=50),
        attempt(1, [25, 50, 75, 100], 50, TrialState.COMPLETE, attempt=1, retry_of=0,
                continues=0),
        attempt(2, [75, 100], 50, TrialState.COMPLETE, exploit_of=1, exploit_step=50),
        attempt(3, [25], 25, paused_at=25),
        attempt(4, [25, 50], 50, TrialState.COMPLETE, attempt=1, retry_of=3, continues=3,
                resumed_at=25, steps_repeated=1),
    ]
    assert savings.steps_trained(trials) == {0: 50, 1: 50, 2: 50, 3: 25, 4: 50}
    zero = [attempt(0, [0, 1, 2], 3), attempt(1, [3, 4], 2, attempt=1, retry_of=0)]
    assert savings.steps_trained(zero) == {0: 3, 1: 2}


def test_the_report_saves_against_steps_trained_not_reports(write_study):
    """Item 5: asha, reports every 25 steps, one step a second: 3 configurations; two paused
    at 25, one at 50 and continued to 100. 150 steps in 150 device-seconds; all three to
    step 100 would have taken 300: 150 saved (main said 7,350, from 6 reports)."""
    path, _ = stored(write_study, [
        attempt(0, [25], 25, paused_at=25), attempt(1, [25], 25, paused_at=25),
        attempt(2, [25, 50], 50, paused_at=50),
        attempt(3, [25, 50, 75, 100], 50, TrialState.COMPLETE, start=60, attempt=1,
                retry_of=2, continues=2)], **ASHA)
    s, study = report.load(path)
    assert figures.savings(s, study) == pytest.approx({
        "device_hours": 150 / 3600, "steps": 150, "pauses": 3, "stops": 3,
        "configurations": 3, "max_steps": 100, "full_device_hours": 300 / 3600,
        "saved_device_hours": 150 / 3600})
    table = report.render(s, study)
    table = table[table.index('id="savings"'):]
    assert f"<td class=num>{150 / 3600:.3g}</td></tr></table>" in table  # saved, the last row


def test_without_a_scheduler_every_configuration_to_the_longest_completed(write_study):
    """Item 5: no scheduler, a pruner stopped one trial at step 25 of 100: the report's
    savings are against training both to step 100 (the longest that completed)."""
    path, _ = stored(write_study, [
        attempt(0, [25, 50, 75, 100], 100, TrialState.COMPLETE), attempt(1, [25], 25)])
    s, study = report.load(path)
    said = figures.savings(s, study)
    assert (said["steps"], said["max_steps"], said["stops"], said["pauses"]) == (125, 100, 1, 0)
    assert said["saved_device_hours"] == pytest.approx(75 / 3600)


def samples_file(output_dir: Path, host: str, pid: int, rows: list[tuple[float, str]]) -> Path:
    """A driver's `gpu_samples.csv` with (epoch s, trials) rows on GPU 0."""
    from sweep.trial import folders

    path = folders.driver_dir(output_dir, host, pid) / "gpu_samples.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("time,host,gpu,trials,util_gpu,util_mem,mem_used_mb,mem_total_mb,power_w\n"
                    + "".join(f"{t},{host},0,{held},,,,,\n" for t, held in rows))
    return path


def test_a_dead_drivers_trials_end_at_their_last_sign_of_life(write_study):
    """Item 15: trial 0 was told FAIL by the next run's reclaim 1000 s after it started, its
    driver last seen alive at 60 s (`alive_until`); trial 1 is RUNNING, its driver dead: the
    samples last showed it at 30 s; trial 2 is RUNNING and its samples are fresh. On the
    timeline and in the costs, 0 ends at 60 s, 1 at 30 s, 2 now (main: 1000 s, now, now); in
    the summary's lineage device-seconds and per-GPU busy time too."""
    path, _ = stored(write_study, [
        attempt(0, [], 1000, TrialState.FAIL, fail_reason="driver died (pid 1 on node1)",
                alive_until=(T0 + dt.timedelta(seconds=60)).timestamp()),
        attempt(1, [], 0, TrialState.RUNNING), attempt(2, [], 0, TrialState.RUNNING)])
    s, _ = report.load(path)
    now = T0 + dt.timedelta(seconds=2000)
    epoch = (T0 - dt.datetime(1970, 1, 1)).total_seconds() - (  # naive local, as Optuna's
        dt.datetime.now().astimezone().utcoffset() or dt.timedelta()).total_seconds()
    samples_file(s.spec.output_dir, "node1", 1, [(epoch + 10, "1;2"), (epoch + 30, "1;2"),
                                                 (epoch + 1999, "2")])
    s, _ = report.load(path)
    t = figures.with_costs(s, now).set_index("number")
    assert [(e - T0).total_seconds() for e in t["end"]] == [60.0, 30.0, 2000.0]
    assert list(t["device_hours"] * 3600) == pytest.approx([60.0, 30.0, 2000.0])
    # as the summary counts them: the reclaimed trial's lineage took 60 device-seconds, and
    # GPU 0 was busy until the running trial's last sample, days ago (read now)
    assert s.trials.set_index("number").loc[0, "lineage_device_s"] == 60.0
    assert list(s.gpus["busy_s"]) == [1999.0]


def test_a_reclaimed_trial_keeps_its_drivers_last_sign_of_life(tmp_path):
    """Item 15: the reclaim tells a dead driver's trial FAIL with `alive_until`, the later of
    its `beat` and its driver's last GPU sample of it."""
    s, _ = with_orphan(tmp_path)
    owner = s.trials[0].user_attrs[names.OWNER]
    samples_file(s.spec.output_dir, owner["host"], owner["pid"],
                 [(1000.5, "0"), (1001.5, "0;3"), (1002.5, "3")])
    assert s.run() == 0
    assert s.trials[0].user_attrs[names.ALIVE_UNTIL] == 1001.5
    assert savings.ended(s.trials[0], dt.datetime.now()) == max(
        s.trials[0].datetime_start, dt.datetime.fromtimestamp(1001.5))


@pytest.mark.slow
def test_a_killed_drivers_trial_is_drawn_until_its_last_sign_of_life(write_study, tmp_path,
                                                                     fake_gpus, capsys):
    """Item 15, end to end: a driver killed -9 mid-trial. Its trial, still RUNNING, ends in
    the report at the driver's last GPU sample of it, not now; once the next run (started
    seconds later) reclaimed it, at the same moment, not at the reclaim (main: both later)."""
    path = write_study(study_dict(
        study={"n_trials": 1, "heartbeat_interval": 1, "reclaim_after": 2},
        trainer={"script": str(STEP_LOG), "grace_period": 5.0,
                 "args": ["--steps", "40", "--every", "5", "--sleep", "0.1",
                          "--log", str(tmp_path / "log")]}))
    fake_gpus(1)
    first = spawn_cli("run", str(path))

    def reported() -> bool:
        try:
            return bool(load_trials(path)[0].intermediate_values)
        except (KeyError, IndexError):
            return False

    # mid-trial however busy the machine: the trainer (4 s of steps) is stopped (SIGSTOP)
    # once it reported, until its driver is killed
    reports = path.parent / "probe" / "trials" / "0" / "reports.jsonl"
    assert wait_until(lambda: reports.exists() and reports.read_text(), 60)
    [trainer] = [p for p in psutil.Process(first.pid).children(recursive=True)
                 if str(STEP_LOG) in p.cmdline()[1:2]]  # not its guard
    trainer.suspend()
    assert wait_until(reported, 60, every=0.25)
    first.kill()
    killed = dt.datetime.now()
    first.communicate(timeout=30)
    with contextlib.suppress(psutil.Error):  # its guard ends it, its grace given
        trainer.resume()
    assert wait_until(lambda: dt.datetime.now() > killed + dt.timedelta(seconds=4), 10)
    s, _ = report.load(path)
    end = figures.with_costs(s).set_index("number").loc[0, "end"]
    assert s.trials.set_index("number").loc[0, "state"] == "RUNNING"
    assert killed - dt.timedelta(seconds=1.5) <= end <= killed
    assert run_cli("run", str(path)) == 0, capsys.readouterr().err  # the next run, in-process
    s, _ = report.load(path)
    t = figures.with_costs(s).set_index("number")
    assert list(t["state"]) == ["FAIL", "COMPLETE"]
    assert t.loc[0, "datetime_complete"] > killed + dt.timedelta(seconds=4)  # the reclaim
    assert killed - dt.timedelta(seconds=1.5) <= t.loc[0, "end"] <= killed
    assert t.loc[0, "device_hours"] * 3600 == pytest.approx(
        (t.loc[0, "end"] - t.loc[0, "datetime_start"]).total_seconds())
