"""Whatever a trainer writes is data: the worst it gets is its own FAIL with a one-line reason,
while its neighbour on the other GPU completes and the driver exits 0 (issue 9, part 1)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import TRAINERS, load_trials, processes_mentioning, run_cli, spawn_cli, wait_until

from sweep._core import names

HOSTILE = TRAINERS / "hostile.py"

CASES = [
    ("step_negative", "report line 1: step must be a whole number from 0 to 2147483647 (got -1)"),
    ("step_huge", "report line 1: step must be a whole number from 0 to 2147483647 "
                  "(got 99999999999999999999)"),
    ("value_huge", "report line 1: value must be a finite number (got 9999"),
    ("metric_huge", "metric 'score' is not a finite number: 9999"),
    ("metric_5000_digits", "metric 'score' is not a finite number: inf"),
    ("brackets", "exit code 1: error reading [/data/train]"),
    ("markup", "exit code 1: [red]x[/red] failed"),
    ("result_fifo", "no result: the result file "),
    ("result_dir", "no result: the result file "),
    ("report_dir", "the report file is not a regular file"),
    ("result_nested", "result file is nested too deeply to read"),
    ("report_nested", "report line 1 is not JSON"),
    ("kill_own_group", "exit code 137"),
    ("kill_guard", "its guard process was killed (by the trainer?)"),
    ("report_fifo", "the report file is not a regular file"),
    ("result_link", "no result: the result file "),
    ("report_link", "the report file is a symbolic link, not a regular file"),
]


def hostile_study(write_study, case: str, **study):
    return write_study(
        study={"n_trials": 2, "enqueue": [{"x": 0.1}, {"x": 0.5}], **study},
        trainer={"script": str(HOSTILE), "args": ["--case", case], "grace_period": 1.0},
    )


@pytest.mark.parametrize(("case", "reason"), CASES)
def test_a_hostile_output_fails_only_its_own_trial(write_study, fake_gpus, tmp_path, capsys,
                                                   case, reason):
    study = hostile_study(write_study, case)
    assert run_cli("run", str(study)) == 0
    hostile, neighbour, *rest = load_trials(study)
    assert hostile.state.name == "FAIL"
    assert hostile.user_attrs[names.FAIL_REASON].startswith(reason), hostile.user_attrs
    assert len(hostile.user_attrs[names.FAIL_REASON]) < 250
    assert neighbour.state.name == "COMPLETE" and neighbour.value == 0.5
    assert reason in capsys.readouterr().err  # printed as it is, brackets included
    assert [t.state.name for t in rest] == ["COMPLETE"]  # the budget is still met
    assert processes_mentioning(str(tmp_path)) == []


def test_result_keys_named_like_sweeps_attributes_stay_in_their_namespace(write_study,
                                                                          fake_gpus):
    study = hostile_study(write_study, "own_attributes")
    assert run_cli("run", str(study)) == 0
    trial = load_trials(study)[0]
    assert trial.state.name == "COMPLETE"
    assert trial.user_attrs[names.GPU] in (0, 1) and trial.user_attrs[names.EXIT_CODE] == 0
    assert trial.user_attrs[names.ATTEMPT] == 0 and names.RETRY_OF not in trial.user_attrs
    assert trial.user_attrs[names.OWNER]["pid"] != 99 and names.FAIL_REASON not in trial.user_attrs
    assert trial.user_attrs["metric_gpu"] == 99 and trial.user_attrs["metric_owner"] == 99


@pytest.mark.parametrize("pruner", [{"type": "none"}, {"type": "median"}])
def test_a_flood_of_report_lines_is_read_in_bounded_batches(write_study, fake_gpus, pruner):
    study = hostile_study(write_study, "flood", pruner=pruner)
    assert run_cli("run", str(study)) == 0
    flooded = load_trials(study)[0]
    assert flooded.state.name == "COMPLETE"
    steps = flooded.intermediate_values
    assert max(steps) == 19_999  # the last one is always kept
    if pruner["type"] == "none":  # only the latest step of each pass is stored
        # A pass reads at most 100 lines and one stored step each: 200 full passes at most,
        # plus one per half-second poll that found the writer behind. How many passes there
        # are depends on how fast the trainer writes (a busy machine: dozens), so the bound
        # is the mechanism's, not a count seen on a quiet machine.
        assert len(steps) <= 20_000 // 100 + 20
    else:  # the pruner sees every step read while the trial ran, a batch per pass
        assert steps[19_999] == pytest.approx(1 / 20_000)


def test_brackets_in_a_categorical_choice_are_shown_as_they_are(write_study, fake_gpus, capsys):
    study = write_study(study={"n_trials": 1, "max_consecutive_failures": 1},
                        params={"x": {"type": "categorical", "choices": ["[/data/b]"]}})
    assert run_cli("run", str(study)) == 1  # the probe cannot parse x: its own failure
    err = capsys.readouterr().err
    assert "x=[/data/b]" in err and "invalid float value: '[/data/b]'" in err


def trials_started(study: Path) -> int:
    """How many trial folders the drivers of `study` made so far (a stat, not a query)."""
    trials = study.parent / "probe" / "trials"
    return len(list(trials.iterdir())) if trials.is_dir() else 0


@pytest.mark.slow
def test_a_flooded_driver_keeps_its_heartbeats_and_no_live_trial_is_reclaimed(write_study):
    """Three drivers on one study, a device each, heartbeats every second: two on one host
    ("one"), one on another ("host-1", to which heartbeats alone say who is alive), so one run
    has a pair on one host and two pairs across hosts (one driver run carries both). While
    each is busy storing thousands of report lines, none takes another's live trial for dead.
    The third starts once two trials have started (so that each of the three runs one)."""
    # reclaim_after 3, not 2: SQLite's CURRENT_TIMESTAMP keeps whole seconds, so with 2 a beat
    # a second late (a thread of a driver on a loaded machine) looked stale (a clean-clone
    # suite saw two live trials reclaimed that way); sweep's default is twice the interval
    study = write_study(
        study={"n_trials": 6, "heartbeat_interval": 1, "reclaim_after": 3,
               "pruner": {"type": "median", "n_startup_trials": 1000}},
        trainer={"script": str(HOSTILE), "args": ["--case", "flood_slow"]},
    )
    # a device each: on one host, a driver that is quicker to start would take them all
    drivers = [spawn_cli("run", str(study), "--gpus", str(i),
                         env={"SWEEP_FAKE_GPUS": "3", "SWEEP_HOST": "one"}) for i in range(2)]
    both_ran = wait_until(lambda: trials_started(study) >= 2, 120, every=0.25)
    drivers.append(spawn_cli("run", str(study), "--gpus", "2",
                             env={"SWEEP_FAKE_GPUS": "3", "SWEEP_HOST": "host-1"}))
    outputs = [d.communicate(timeout=180) for d in drivers]
    assert both_ran
    for d, (_, err) in zip(drivers, outputs, strict=True):
        assert d.returncode == 0, err
        assert "no heartbeat" not in err and "driver died" not in err, err
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    assert {t.user_attrs[names.HOST] for t in trials} == {"one", "host-1"}
    assert len({t.user_attrs[names.OWNER]["pid"] for t in trials}) == 3  # all three ran trials
    counts = [len(t.intermediate_values) for t in trials]
    assert all(n > 300 for n in counts), counts  # the drivers were busy storing them


def test_the_summary_shows_brackets_in_params_as_they_are(write_study, fake_gpus, capsys,
                                                          monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    study = write_study(study={"n_trials": 1},
                        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                                "tag": {"type": "categorical", "choices": ["[red]/data[/red]"]}})
    assert run_cli("run", str(study)) == 0
    capsys.readouterr()
    assert run_cli("summary", str(study)) == 0
    assert "[red]/data[/red]" in capsys.readouterr().out


def test_a_valid_result_with_a_huge_number_in_another_key_completes(write_study, fake_gpus):
    study = hostile_study(write_study, "huge_other_key")
    assert run_cli("run", str(study)) == 0
    trial = load_trials(study)[0]
    assert trial.state.name == "COMPLETE" and "metric_b" not in trial.user_attrs


@pytest.mark.parametrize(("case", "pattern", "state", "reason"), [
    ("progress_bar", ".*val_loss: (?P<score>[0-9.]+)", "COMPLETE", None),
    ("percent", r"acc: (?P<score>\S+)", "FAIL",
     "metric 'score' matched in stdout but is not a finite number: '97.5%'"),
])
def test_stdout_patterns_on_progress_bars_and_text_that_is_no_number(
    write_study, fake_gpus, case, pattern, state, reason
):
    study = write_study(
        study={"n_trials": 1, "enqueue": [{"x": 0.1}], "max_consecutive_failures": 1},
        trainer={"script": str(HOSTILE), "args": ["--case", case],
                 "result": {"stdout": pattern}})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
    driver.communicate(timeout=120)  # a pattern's cost is bounded: no hang on 10 MB of \r
    trial = load_trials(study)[0]
    assert trial.state.name == state
    if reason:
        assert trial.user_attrs[names.FAIL_REASON] == reason
    else:
        assert trial.value == 0.25


NOISY = """\
import argparse, sys, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float)
args, _ = p.parse_known_args()
if args.x == 0.5:
    time.sleep(60)  # its trainer.timeout stops it
