"""The driver end to end on a simulated pool, with the probe trainer started by plain python:
what real processes show (faults as a trainer makes them, process trees, the CLI). The loop's
rules (retries, out of memory not retried, failure streaks, timeouts) are test_loop's, on
fakes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from conftest import load_trials, processes_mentioning, run_cli, study_dict

from sweep._core import names


def probe_records(study: Path) -> list[dict]:
    records = []
    for f in sorted((study.parent / "probe" / "trials").glob("*/probe.json")):
        record = json.loads(f.read_text())
        record["number"] = int(f.parent.name)
        records.append(record)
    return records


def test_three_gpus_run_in_parallel_without_sharing_a_device(write_study, fake_gpus):
    """Also: every value is finite, every duration recorded, every exit code stored (one run
    carries these claims)."""
    fake_gpus(3)
    study = write_study(study={"n_trials": 6}, trainer={"args": ["--sleep", "1.0"]})
    assert run_cli("run", str(study)) == 0

    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    for t in trials:
        assert math.isfinite(t.value) and t.duration.total_seconds() > 0
        assert t.user_attrs[names.EXIT_CODE] == 0
    records = probe_records(study)
    assert len(records) == 6
    by_number = {t.number: t for t in trials}
    for r in records:
        trial = by_number[r["number"]]
        assert r["cvd"] == str(trial.user_attrs[names.GPU])
        assert r["order"] == "PCI_BUS_ID"
        assert trial.value == pytest.approx((r["params"]["x"] - 0.3) ** 2)
        assert trial.user_attrs["metric_size"] == pytest.approx(r["params"]["x"] * 10)
        assert "metric_label" not in trial.user_attrs  # non-numeric result keys are not stored
    for a in records:
        for b in records:
            if a is not b and a["cvd"] == b["cvd"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    overlapping = [
        (a["number"], b["number"]) for a in records for b in records
        if a["number"] < b["number"] and a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, "no two trials ever ran at the same time"
    assert {r["cvd"] for r in records} == {"0", "1", "2"}


def test_rerun_continues_to_the_budget_and_no_further(write_study, fake_gpus):
    study = write_study(study={"n_trials": 3})
    assert run_cli("run", str(study)) == 0
    assert len(load_trials(study)) == 3
    assert run_cli("run", str(study)) == 0
    assert len(load_trials(study)) == 3

    bigger = write_study(study_dict(study={"n_trials": 5}))
    assert run_cli("run", str(bigger)) == 0
    trials = load_trials(study)
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" for t in trials)


def test_enqueued_params_run_first_and_fixed_params_reach_the_trainer(write_study, fake_gpus):
    fake_gpus(1)
    study = write_study(
        study={"n_trials": 2, "enqueue": [{"x": 0.25}]},
        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                "y": {"type": "fixed", "value": 1.5}},
    )
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert trials[0].params == {"x": 0.25}
    assert trials[0].value == pytest.approx((0.25 - 0.3) ** 2 + 1.5)
    first = probe_records(study)[0]
    assert first["argv"][-4:] == ["--x", "0.25", "--y", "1.5"]
    assert first["params"] == {"x": 0.25, "y": 1.5}


def test_gpu_ids_restrict_the_devices_used(write_study, fake_gpus):
    fake_gpus(4)
    study = write_study(gpus={"ids": [1, 3]}, study={"n_trials": 4})
    assert run_cli("run", str(study)) == 0
    assert {t.user_attrs[names.GPU] for t in load_trials(study)} == {1, 3}


def test_trials_per_gpu_shares_a_device(write_study, fake_gpus):
    fake_gpus(1)
    study = write_study(gpus={"trials_per_gpu": 2}, study={"n_trials": 4},
                        trainer={"args": ["--sleep", "2.0"]})
    assert run_cli("run", str(study)) == 0
    records = probe_records(study)
    assert any(
        a["start"] < b["end"] and b["start"] < a["end"]
        for a in records for b in records if a is not b
    )


FAULTS = [
    ("crash", "exit code 3: ValueError: boom"),
    ("hang", "timeout after 1.5 s"),
    ("oom", "out of memory: torch.OutOfMemoryError: CUDA out of memory"),
    ("nan", "metric 'score' is not a finite number: nan"),
    ("badjson", "result file is not valid JSON"),
    ("noresult", "no result: nothing at "),
]


def test_each_trial_fault_fails_the_trial_and_the_sweep_reaches_its_budget(
    write_study, fake_gpus, tmp_path
):
    """One run, one device: a trial of each of FAULTS (queued in that order, its mode a param),
    then the budget of two reached by trials that succeed. Each fault fails its own trial with
    its one-line reason, its device and exit code stored; nothing is left running."""
    fake_gpus(1)
    modes = [mode for mode, _ in FAULTS]
    study = write_study(
        study={"n_trials": 2, "max_consecutive_failures": len(FAULTS) + 1,
               "enqueue": [{"x": i / 10, "mode": mode}  # each its own x: none skipped
                           for i, mode in enumerate([*modes, "ok", "ok"])]},
        trainer={"timeout": 1.5, "args": ["--sleep", "0"]},
        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                "mode": {"type": "categorical", "choices": [*modes, "ok"]}},
    )
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [t.params["mode"] for t in trials] == [*modes, "ok", "ok"]
    for faulty, (mode, reason) in zip(trials, FAULTS, strict=False):
        assert faulty.state.name == "FAIL", mode
        said = faulty.user_attrs[names.FAIL_REASON]
        assert said.startswith(reason), said
        assert "\n" not in said
        assert faulty.user_attrs[names.GPU] == 0 and names.EXIT_CODE in faulty.user_attrs
    assert [t.state.name for t in trials[len(FAULTS):]] == ["COMPLETE", "COMPLETE"]
    assert processes_mentioning(str(tmp_path)) == []


def test_a_valid_result_counts_whatever_the_trainer_leaves_behind(write_study, fake_gpus,
                                                                 tmp_path):
    """Issue 8, defects 3 and 4: a detached child kept the trial RUNNING until the timeout
    threw its result away; an out-of-memory line caught by the trainer failed the trial. One
    run, a trial of each (its mode a param), one after the other on one device."""
    fake_gpus(1)
    study = write_study(study={"n_trials": 2,
                               "enqueue": [{"x": 0.4, "mode": "detach"},
                                           {"x": 0.5, "mode": "oomcaught"}]},
                        trainer={"args": ["--sleep", "0"], "timeout": 20, "grace_period": 0.5},
                        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                                "mode": {"type": "categorical",
                                         "choices": ["detach", "oomcaught"]}})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [(t.params["mode"], t.state.name) for t in trials] == [
        ("detach", "COMPLETE"), ("oomcaught", "COMPLETE")]
    first, second = trials
    assert second.datetime_start >= first.datetime_complete
    assert processes_mentioning(str(tmp_path)) == []


def test_too_many_failures_in_a_row_stop_the_run_with_an_error(write_study, fake_gpus,
                                                               tmp_path, capsys):
    """Real crashes, the CLI's line and no process left; on several devices the rule is
    `test_loop`'s (exact there, as real processes end in either order)."""
    fake_gpus(1)
    study = write_study(study={"n_trials": 5, "max_consecutive_failures": 3},
                        trainer={"args": ["--mode", "crash", "--sleep", "0"]})
    assert run_cli("run", str(study)) == 1
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["FAIL"] * 3
    assert "stopped after 3 failed trials in a row" in capsys.readouterr().err
    assert processes_mentioning(str(tmp_path)) == []


