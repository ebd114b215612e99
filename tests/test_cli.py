"""The other verbs, and what the driver process loads."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys

import pytest
from conftest import load_trials, run_cli, spawn_cli, study_dict
from forked_cli import ForkedCli, can_fork

from sweep._core import names
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu


def test_gpus_lists_a_simulated_pool(fake_gpus, capsys):
    fake_gpus(3)
    assert run_cli("gpus") == 0
    out = capsys.readouterr().out
    assert "GPU pool (simulated)" in out and out.count("simulated GPU") == 3


def test_gpus_lists_nvml_devices_with_memory_and_state(monkeypatch, capsys):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake_pynvml.install(monkeypatch, [
        FakeGpu(name="NVIDIA A", uuid="GPU-a"),
        FakeGpu(name="NVIDIA B", uuid="GPU-b", memory_used=3 * 2**30, util_gpu=70,
                processes=[(999_999_998, 3 * 2**30)]),
    ])
    monkeypatch.setenv("COLUMNS", "250")
    assert run_cli("gpus") == 0
    out = capsys.readouterr().out
    assert "NVIDIA B" in out and "NVIDIA A" not in out
    assert "3072" in out and "70" in out
    assert "no: in use by others (pid 999999998)" in out
    assert "pid 999999998 (not visible here, 3072 MB)" in out


def test_gpus_says_which_cards_a_sweep_would_take_and_who_holds_them(monkeypatch, capsys,
                                                                     own_lock_dir):
    import os

    from sweep.gpus.hostlock import HostSlots, lock_dir
    from sweep.study.ownership import host_name

    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_pynvml.install(monkeypatch, [
        FakeGpu(uuid="GPU-a", memory_used=2 * 2**30),  # memory used, no process shown
        FakeGpu(uuid="GPU-b", processes=[(os.getpid(), 2**30)]),
        FakeGpu(uuid="GPU-c"),
    ])
    slot = HostSlots(lock_dir(host_name()), 2).take("GPU-c")  # a sweep of this host holds it
    monkeypatch.setenv("COLUMNS", "250")
    try:
        assert run_cli("gpus") == 0
    finally:
        assert slot is not None
        slot.release()
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.count("│") > 3}
    assert "no: in use by others (2048 MB used, over gpus.busy_memory_mb)" in rows["0"]
    assert f"no: in use by others (pid {os.getpid()})" in rows["1"]
    assert f"pid {os.getpid()} (" in rows["1"] and ", 1024 MB)" in rows["1"]
    assert "yes" in rows["2"] and "1 sweep slot" in rows["2"]


def test_no_gpu_and_no_simulation_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    fake_pynvml.install(monkeypatch, None)
    assert run_cli("gpus") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SWEEP_FAKE_GPUS=N" in err


def test_read_only_verbs_need_neither_the_script_nor_the_samplers_packages(
    write_study, fake_gpus, capsys, monkeypatch
):
    """Issue 8, defect 6: status and summary failed with exit 2 on a missing trainer script.
    Also: status counts the states of a study that ran (one run carries both claims)."""
    import importlib.util

    study = write_study(study={"n_trials": 1})
    assert run_cli("run", str(study)) == 0
    capsys.readouterr()
    assert run_cli("status", str(study)) == 0
    assert "1 COMPLETE" in capsys.readouterr().out
    gone = write_study(study_dict(trainer={"script": "moved_away.py"},
                                  study={"n_trials": 1, "sampler": {"type": "qmc"}}))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scipy" else real_find_spec(name, *a))
    capsys.readouterr()
    assert run_cli("status", str(gone)) == 0
    assert "COMPLETE" in capsys.readouterr().out
    assert run_cli("summary", str(gone)) == 0
    assert run_cli("run", str(gone)) == 2
    assert "trainer.script" in capsys.readouterr().err


def test_dry_run_continues_the_stored_study(write_study, fake_gpus, capsys, tmp_path):
    """Issue 8, defect 6: --dry-run sampled from an empty study, ignoring what had run (three
    stored trials, made as a run would have stored them)."""
    import optuna
    from optuna.distributions import FloatDistribution

    write_study(study={"n_trials": 3})
    stored = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path}/probe.db")
    for x in (0.1, 0.5, 0.9):
        stored.add_trial(optuna.trial.create_trial(
            params={"x": x}, distributions={"x": FloatDistribution(0.0, 1.0)}, value=x))
    db = (tmp_path / "probe.db").read_bytes()
    bigger = write_study(study_dict(study={"n_trials": 4}))
    capsys.readouterr()
    assert run_cli("run", str(bigger), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# dry run: the next 1 of 4 trials (3 done")
    assert len(out) == 2 and "SWEEP_TRIAL_NUMBER=3 " in out[1]
    assert (tmp_path / "probe.db").read_bytes() == db  # nothing written


def test_a_dry_run_builds_a_queued_continuation_as_the_run_would(write_study, fake_gpus,
                                                                 capsys, tmp_path):
    """Issue 30: `--dry-run` planned its trials on its own ("as a run would"), so a queued
    continuation printed as a fresh trial, without its lineage's `resume_args`. It is built by
    the run's own Starter now (which writes nothing and spawns nothing in a dry run)."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    study_file = write_study(study={"n_trials": 1, "output_dir": str(tmp_path / "out")},
                             trainer={"resume_args": ["--resume", "{checkpoint_dir}"]})
    study = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path / 'probe.db'}")
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, params={"x": 0.25},
        distributions={"x": FloatDistribution(0.0, 1.0)},
        user_attrs={names.ATTEMPT: 0, names.FAIL_REASON: "interrupted"}))
    study.enqueue_trial({"x": 0.25}, user_attrs={names.RETRY_OF: 0, names.ATTEMPT: 1,
                                                 names.CONTINUES: 0, names.RETRIES: 0})
    saved = tmp_path / "out" / "checkpoints" / "0"
    saved.mkdir(parents=True)
    (saved / "step.txt").write_text("41\n")
    (saved.parent / ".0.sweep").write_text("0\n")  # sweep made it
    db = (tmp_path / "probe.db").read_bytes()
    capsys.readouterr()
    assert run_cli("run", str(study_file), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# dry run: the next 1 of 1 trials (0 done")  # a FAIL is not
    assert len(out) == 2 and "SWEEP_TRIAL_NUMBER=1 " in out[1]
    assert f" --resume {saved} " in out[1]  # its lineage carried on, as the run will
    assert (tmp_path / "probe.db").read_bytes() == db  # nothing written
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == [
        ".0.sweep", "0", "checkpoints", "step.txt"]


def test_the_driver_does_not_import_torch_or_accelerate():
    code = ("import sys, sweep.cli, sweep.commands.assembly, sweep.commands._dry_run, "
            "sweep.runner.driver, sweep.gpus.monitor, sweep.runner.progress\n"
            "print(sorted(m for m in ('torch', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_and_help():
    out = subprocess.run([sys.executable, "-m", "sweep", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for verb in ("run", "summary", "gpus", "status"):
        assert verb in out


def test_a_forked_command_says_and_exits_as_a_new_interpreter_does(write_study, tmp_path):
    """The tests' `spawn_cli` forks this process (tests/forked_cli.py): what the command
    prints on each stream and its exit status are those of `python -m sweep` started anew;
    with a SQLite file open here (or a thread besides the main one, or gRPC loaded: then for
    every command), a new interpreter is started instead."""
    forks = can_fork([])  # False in a worker that ran the gRPC proxy's tests before
    bad = write_study("study: {name: x, metric: m, n_trials: -1}\ntrainer: {script: t.py}\n")
    seen: list = []
    seen_bad = ("", "")
    for args in (["run", str(bad)], ["run", str(tmp_path / "missing.yaml")], ["--help"]):
        forked, fresh = spawn_cli(*args), spawn_cli(*args, fresh=True)
        assert isinstance(forked, ForkedCli) is forks and not isinstance(fresh, ForkedCli)
        seen = [(p.communicate(timeout=60), p.returncode) for p in (forked, fresh)]
        assert seen[0] == seen[1] and seen[0][0][0 if args == ["--help"] else 1], seen
        seen_bad = seen_bad if args != ["run", str(bad)] else seen[0][0]
    assert can_fork([tmp_path]) is forks
    db = sqlite3.connect(tmp_path / "open.db")
    try:
        db.execute("create table t (x)")
        fresh = spawn_cli("run", str(bad))
        assert not can_fork([tmp_path]) and not isinstance(fresh, ForkedCli)
        assert can_fork([tmp_path / "elsewhere"]) is forks
        assert fresh.communicate(timeout=60) == seen_bad
    finally:
        db.close()
    assert can_fork([tmp_path]) is forks


def test_on_a_terminal_run_shows_a_live_table_of_budget_gpus_and_best(write_study, fake_gpus,
                                                                      monkeypatch):
    import io

    from rich.console import Console

    from sweep.commands import run

    screen = io.StringIO()
    monkeypatch.setattr(run, "Console", lambda **kw: Console(
        file=screen, force_terminal=True, width=120, **kw))
    study = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "1.5"]})
    assert run_cli("run", str(study)) == 0
    out = screen.getvalue()
    assert "0/4 finished, 2 running" in out or "1/4 finished" in out
    assert "best #" in out
    for column in ("GPU", "trial", "elapsed", "util %", "mem MB", "params"):
        assert column in out
    assert "x=0." in out


def test_command_line_overrides_and_sweep_storage(write_study, fake_gpus, tmp_path,
                                                  monkeypatch):
    fake_gpus(3)
    study = write_study(study={"n_trials": 1})
    other = tmp_path / "elsewhere.db"
    assert run_cli("run", str(study), "--n-trials", "3", "--gpus", "2",
                   "--storage", f"sqlite:///{other}") == 0
    assert not (tmp_path / "probe.db").exists()
    import optuna

    trials = optuna.load_study(study_name="probe", storage=f"sqlite:///{other}").trials
    assert len(trials) == 3 and {t.user_attrs[names.GPU] for t in trials} == {2}
    monkeypatch.setenv("SWEEP_STORAGE", f"sqlite:///{other}")
    assert run_cli("run", str(study), "--n-trials", "4") == 0
    assert len(optuna.load_study(study_name="probe", storage=f"sqlite:///{other}").trials) == 4
    assert run_cli("status", str(study)) == 0  # status reads the same storage


def test_logs_and_rerun_of_a_trial(write_study, fake_gpus, tmp_path, capsys):
    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study)) == 0
    (tmp_path / "probe" / "trials" / "1" / "stdout.log").write_text("epoch 1\nepoch 2\n")
    capsys.readouterr()
    assert run_cli("logs", str(study), "1") == 0
    assert capsys.readouterr().out == "epoch 1\nepoch 2\n"
    assert run_cli("logs", str(study), "1", "--stderr", "--follow") == 0  # finished: returns
    capsys.readouterr()
    assert run_cli("logs", str(study), "9") == 2
    assert capsys.readouterr().err == (f"sweep: error: {study}: no trial 9 in {tmp_path}/probe/"
                                       "trials (`sweep summary` lists the study's trials)\n")
    assert run_cli("rerun", str(study), "0") == 0
    assert "the budget of 2 leaves no room for it: `sweep run" in capsys.readouterr().out
    assert run_cli("rerun", str(study), "1") == 0  # a second one: the budget it needs grows
    assert "--n-trials 4` runs it" in capsys.readouterr().out
    assert run_cli("run", str(study), "--n-trials", "4") == 0
    first, second, again, again_1 = load_trials(study)
    assert again.params == first.params and again.user_attrs[names.RERUN_OF] == 0
    assert again_1.params == second.params and again_1.user_attrs[names.RERUN_OF] == 1
    assert (tmp_path / "probe" / "trials" / "2" / "params.json").exists()
    big = write_study(study_dict(study={"n_trials": 9}))
    capsys.readouterr()
    assert run_cli("rerun", str(big), "0") == 0
    assert "it runs at the next `sweep run`, before new trials" in capsys.readouterr().out
    assert run_cli("rerun", str(study), "7") == 2


