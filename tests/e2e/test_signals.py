"""The driver stopped by Ctrl-C, SIGTERM, SIGHUP or SIGKILL: every trial told, no process left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
from conftest import (
    load_trials,
    probes_started,
    processes_mentioning,
    spawn_cli,
    study_dict,
    wait_until,
)

from sweep._core import names


def running_trainers(tmp_path) -> list[psutil.Process]:
    """The probe trainers themselves (not their guards) still alive."""
    out = []
    for p in processes_mentioning(str(tmp_path)):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if len(cmd) > 1 and cmd[1].endswith("probe.py"):
            out.append(p)
    return out


def told_interrupted_and_continued(trials) -> bool:
    """Every trial asked was told FAIL `interrupted`, and the continuation of each is queued
    (its params, its lineage) for the next run."""
    cut = [t for t in trials if t.state.name != "WAITING"]
    queued = [t for t in trials if t.state.name == "WAITING"]
    return (all(t.state.name == "FAIL" and t.user_attrs[names.FAIL_REASON] == "interrupted"
                for t in cut)
            and sorted(t.user_attrs[names.CONTINUES] for t in queued) == [t.number for t in cut]
            and all(t.system_attrs[names.FIXED_PARAMS] == cut[t.user_attrs[names.RETRY_OF]].params
                    for t in queued))


def test_sigint_stops_trials_tells_them_interrupted_and_exits_130(write_study, tmp_path):
    study = write_study(study={"n_trials": 6}, trainer={"args": ["--sleep", "30"]})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    assert wait_until(lambda: probes_started(study) == 2, 60)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 130, err
    trials = load_trials(study)
    assert len(trials) == 4  # two asked, and their continuations queued
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert told_interrupted_and_continued(trials)
    assert "Traceback" not in err
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_second_sigint_kills_at_once(write_study, tmp_path):
    study = write_study(study={"n_trials": 2},
                        trainer={"args": ["--mode", "stubborn"], "grace_period": 60})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    assert wait_until(lambda: probes_started(study) == 2, 60)
    time.sleep(0.3)  # let the trainers install their SIGTERM handling
    driver.send_signal(signal.SIGINT)
    time.sleep(0.5)
    t0 = time.monotonic()
    driver.send_signal(signal.SIGINT)
    driver.communicate(timeout=30)
    assert time.monotonic() - t0 < 10  # not the 60 s grace period
    assert driver.returncode == 130
    assert told_interrupted_and_continued(load_trials(study))
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_sigkill_of_the_driver_kills_trainers_and_a_rerun_reclaims_the_cut_trials(
    write_study, tmp_path, fake_gpus, capsys
):
    from conftest import run_cli

    study = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "30"]})
    env = {"SWEEP_FAKE_GPUS": "2"}
    # first, one short trial completes and must be kept (run in this process: only the
    # driver that is killed needs one of its own)
    quick = write_study(study_dict(study={"n_trials": 1}, trainer={"args": ["--sleep", "0"]}),
                        name="quick.yaml")
    assert run_cli("run", str(quick)) == 0
    kept = load_trials(study)[0]

    driver = spawn_cli("run", str(study), env=env)
    assert wait_until(lambda: probes_started(study) == 3, 60)
    assert len(running_trainers(tmp_path)) == 2
    os.kill(driver.pid, signal.SIGKILL)
    driver.communicate(timeout=10)
    killed_at = time.monotonic()
    assert wait_until(lambda: not running_trainers(tmp_path), 5), "trainers outlived the driver"
    assert time.monotonic() - killed_at < 5
    cut = [t for t in load_trials(study) if t.state.name == "RUNNING"]
    assert len(cut) == 2

    fast = write_study(study_dict(study={"n_trials": 4}, trainer={"args": ["--sleep", "0.2"]}),
                       name="fast.yaml")
    capsys.readouterr()
    code = run_cli("run", str(fast))
    assert code == 0, capsys.readouterr().err

    trials = load_trials(study)
    by_number = {t.number: t for t in trials}
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert len([t for t in trials if t.state.name == "COMPLETE"]) == 4
    assert by_number[kept.number].value == kept.value
    for t in cut:
        old = by_number[t.number]
        assert old.state.name == "FAIL"
        assert old.user_attrs[names.FAIL_REASON].startswith("driver died")
        retries = [r for r in trials if r.user_attrs.get(names.RETRY_OF) == t.number]
        assert len(retries) == 1 and retries[0].params == t.params
        assert retries[0].state.name == "COMPLETE"
    assert processes_mentioning(str(tmp_path)) == []
    record = json.loads(next((study.parent / "probe" / "trials").glob("*/probe.json")).read_text())
    assert record["cvd"] in ("0", "1")


@pytest.mark.slow
def test_a_trial_of_another_host_is_reclaimed_after_its_heartbeat_goes_stale(write_study,
                                                                             fake_gpus):
    import optuna

    from sweep.spec import config, searchspace
    from sweep.study.opening import open_study
    from sweep.study.storage import open_storage

    data = study_dict(study={"n_trials": 2, "heartbeat_interval": 1, "grace_period": 1})
    study_file = write_study(data)
    spec = config.load(study_file)
    study = open_study(spec, open_storage(spec))
    trial = study.ask(searchspace.distributions(spec.searched))
    trial.set_user_attr(names.HOST, "elsewhere")
    trial.set_user_attr(names.DRIVER_PID, 1)
    study._storage.record_heartbeat(trial._trial_id)
    time.sleep(2.5)

    from conftest import run_cli

    assert run_cli("run", str(study_file)) == 0
    trials = load_trials(study_file)
    old = trials[trial.number]
    assert old.state == optuna.trial.TrialState.FAIL
    assert old.user_attrs[names.FAIL_REASON] == "driver on elsewhere died (no heartbeat)"
    retry = [t for t in trials if t.user_attrs.get(names.RETRY_OF) == trial.number]
    assert len(retry) == 1 and retry[0].params == old.params
    assert len([t for t in trials if t.state.name == "COMPLETE"]) == 2


@pytest.mark.slow
def test_a_closed_terminal_stops_the_driver_as_sigterm_does(write_study, tmp_path):
    """The driver's terminal goes away (its pty closed: the kernel sends SIGHUP and every later
    write to the terminal fails): trials are still stopped and told, and the driver exits 130."""
    import pty

    study = write_study(study={"n_trials": 6}, trainer={"args": ["--sleep", "30"]})
    master, slave = pty.openpty()
    driver = spawn_wrapped(str(study), "import fcntl, termios\n"
                           "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n",  # its terminal
                           stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        assert wait_until(lambda: drain(master) is not None and probes_started(study) == 2, 60)
    finally:
        os.close(master)  # the terminal is gone: SIGHUP to its session
    assert driver.wait(timeout=30) == 130
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert told_interrupted_and_continued(trials)
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_under_nohup_sighup_stays_ignored_and_the_run_goes_on(write_study, tmp_path):
    study = write_study(study={"n_trials": 2}, trainer={"args": ["--sleep", "1"]})
    driver = spawn_wrapped(str(study), "import signal\n"
                           "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n",  # as nohup does
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_until(lambda: probes_started(study) == 2, 60)
    driver.send_signal(signal.SIGHUP)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE", "COMPLETE"]


def spawn_wrapped(study: str, prelude: str, **popen: Any) -> subprocess.Popen[Any]:
    """`python -m sweep run STUDY` on two fake GPUs, after `prelude` ran in its process."""
    code = (prelude + "import os, sys\n"
            "os.execv(sys.executable, [sys.executable, '-m', 'sweep', 'run', sys.argv[1]])\n")
    return subprocess.Popen([sys.executable, "-c", code, study],
                            env={**os.environ, "SWEEP_FAKE_GPUS": "2"}, **popen)


def drain(fd: int) -> bytes:
    """What the terminal shows so far (never blocks): read, so that the driver never waits
    for a full terminal."""
    import select

    out = b""
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_a_hung_up_terminal_is_replaced_by_dev_null_and_live_descriptors_are_kept():
    import pty

    from sweep._core.terminal import release_dead_terminal

    master, slave = pty.openpty()
    r, w = os.pipe()
    closed = os.dup(w)
    os.close(closed)
    try:
        os.close(master)  # hung up: writing to it fails
        with pytest.raises(OSError):
            os.write(slave, b"x")
        assert release_dead_terminal([slave, w, closed]) == [slave]
        assert os.write(slave, b"lost") == 4  # /dev/null now
        assert os.write(w, b"kept") == 4 and os.read(r, 10) == b"kept"
        assert release_dead_terminal([slave, w]) == []
    finally:
        for fd in (slave, r, w):
            os.close(fd)


def test_sighup_outside_a_run_ends_a_command_as_sigterm_does(write_study):
    """`sweep logs --follow` of a running trial, its terminal closed: exit 130, as SIGTERM."""
    from sweep.spec import config, searchspace
    from sweep.study.opening import open_study
    from sweep.study.storage import open_storage
    from sweep.trial import folders

    study_file = write_study(study={"n_trials": 1})
    spec = config.load(study_file)
    study = open_study(spec, open_storage(spec))
    study.ask(searchspace.distributions(spec.searched))  # RUNNING, for ever
    log = folders.TrialPaths.of(spec.output_dir, 0).stdout
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1\n")
    follower = spawn_cli("logs", "--follow", str(study_file), "0")
    assert follower.stdout is not None and follower.stdout.readline() == "epoch 1\n"
    follower.send_signal(signal.SIGHUP)
    _, err = follower.communicate(timeout=30)
    assert follower.returncode == 130, err
    assert "Traceback" not in err


def test_a_second_sighup_does_not_kill_trials_that_are_stopping_with_grace(write_study,
                                                                          tmp_path):
    """A closed terminal sends SIGHUP to the driver and to its shell, which sends it again:
    unlike a second Ctrl-C, the second SIGHUP does not cut the trials' grace period.
    SIGHUP (an ssh drop) takes SIGTERM's path: trials stopped with their grace period, told
    `interrupted`, their continuations queued, no traceback, nothing left, exit 130 (that no
    new trial starts after it: test_a_closed_terminal_stops_the_driver_as_sigterm_does)."""
    study = write_study(study={"n_trials": 2},
                        trainer={"args": ["--mode", "report", "--steps", "100", "--sleep", "2"],
                                 "grace_period": 30})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    assert wait_until(lambda: probes_started(study) == 2, 60)
    time.sleep(0.3)  # let the trainers install their SIGTERM handling
    driver.send_signal(signal.SIGHUP)
    assert driver.stderr is not None
    for line in driver.stderr:  # until the first SIGHUP was acted upon: trials asked to stop
        if "interrupted: no new trials" in line:
            break
    driver.send_signal(signal.SIGHUP)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    assert "Traceback" not in err
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert told_interrupted_and_continued(trials)
    graceful = list((study.parent / "probe" / "trials").glob("*/stopped_gracefully"))
    assert len(graceful) == 2  # each stopped at its next step, not SIGKILLed
    assert processes_mentioning(str(tmp_path)) == []


def test_signals_to_routes_one_sighup_keeps_nohup_and_restores_the_handlers():
    from sweep.runner.clock import signals_to

    got: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with signals_to(lambda signum, frame: got.append(signum)):
        signal.raise_signal(signal.SIGHUP)
        signal.raise_signal(signal.SIGHUP)  # the shell's copy: dropped
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C still counts
        signal.raise_signal(signal.SIGTERM)
    assert got == [signal.SIGHUP, signal.SIGINT, signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before

    got.clear()
    with signals_to(lambda signum, frame: got.append(signum)):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)  # after another signal: it never hurries the stop
    assert got == [signal.SIGTERM]

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with signals_to(lambda signum, frame: got.append(signum)):
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
        assert got == [signal.SIGTERM] and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_a_schedulers_repeated_signal_is_one_stop_and_usr1_usr2_stop_too():
    """Slurm signals every process of a job step, and srun forwards its copy: the same
    SIGTERM, SIGUSR1 or SIGUSR2 twice asks once; a different signal after it still counts."""
    from sweep.runner.clock import signals_to

    got: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    with signals_to(lambda signum, frame: got.append(signum)):
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)  # srun's copy: dropped
        signal.raise_signal(signal.SIGTERM)  # the time limit itself: a second signal
        signal.raise_signal(signal.SIGTERM)
    assert got == [signal.SIGUSR1, signal.SIGTERM]
    got.clear()
    with signals_to(lambda signum, frame: got.append(signum)):
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C-like stop still hurries
    assert got == [signal.SIGUSR2, signal.SIGINT]
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("window", ["handlers", "parser"])
def test_a_stop_signal_while_the_handlers_go_in_is_exit_130(monkeypatch, window):
    """A stop signal between the first handler going in and the command line's own `try`
    (the next handlers still going in, or its arguments parsed) raised KeyboardInterrupt
    out of `main` with a traceback and exit -2 on a busy CI machine. Forced: the signal is
    raised inside that window."""
    import atexit

    import sweep.__main__ as entry
    from sweep import cli
    from sweep._core import stops

    before = {s: signal.getsignal(s) for s in stops.STOPS}
    real_signal = signal.signal
    if window == "handlers":
        def install(signum, handler):  # SIGTERM's handler is in; SIGUSR1's is next
            old = real_signal(signum, handler)
            if signum == signal.SIGUSR1:
                signal.raise_signal(signal.SIGTERM)
            return old
        monkeypatch.setattr(signal, "signal", install)
    else:
        def parser():
            signal.raise_signal(signal.SIGUSR1)
            raise AssertionError("the signal did not interrupt")
        monkeypatch.setattr(cli, "parser", parser)
    try:
        assert entry.main() == 130
    finally:
        atexit.unregister(stops.last_exit_hook)  # it would end pytest itself with exit 130
        stops.STATE.__init__()  # type: ignore[misc]
        for s, handler in before.items():
            real_signal(s, handler)


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_a_stop_signal_while_the_driver_starts_up_is_exit_130(write_study, tmp_path, signum):
    """Issue 32: SIGUSR1 (what Slurm sends before a time limit) in the driver's first
    seconds, while its modules still import, killed it with exit 138: every stop signal is
    caught from sweep's first line and ends the run as Ctrl-C does. Forced: sent as soon as
    sweep's first line has put its handler in, while the rest of its modules import (a
    second or more); a fixed 0.2 s after the interpreter was up came before that line on a
    busy machine."""
    study = write_study(study={"n_trials": 2}, trainer={"args": ["--sleep", "30"]})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"}, fresh=True)
    assert wait_until(lambda: catches(driver.pid, signum), 30, every=0.001)
    driver.send_signal(signum)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    assert "Traceback" not in err
    assert all(t.state.name in ("FAIL", "WAITING") for t in load_trials_if_any(study))
    assert wait_until(lambda: processes_mentioning(str(tmp_path)) == [], 10)


def load_trials_if_any(study) -> list:
    try:
        return load_trials(study)
    except KeyError:  # stopped before the study was created
        return []


def spent_study(write_study) -> str:
    """A study file whose budget (one trial) is spent: a run of it ends in a second or two."""
    import optuna

    from sweep.spec import config, searchspace
    from sweep.study.opening import open_study
    from sweep.study.storage import open_storage

    study_file = write_study(study={"n_trials": 1})
    spec = config.load(study_file)
    study = open_study(spec, open_storage(spec))
    study.add_trial(optuna.trial.create_trial(
        params={"x": 0.5}, distributions=searchspace.distributions(spec.searched), value=0.04))
    return str(study_file)


# `sweep run STUDY` as the `sweep` command runs it, with the stop signal SIGNUM sent to itself
# in WINDOW, once the command has returned: while Python joins its threads (`threads`), or
# from an exit hook registered while the command ran, as weakref.finalize's is (`exit hook`)
AFTER_RETURN = """
import atexit, os, sys, threading
study, signum, window = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = ["sweep", "run", study]
from sweep import __main__ as entry, cli
if window == "threads":
    join = threading._shutdown
    def _shutdown():
        os.kill(os.getpid(), signum)
        join()
    threading._shutdown = _shutdown
else:
    command = cli.main
    def main():
        code = command()
        atexit.register(os.kill, os.getpid(), signum)
        return code
    cli.main = main
sys.exit(entry.main())
"""


@pytest.mark.parametrize("window", ["threads", "exit hook"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_a_stop_signal_after_the_run_returned_is_exit_130(write_study, window, signum):
    """Item 16 (issue 38): a SIGTERM right after a run's last line ended it with -15, or with
    exit 0 and a KeyboardInterrupt traceback (from weakref.finalize's exit hook, or Python
    joining its threads): Python was shutting down. Forced: the signal is sent from inside
    that shutdown."""
    study = spent_study(write_study)
    driver = subprocess.run([sys.executable, "-c", AFTER_RETURN, study, str(int(signum)), window],
                            env={**os.environ, "SWEEP_FAKE_GPUS": "2"}, capture_output=True,
                            text=True, timeout=60)
    assert "the budget is spent" in driver.stderr
    assert driver.returncode == 130, driver.stderr
    assert "Traceback" not in driver.stderr