if args.x != 0.1:
    print("0.5s")
    sys.exit(0)
line = ("lr=0.001 grad=1.25 " * 120)[:2000]
sys.stdout.write((line + "\\n") * 2000)  # 4 MB that a leading .* retries at every position
print("loss=0.125")
print("0.25s")
print("1" * 36)  # (d+)+ backtracks 2**36 ways here
"""


def test_no_pattern_and_no_output_stall_the_driver_or_a_neighbours_timeout(write_study,
                                                                          tmp_path):
    """Issue 26, item 5: a trial whose output takes a backtracking engine hours completes at
    once, and its neighbour's `trainer.timeout` is enforced meanwhile."""
    script = tmp_path / "noisy.py"
    script.write_text(NOISY)
    study = write_study(
        study={"n_trials": 2, "enqueue": [{"x": 0.1}, {"x": 0.5}]},
        trainer={"script": str(script), "timeout": 3, "grace_period": 1.0,
                 "result": {"stdout": [r".*loss=(?P<loss>[0-9.]+)",
                                       r"(?P<score>([0-9.]+)+)s"]}})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    try:
        _, err = driver.communicate(timeout=120)  # hours on a backtracking engine
    finally:
        driver.kill()
    assert driver.returncode == 0, err
    noisy, sleeper, third = load_trials(study)
    assert third.state.name == "COMPLETE" and third.value == 0.5
    assert noisy.state.name == "COMPLETE" and noisy.value == 0.25, noisy.user_attrs
    assert noisy.user_attrs["metric_loss"] == 0.125
    assert sleeper.state.name == "FAIL"
    assert sleeper.user_attrs[names.FAIL_REASON] == "timeout after 3 s"
    assert processes_mentioning(str(tmp_path)) == []