def test_status_shows_running_trials_with_their_age_and_last_value(write_study, fake_gpus,
                                                                   capsys):
    import optuna

    study = write_study()
    storage = f"sqlite:///{study.parent / 'probe.db'}"
    s = optuna.create_study(study_name="probe", storage=storage)
    trial = s.ask()
    trial.set_user_attr(names.OWNER, {"host": socket.gethostname(), "pid": 999_999_999,
                                  "started": 0, "gpu": 1, "dir": "/x"})
    trial.report(0.25, 3)
    assert run_cli("status", str(study)) == 0
    out = capsys.readouterr().out
    assert "1 RUNNING" in out and "trial 0 RUNNING on GPU 1" in out
    assert "step 3: 0.25" in out and "its driver is gone" in out


def test_the_summary_shows_every_metric_and_why_nothing_completed(write_study, fake_gpus,
                                                                 capsys, tmp_path):
    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study)) == 0
    import pandas as pd

    assert run_cli("summary", str(study)) == 0
    frame = pd.read_csv(tmp_path / "probe" / "summary.csv")
    assert "metric_size" in frame.columns
    assert list(frame["metric_size"]) == pytest.approx(list(frame["params_x"] * 10))
    failing = write_study(study_dict(study={"name": "broken", "n_trials": 2,
                                            "max_consecutive_failures": 1},
                                     trainer={"args": ["--mode", "crash", "--sleep", "0"]}),
                          name="broken.yaml")
    assert run_cli("run", str(failing)) == 1  # one failure: the run stops
    capsys.readouterr()
    assert run_cli("summary", str(failing)) == 0
    out = capsys.readouterr().out
    assert "no COMPLETE trial yet" in out and "ValueError: boom" in out
    # bad summary options: one line, exit 2
    for bad in (["--top", "0"], ["--top", "-1"], ["--csv", str(tmp_path)]):
        try:
            code = run_cli("summary", str(study), *bad)
        except SystemExit as e:  # argparse's own exit
            code = int(e.code or 0)
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "at least 1" in err[-1] or "cannot write" in err[-1], err
        assert "Traceback" not in "\n".join(err)