def test_timeout_stops_the_whole_tree_even_a_stubborn_or_detached_one(write_study, fake_gpus,
                                                                      tmp_path):
    study = write_study(
        study={"n_trials": 2, "max_consecutive_failures": 2,
               "enqueue": [{"x": 0.1, "mode": "stubborn"}, {"x": 0.2, "mode": "spawn"}]},
        trainer={"timeout": 1.5, "grace_period": 0.5},
        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                "mode": {"type": "categorical", "choices": ["stubborn", "spawn"]}},
    )
    assert run_cli("run", str(study)) == 1
    trials = load_trials(study)
    assert [t.params["mode"] for t in trials][:2] == ["stubborn", "spawn"]
    assert all(t.state.name == "FAIL" for t in trials)
    assert all(t.user_attrs[names.FAIL_REASON] == "timeout after 1.5 s" for t in trials)
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_median_pruner_stops_bad_trials_early_and_frees_their_gpu(write_study, fake_gpus):
    fake_gpus(1)
    study = write_study(
        study={"n_trials": 6, "pruner": {"type": "median", "n_startup_trials": 2,
                                         "n_warmup_steps": 1},
               "enqueue": [{"x": 0.3}, {"x": 0.35}, {"x": 1.0}, {"x": 0.9}]},
        trainer={"args": ["--mode", "report", "--steps", "8", "--sleep", "0.25"]},
    )
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert pruned, [(t.number, t.state.name) for t in trials]
    for t in trials:
        assert t.intermediate_values
    for t in pruned:
        assert len(t.intermediate_values) < 8
        assert t.value == t.intermediate_values[max(t.intermediate_values)]
        record = json.loads(
            (study.parent / "probe" / "trials" / str(t.number) / "probe_start.json").read_text())
        assert record["pid"]
        # the trainer was stopped: SIGTERM reached it, it ended early and never wrote its result
        trial_dir = study.parent / "probe" / "trials" / str(t.number)
        assert (trial_dir / "stopped_gracefully").exists()
        assert not (trial_dir / "result.json").exists()