def test_a_pattern_re2_cannot_take_is_refused_in_one_line_naming_the_key(write_study, fake_gpus,
                                                                         tmp_path, capsys):
    study = write_study(trainer={"result": {"stdout": r"(?<=loss: )(?P<score>\S+)"}})
    assert run_cli("run", str(study)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"sweep: error: {study}: trainer.result.stdout: lookbehind (?<=...) is not supported "
        "(sweep matches with RE2, in time linear in the output: no backreferences or "
        r"lookaround): (?<=loss: )(?P<score>\S+)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing written


def test_ctrl_c_ends_a_run_at_once_while_its_trainer_floods_stdout_with_reports(write_study,
                                                                               tmp_path):
    """Issue 38, item 16: a flood on stdout delayed Ctrl-C by 100 s. A trainer that writes
    report lines faster than the driver stores them leaves a backlog of millions of lines;
    once the run is interrupted, its values are read for 2 s at most after it exited: the
    run exits 130 at once, its trial told `interrupted` (nothing left RUNNING), and what was
    left unread is noted on the trial."""
    study = write_study(study={"n_trials": 1}, trainer={
        "script": str(HOSTILE), "args": ["--case", "flood_stdout"],
        "report": {"stdout": r"step (?P<step>\d+) loss (?P<value>\S+)"}})
    log = tmp_path / "probe" / "trials" / "0" / "stdout.log"
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
    try:
        # 60 MB: 3 million lines, more than the 20,000 passes of 100 values the driver
        # drained before it judged the trial (over a minute)
        assert wait_until(lambda: log.exists() and log.stat().st_size > 60 << 20, 120)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=20)  # far below the minute it took before
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 130, err
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]
    cut = trials[0]
    assert cut.user_attrs[names.FAIL_REASON] == "interrupted"
    last = max(cut.intermediate_values)
    assert cut.user_attrs[names.REPORTS_UNREAD] == (
        f"values after step {last} were left unread (the run was interrupted: read for 2 s "
        "at most after it exited)")
    assert f"trial 0: its trainer's values after step {last} were left unread" in err
    assert processes_mentioning(str(tmp_path)) == []