def test_the_summary_of_a_read_only_output_dir_is_shown_without_its_csv(
        write_study, fake_gpus, capsys, tmp_path, monkeypatch):
    """A colleague's results, in a folder this user cannot write: the table all the same, and
    one line saying the CSV is not written (only a --csv named outright is an error)."""
    import errno

    from sweep.analysis import summary

    study = write_study(study={"n_trials": 1})
    assert run_cli("run", str(study)) == 0
    target = tmp_path / "probe" / "summary.csv"

    def read_only(self, path=None):
        raise OSError(errno.EROFS, "Read-only file system", str(target))

    monkeypatch.setattr(summary.Summary, "save", read_only)
    capsys.readouterr()
    assert run_cli("summary", str(study)) == 0
    out, err = capsys.readouterr()
    assert "trial" in out.lower() and "CSV:" not in out
    assert err == (f"sweep: the summary CSV is not written: {target}: Read-only file system; "
                   "give --csv a file you can write\n")


def test_off_a_terminal_each_event_is_one_plain_line_however_long():
    """A log or a pipe gets one line per start, finish and message: no colour codes, no
    wrapping at the console's width."""
    import io

    from optuna.trial import TrialState
    from rich.console import Console

    from sweep.runner._events import Finished, Started
    from sweep.runner.progress import Progress

    out = io.StringIO()
    progress = Progress(Console(file=out, width=40))
    params = {f"param_{i}": 0.123456 * i for i in range(12)}
    with progress:
        progress.started(Started(7, 2, params, 0.0))
        progress.finished(Finished(7, TrialState.PRUNED, [0.25], 2, 3.04, None))
        progress.finished(Finished(8, TrialState.FAIL, None, 1, 0.5, "exit code 3: Traceback"))
        progress.message("GPU 1 left out: in use by others")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("trial 7 started on GPU 2: param_0=0 param_1=0.1235 ")
    assert lines[1:] == ["trial 7 PRUNED on GPU 2 in 3.0 s: pruned at 0.25",
                         "trial 8 FAIL on GPU 1 in 0.5 s: exit code 3: Traceback",
                         "GPU 1 left out: in use by others"]
    assert "\x1b" not in out.getvalue()