def test_two_objectives_store_both_values(write_study, fake_gpus):
    data = study_dict(study={"directions": ["minimize", "maximize"], "metrics": ["score", "size"],
                             "n_trials": 2})
    del data["study"]["direction"], data["study"]["metric"]
    study = write_study(data)
    assert run_cli("run", str(study)) == 0
    for t in load_trials(study):
        x = t.params["x"]
        assert t.values == pytest.approx([(x - 0.3) ** 2, x * 10])


def test_dry_run_prints_commands_and_writes_nothing(write_study, fake_gpus, capsys, tmp_path):
    study = write_study()
    assert run_cli("run", str(study), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "CUDA_VISIBLE_DEVICES=0" in out[1] and "--x" in out[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


def test_a_direction_that_contradicts_the_stored_study_is_a_usage_error(write_study, fake_gpus,
                                                                        capsys):
    study = write_study(study={"n_trials": 1})
    assert run_cli("run", str(study)) == 0
    flipped = write_study(study_dict(study={"n_trials": 2, "direction": "maximize"}),
                          name="flipped.yaml")
    assert run_cli("run", str(flipped)) == 2
    err = capsys.readouterr().err
    assert "study.direction" in err and "['minimize']" in err
    assert len(load_trials(study)) == 1


@pytest.mark.parametrize("mode", ["env", "file"])
def test_params_by_environment_or_file(write_study, fake_gpus, tmp_path, mode):
    script = tmp_path / "reads_params.py"
    script.write_text(
        "import json, os, sys\n"
        "assert sys.argv[1:] == ['--fixed', '1'], sys.argv\n"
        "p = json.load(open(os.environ['SWEEP_PARAMS_FILE']))\n"
        "x = float(os.environ['SWEEP_PARAM_X']) if 'SWEEP_PARAM_X' in os.environ else p['x']\n"
        "assert x == p['x']\n"
        "print(f'score={x}')\n")
    study = write_study(study={"n_trials": 2},
                        trainer={"script": str(script), "pass_params": mode,
                                 "args": ["--fixed", "1"],
                                 "result": {"stdout": "score=(?P<score>[0-9.e-]+)"}})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    assert [t.value for t in trials] == [t.params["x"] for t in trials]


def test_no_result_says_where_sweep_looked_and_quotes_the_output(write_study, fake_gpus):
    study = write_study(study={"n_trials": 1, "max_consecutive_failures": 1},
                        trainer={"args": ["--mode", "noresult", "--sleep", "0"],
                                 "result": {"stdout": "loss=(?P<score>[0-9.]+)"}})
    assert run_cli("run", str(study)) == 1
    reason = load_trials(study)[0].user_attrs[names.FAIL_REASON]
    assert reason.startswith("no result: no line of ") and "stdout.log matched" in reason
    assert reason.endswith("stdout is empty")


def test_a_trial_another_driver_fails_gives_its_budget_back_before_the_run_ends(
        write_study, fake_gpus):
    """The driver adds what it does itself to the counts it last read; before it ends for
    want of budget, it reads them again: another driver's running trial may have failed."""
    import threading
    import time

    from optuna.trial import TrialState

    fake_gpus(1)
    study = write_study(study={"n_trials": 3, "heartbeat_interval": 60, "reclaim_after": 600},
                        trainer={"args": ["--sleep", "1.0"]})
    with pytest.warns(optuna.exceptions.ExperimentalWarning):  # heartbeats, as sweep's
        storage = optuna.storages.RDBStorage(f"sqlite:///{study.parent / 'probe.db'}",
                                             heartbeat_interval=60, grace_period=600)
    other = optuna.create_study(study_name="probe", storage=storage, direction="minimize")
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        other.set_metric_names(["score"])
    foreign = other.ask()  # a live trial of a driver on another host
    foreign.set_user_attr(names.OWNER, {"host": "elsewhere", "pid": 1, "gpu": 0, "dir": "/x",
                                    "started": time.time()})
    storage.record_heartbeat(foreign._trial_id)

    def fail_once_the_last_is_asked() -> None:  # the driver will not ask again before its end
        deadline = time.monotonic() + 60
        while len(other.get_trials(deepcopy=False)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        other.tell(foreign, state=TrialState.FAIL)

    failer = threading.Thread(target=fail_once_the_last_is_asked)
    failer.start()
    try:
        assert run_cli("run", str(study)) == 0
    finally:
        failer.join()
    trials = load_trials(study)
    assert [t.state.name for t in trials].count("COMPLETE") == 3
    assert trials[0].state.name == "FAIL"


def test_a_dry_run_of_direct_shows_the_variables_accelerate_would_set(write_study, fake_gpus,
                                                                       capsys, tmp_path):
    """Read from the cache a run fills; before any run, said so (a dry run writes nothing)."""
    from sweep.launch._direct import AccelerateEnv
    from sweep.spec import config
    from sweep.study.ownership import host_name
    from sweep.trial import launch_plan

    study = write_study(study={"n_trials": 1}, trainer={"launcher": "direct"})
    assert run_cli("run", str(study), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert "computed and cached at the first run" in out[1] and "ACCELERATE_" not in out[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]
    spec = config.load(study)
    env = AccelerateEnv(spec.output_dir / "cache", host_name())
    cached = env._file(launch_plan.direct_settings(spec, {}))
    cached.parent.mkdir(parents=True)
    cached.write_text('{"ACCELERATE_MIXED_PRECISION": "no"}')
    assert run_cli("run", str(study), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "ACCELERATE_MIXED_PRECISION=no" in out[1]


def test_launcher_settings_of_another_launcher_are_named_and_ignored(write_study, fake_gpus,
                                                                      capsys):
    """`preload` is warm's; `fork_launcher` is no longer used (old study files still load): a
    study of launcher python that sets them runs, and says once each that they are ignored."""
    study = write_study(study={"n_trials": 1},
                        trainer={"preload": ["json"], "fork_launcher": False})
    assert run_cli("run", str(study)) == 0
    err = capsys.readouterr().err
    assert err.count("trainer.preload is for launcher: warm; launcher is python") == 1
    assert err.count("trainer.fork_launcher is no longer used: every trial starts as a new "
                     "process (launcher: warm is the fast path for trials of seconds); remove "
                     "it from the study file") == 1
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE"]


def test_a_trial_another_driver_failed_meanwhile_is_stopped_at_its_next_report(
        write_study, fake_gpus, capsys):
    """A driver taken for dead (frozen longer than reclaim_after) while its trial reports:
    another driver has failed the trial (and queued its params again). The next report stops
    the trial; this driver neither crashes nor retries it, and goes on to its budget."""
    import threading
    import time

    from optuna.trial import TrialState

    fake_gpus(1)
    study = write_study(study={"n_trials": 1},
                        trainer={"max_retries": 1,
                                 "args": ["--mode", "report", "--steps", "30", "--sleep", "0.1"]})
    url = f"sqlite:///{study.parent / 'probe.db'}"

    reports = study.parent / "probe" / "trials" / "0" / "reports.jsonl"

    def fail_trial_0_once_it_reports() -> None:  # as a driver that reclaims it would
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if not reports.exists():  # nor, before it, the study
                continue
            other = optuna.load_study(study_name="probe", storage=url)
            if other.trials[0].intermediate_values:
                other.tell(0, state=TrialState.FAIL)
                return

    other = threading.Thread(target=fail_trial_0_once_it_reports)
    began = time.monotonic()
    other.start()
    try:
        assert run_cli("run", str(study)) == 0
    finally:
        other.join()
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    stopped = reports.parent
    assert (stopped / "stopped_gracefully").exists()  # SIGTERM'd, not run to its 30 steps
    assert not (stopped / "probe.json").exists()
    assert not any(names.RETRY_OF in t.user_attrs for t in trials)
    assert "trial 0 was already told by another driver" in capsys.readouterr().err
    assert time.monotonic() - began < 30