def test_a_run_with_its_budget_spent_needs_no_gpu_and_says_so(write_study, fake_gpus,
                                                              monkeypatch, capsys, tmp_path):
    """Issue 21 part 5: the quickstart's "run again: nothing runs" exited 2 without a GPU."""
    import optuna

    import sweep
    from sweep.commands import assembly
    from sweep.spec import config
    from sweep.study.storage import find

    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study)) == 0
    monkeypatch.delenv("SWEEP_FAKE_GPUS")
    fake_pynvml.install(monkeypatch, None)  # no GPU, no simulation
    db = (tmp_path / "probe.db").read_bytes()
    capsys.readouterr()
    assert run_cli("run", str(study)) == 0
    spent = ("the budget is spent (2/2 trials finished): nothing to run; raise "
             "study.n_trials (or --n-trials) to run more")
    assert capsys.readouterr().err.splitlines()[0] == f"probe: {spent}"
    assert run_cli("run", str(study), "--dry-run") == 0
    assert capsys.readouterr().out == f"# dry run: {spent}\n"
    assert len(sweep.run(study).trials) == 2
    assert (tmp_path / "probe.db").read_bytes() == db  # nothing ran, nothing changed
    # the file must still agree with the stored study
    edited = write_study(study_dict(study={"n_trials": 2, "direction": "maximize"}),
                         name="edited.yaml")
    assert run_cli("run", str(edited)) == 2
    assert "study.direction: study 'probe' in storage optimises" in capsys.readouterr().err
    # with budget left, or a trial running (it may fail), the pool is needed
    assert run_cli("run", str(study), "--n-trials", "3") == 2
    assert "no GPUs found" in capsys.readouterr().err
    spec = config.load(study)
    optuna.load_study(study_name="probe", storage=spec.storage_url).ask()
    with find(spec) as found:
        assert assembly.spent(spec, found) is None
    assert run_cli("run", str(study)) == 2
    assert "no GPUs found" in capsys.readouterr().err


RERUN_EDITS = [
    ("narrowed", {"x": {"type": "float", "low": 0.5, "high": 1.0}},
     "params.x: trial 0's value {x!r} is outside [0.5, 1.0]: the file no longer searches it; "
     "widen params.x"),
    ("fixed", {"x": {"type": "fixed", "value": 3}},
     "params.x: trial 0 ran x={x!r}, the file now fixes it at 3: a rerun would not run trial 0"),
    ("renamed", {"y": {"type": "float", "low": 0.0, "high": 1.0}},
     "params.x: trial 0 ran x={x!r}, the file no longer has it: a rerun would not run trial 0"),
    ("added", {"x": {"type": "float", "low": 0.0, "high": 0.25},
               "z": {"type": "float", "low": 0.0, "high": 1.0}},
     "params.z: trial 0 had no z (the file searches it since): a rerun would sample it anew"),
]


def test_rerun_refuses_a_file_that_would_run_other_params(write_study, fake_gpus, tmp_path,
                                                          capsys):
    """Hostile pass: after x was narrowed to [0.5, 1], `rerun` queued x=0.0799 silently (it
    ran and was stored COMPLETE); with x now fixed at 3, renamed to y, or a new param z,
    `rerun 0` queued a trial that ran other params than trial 0's, stored as its rerun. Each
    of RERUN_EDITS (all after one first run: a refusal writes nothing) is refused in one
    line naming the param, exit 2, nothing written. Fixed at the value it ran, it is the same
    trial: queued."""
    study = write_study(study={"n_trials": 1, "sampler": {"type": "random", "seed": 0}},
                        params={"x": {"type": "float", "low": 0.0, "high": 0.25}})
    assert run_cli("run", str(study)) == 0
    [first] = load_trials(study)
    db = (tmp_path / "probe.db").read_bytes()
    for case, params, said in RERUN_EDITS:
        edited = write_study(study_dict(params=params), name="edited.yaml")
        capsys.readouterr()
        assert run_cli("rerun", str(edited), "0") == 2, case
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, (case, captured.err)
        assert f"{edited}: " + said.format(x=first.params["x"]) in captured.err, case
        assert (tmp_path / "probe.db").read_bytes() == db, case
        assert len(load_trials(study)) == 1, case
    same = write_study(study_dict(params={"x": {"type": "fixed", "value": first.params["x"]}}),
                       name="same.yaml")  # fixed at the value it ran: the same trial
    assert run_cli("rerun", str(same), "0") == 0


def test_rerun_into_a_read_only_database_says_why(write_study, fake_gpus, tmp_path, capsys,
                                                  monkeypatch):
    """Hostile pass: `rerun` into a read-only study database said Optuna's "invalid data in
    the commit, e.g. exceeding max length" (exit 1). It says the database's own words in one
    line, exit 2. The database is opened read-only by SQLite itself (root writes a file of
    mode 0444)."""
    import optuna

    study = write_study(study={"n_trials": 1})
    assert run_cli("run", str(study)) == 0
    db = tmp_path / "probe.db"
    real = optuna.storages.RDBStorage

    class ReadOnly(real):  # type: ignore[misc, valid-type]
        def __init__(self, url: str, *args, **kwargs) -> None:
            if url == f"sqlite:///{db}":
                url = f"sqlite:///file:{db}?mode=ro&uri=true"
            super().__init__(url, *args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", ReadOnly)
    before = db.read_bytes()
    capsys.readouterr()
    assert run_cli("rerun", str(study), "0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid data" not in err, err
    assert f"{study}: study.storage: cannot write to " in err
    assert err.rstrip().endswith(": attempt to write a readonly database"), err
    assert db.read_bytes() == before


def test_following_the_log_of_a_trial_whose_driver_is_gone_ends(write_study, tmp_path):
    """`sweep logs N -f` of a trial a kill -9'd driver left RUNNING waited for ever (hostile
    pass): it ends once the log is read, saying the driver is gone."""
    import subprocess
    import sys

    from sweep._core.names import OWNER
    from sweep.analysis import logs
    from sweep.spec import config, searchspace
    from sweep.study.opening import open_study
    from sweep.study.ownership import host_name
    from sweep.study.storage import open_storage
    from sweep.trial import folders

    study_file = write_study(study={"n_trials": 1})
    spec = config.load(study_file)
    trial = open_study(spec, open_storage(spec)).ask(searchspace.distributions(spec.searched))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial.set_user_attr(OWNER, {"host": host_name(), "pid": dead.pid, "started": 1.0})
    paths = folders.TrialPaths.of(spec.output_dir, 0)
    paths.dir.mkdir(parents=True)
    paths.stdout.write_text("epoch 1\n")
    assert list(logs.trial_log(study_file, 0, follow=True, poll=0.01)) == [
        "epoch 1\n", "\n(sweep: trial 0's driver is gone: the trial stays RUNNING until the next "
        "`sweep run` of the study reclaims it)\n"]


@pytest.mark.parametrize("first", [True, False])
def test_a_run_opens_its_study_once_and_prepares_its_output_folder_once(
        write_study, fake_gpus, tmp_path, monkeypatch, first):
    """Issue 39: a run opened the storage up to three times before its driver started (to see
    whether the budget is spent, whether the study ran in another output_dir, then for the
    run) and made and checked its output folder twice. Counted where each happens: every
    storage object made, every Optuna study opened, every output folder prepared, until the
    driver's run begins (`first`: a new output_dir, where the moved-study check reads too)."""
    import optuna

    from sweep.runner.driver import Driver
    from sweep.trial import folders

    study = write_study(study={"n_trials": 2, "output_dir": str(tmp_path / "out")})
    stored = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path}/probe.db")
    stored.add_trial(optuna.trial.create_trial(
        params={"x": 0.5}, distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
        value=0.5))
    if not first:
        folders.claim_output_dir(tmp_path / "out", folders.OutputOwner(
            "probe", f"sqlite:///{tmp_path}/probe.db"), study)
    counts = {"storages": 0, "studies": 0, "prepared": 0}
    at_start: list[dict[str, int]] = []

    def counted(key, real):
        def call(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        return call

    class Counted(optuna.storages.RDBStorage):
        def __init__(self, *args, **kwargs):
            counts["storages"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Counted)
    monkeypatch.setattr(optuna, "load_study", counted("studies", optuna.load_study))
    monkeypatch.setattr(optuna, "create_study", counted("studies", optuna.create_study))
    monkeypatch.setattr(folders, "prepare_output_dir",
                        counted("prepared", folders.prepare_output_dir))
    real_run = Driver.run
    monkeypatch.setattr(Driver, "run", lambda self: at_start.append(dict(counts))
                        or real_run(self))
    assert run_cli("run", str(study)) == 0
    assert at_start == [{"storages": 1, "studies": 1, "prepared": 1}]
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE"] * 2
