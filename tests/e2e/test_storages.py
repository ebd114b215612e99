"""Many drivers, one study, on each storage sweep offers (issue 12): SQLite and a journal file
on one host, a database behind `sweep storage-proxy`; a driver killed mid-study; drivers on
several hosts sharing one output_dir."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable

import optuna
import psutil
import pytest
from conftest import probes_started, processes_mentioning, spawn_cli, study_dict, wait_until
from test_budget import ATTEMPTS, check_exact, three_drivers_at_once

from sweep._core import names
from sweep._core.optional import import_grpc
from sweep.analysis import status, summary
from sweep.gpus.monitor import SAMPLES_NAME
from sweep.spec import config, schema, searchspace, storageurl
from sweep.study import _grpclock, proxy
from sweep.study.attrs import Owner
from sweep.study.connect import connect
from sweep.study.heartbeat import Heartbeat, Streak
from sweep.study.opening import open_study
from sweep.study.storage import open_storage
from sweep.study.store import Store


def trials_of(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials, read through the storage a driver would open for `url`."""
    spec = schema.Spec.model_validate(study_dict(study={"name": name, "storage": url}))
    return optuna.load_study(study_name=name, storage=open_storage(spec)).get_trials(
        deepcopy=False)


# ---- journal file -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(ATTEMPTS))
def test_three_drivers_on_one_journal_file_spend_exactly_its_budget(write_study, tmp_path,
                                                                    attempt):
    url = f"journal:///{tmp_path}/study.log"
    study = three_drivers_at_once(write_study, storage=url)
    check_exact(trials_of(url, "shared"))

    # one output_dir, three drivers: each kept its own files, the summary tells hosts apart
    s = summary.load(study)
    drivers = sorted(p.name for p in (tmp_path / "shared" / "drivers").iterdir())
    assert [d.rsplit(".", 1)[0] for d in drivers] == ["h0", "h1", "h2"], drivers
    assert all((tmp_path / "shared" / "drivers" / d / SAMPLES_NAME).is_file()
               for d in drivers)
    assert set(s.trials["host"]) <= {"h0", "h1", "h2"} and len(set(s.trials["host"])) >= 2
    assert set(s.samples["host"]) == {"h0", "h1", "h2"}
    ran = {(h, g) for h, g in zip(s.trials["host"], s.trials["gpu"], strict=True)}
    assert set(zip(s.gpus["host"], s.gpus["gpu"], strict=True)) >= ran
    assert s.gpus["trials"].sum() == 7


def test_a_journal_url_must_name_an_absolute_file(write_study, tmp_path):
    from sweep._core.errors import ConfigError

    with pytest.raises(ConfigError, match="absolute file path"):
        config.load(write_study(study={"storage": "journal://relative/study.log"}))
    with pytest.raises(ConfigError, match="folder does not exist"):
        config.load(write_study(study={"storage": f"journal:///{tmp_path}/no/study.log"}))
    with pytest.raises(ConfigError, match="grpc://host:port"):
        config.load(write_study(study={"storage": "grpc://host-without-port"}))


def test_without_optuna_heartbeats_a_silent_driver_is_reclaimed_by_this_drivers_clock(
        write_study, tmp_path):
    """A journal has no heartbeats: a trial is reclaimed once its `beat` attribute has not
    changed for reclaim_after seconds as this driver saw it (no two hosts' clocks compared)."""
    spec = config.load(write_study(study={"storage": f"journal:///{tmp_path}/j.log",
                                          "reclaim_after": 5}))
    searched = {"x": searchspace.FloatParam(type="float", low=0.0, high=1.0)}
    other = connect(spec, Owner("elsewhere", 1, 0.0), 5)
    silent = other.ask(searched, gpu=0, trial_dir=str)
    beating = other.ask(searched, gpu=1, trial_dir=str)
    now = [100.0]
    me = connect(spec, Owner("here", 2, 0.0), 5, clock=lambda: now[0])
    found, wait = me.orphans(set())
    assert found == [] and wait == 5  # first seen now: a fresh run stays to time them
    now[0] += 4.9
    other.beat(beating.trial)
    found, wait = me.orphans(set())
    assert found == [] and wait == pytest.approx(0.1)
    now[0] += 0.2  # 5.1 s of silence for one of them
    other.beat(beating.trial)
    found, wait = me.orphans(set())
    assert [o.trial.number for o in found] == [silent.number]
    assert found[0].reason == "driver on elsewhere died (no heartbeat)"
    assert wait is None  # the other one beats: watched long enough, nothing to wait for


# ---- the gRPC storage proxy -----------------------------------------------------------------


def start_proxy(storage: str, port: int = 0) -> tuple[subprocess.Popen[str], int]:
    """`sweep storage-proxy` in front of `storage`, as a real process; (it, its port)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "storage-proxy", "--host", "127.0.0.1", "--port",
         str(port), "--storage", storage],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    found = re.search(r" on 127\.0\.0\.1:(\d+)", line)
    assert found, (line, proc.stderr.read() if proc.stderr else "")
    return proc, int(found.group(1))


@pytest.fixture
def proxy_url(tmp_path):
    """A proxy in front of a SQLite file, on a free port."""
    proc, port = start_proxy(f"sqlite:///{tmp_path}/behind-proxy.db")
    yield f"grpc://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.grpc
@pytest.mark.slow
def test_three_drivers_through_the_storage_proxy_spend_exactly_its_budget(write_study,
                                                                          proxy_url):
    study = three_drivers_at_once(write_study, storage=proxy_url)
    check_exact(trials_of(proxy_url, "shared"))
    assert status.status(study).counts == {"COMPLETE": 7}


@pytest.mark.grpc
def test_the_proxys_lock_serialises_holders_and_frees_when_a_holder_is_killed(tmp_path):
    import threading

    import grpc

    server, port = proxy.make_server(
        storageurl.StorageUrl.parse(f"sqlite:///{tmp_path}/p.db"), "127.0.0.1", 0, 8)
    try:
        holder = subprocess.Popen([sys.executable, "-c", (
            "import grpc, sys, time\n"
            "from sweep.study import _grpclock\n"
            f"c = grpc.insecure_channel('127.0.0.1:{port}')\n"
            "with _grpclock.held(c, 'k'):\n"
            "    print('held', flush=True); time.sleep(120)\n")],
            stdout=subprocess.PIPE, text=True)
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        got = threading.Event()

        def take() -> None:
            with _grpclock.held(channel, "k"):
                got.set()

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        assert not got.wait(1.5)  # held elsewhere: we wait
        with _grpclock.held(channel, "other"):  # another name is not blocked
            pass
        holder.kill()
        killed = time.monotonic()
        assert got.wait(10)
        assert time.monotonic() - killed < 2.0  # the dead holder's lock freed at once
        taker.join(5)
        holder.wait()
    finally:
        server.stop(0)


@pytest.mark.grpc
def test_the_proxy_refuses_a_journal_and_a_taken_port(tmp_path):
    from sweep._core.errors import UsageError

    with pytest.raises(UsageError, match="serves a database"):
        proxy.make_server(
            storageurl.StorageUrl.parse(f"journal:///{tmp_path}/j.log"), "127.0.0.1", 0, 2)
    server, port = proxy.make_server(
        storageurl.StorageUrl.parse(f"sqlite:///{tmp_path}/p.db"), "127.0.0.1", 0, 2)
    try:
        with pytest.raises(UsageError, match="cannot listen"):
            proxy.make_server(
                storageurl.StorageUrl.parse(f"sqlite:///{tmp_path}/q.db"), "127.0.0.1", port, 2)
    finally:
        server.stop(0)


@pytest.mark.grpc
def test_a_driver_says_so_in_one_line_when_no_proxy_answers(write_study, capsys, monkeypatch):
    from conftest import run_cli

    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    path = write_study(study={"storage": "grpc://127.0.0.1:9"})
    monkeypatch.setattr("sweep.study.storage._grpc_proxy.__defaults__", (0.5,))
    assert run_cli("run", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no storage proxy answers on 127.0.0.1:9" in err


# ---- a driver killed mid-study ----------------------------------------------------------------


def sqlite_writing(url: str) -> bool:
    """Whether a connection holds the write lock of `url`'s SQLite file (False for another
    storage): SQLite refuses a write transaction at once (no busy wait) while one does."""
    if not url.startswith("sqlite:///"):
        return False
    db = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        return False
    except sqlite3.OperationalError:  # "database is locked"
        return True
    finally:
        db.close()


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_one_of_two_drivers_killed_the_other_reclaims_its_trials_and_spends_the_budget(
        write_study, tmp_path, storage):
    url = (f"sqlite:///{tmp_path}/k.db" if storage == "sqlite"
           else f"journal:///{tmp_path}/k.log")
    study = write_study(study_dict(
        study={"n_trials": 8, "name": "killed", "storage": url, "heartbeat_interval": 1,
               "reclaim_after": 3},
        trainer={"args": ["--sleep", "2"]}))

    def runs_on(host: str) -> Callable[[], bool]:
        def runs() -> bool:
            try:
                trials = trials_of(url, "killed")
            except Exception:
                return False
            return any(t.state.name == "RUNNING" and t.user_attrs.get(names.OWNER, {}).get("host")
                       == host for t in trials)
        return runs

    # the window forced: the victim holds trials, frozen (SIGSTOP), while the survivor starts
    # up and runs its own; only then is the victim killed (a survivor that started first could
    # spend the whole budget before a slow victim ran any)
    victim = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": "h0"})
    # frozen once a trainer of its started (a cheap look: one that opens the storage takes
    # seconds on a loaded machine, and missed all of the victim's 8 s of trials once), then
    # looked at while it cannot change: it holds a trial, and is between its writes. A victim
    # frozen inside one holds the journal's lock file, and the survivor would first wait out
    # Optuna's 30 s grace for it (a stale lock, not a reclaim); or SQLite's write lock, which
    # no other process can take from a live one (the survivor would never write: seen once)
    assert wait_until(lambda: probes_started(study, "killed") > 0, 120, every=0.02)
    lock = tmp_path / "k.log.lock"

    def frozen_as_wanted() -> bool:
        return not lock.exists() and not sqlite_writing(url) and runs_on("h0")()

    for _ in range(200):
        victim.send_signal(signal.SIGSTOP)  # delivered a moment later: looked at once stopped
        assert wait_until(lambda: psutil.Process(victim.pid).status() == psutil.STATUS_STOPPED,
                          10, every=0.005)
        if frozen_as_wanted():
            break
        victim.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    assert frozen_as_wanted()
    survivor = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": "h1"})
    assert wait_until(runs_on("h1"), 120, every=0.5)
    victim.kill()
    victim.wait()
    _, err = survivor.communicate(timeout=180)
    assert survivor.returncode == 0, err

    trials = trials_of(url, "killed")
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") == 8 and "RUNNING" not in states, states
    reclaimed = [t for t in trials if t.state.name == "FAIL"]
    # the kill may land between a trial's `ask` and its owner record: then no host is known
    assert reclaimed and all("h0" in t.user_attrs[names.FAIL_REASON] or
                             "no owner" in t.user_attrs[names.FAIL_REASON] for t in reclaimed)
    for t in reclaimed:
        again = [r for r in trials if r.user_attrs.get(names.RETRY_OF) == t.number]
        given = {**t.system_attrs.get(names.FIXED_PARAMS, {}), **t.params}
        if not given:  # cut after its ask, before its params: no trainer ran, not queued again
            assert again == [], (t.number, t.user_attrs)
            continue
        # a trial with params ran again, once, to the end, on the survivor, with those params
        assert [r.state.name for r in again] == ["COMPLETE"], (t.number, t.user_attrs)
        assert again[0].params == given and again[0].user_attrs[names.HOST] == "h1"
    assert wait_until(lambda: not processes_mentioning(str(tmp_path / "killed")), 10)


# ---- a holder of the budget lock that stops (frozen node, SIGSTOP, partition) ------------------


def has_open(pid: int, path) -> bool:
    """Whether process `pid` has the file `path` open."""
    try:
        real = os.path.realpath(path)
        return any(f.path == real for f in psutil.Process(pid).open_files())
    except psutil.Error:
        return False


def held_elsewhere(lock_file: str):
    """The budget lock taken through another open file, as another driver would hold it."""
    import fcntl

    f = open(lock_file, "a")  # noqa: SIM115 (closed by the caller)
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def test_a_stuck_budget_lock_is_given_up_on_a_signal_and_gone_around_after_patience(
        write_study, monkeypatch):
    from sweep.study import budget
    from sweep.study.budget import LockAbandoned

    monkeypatch.setattr(budget, "LOCK_PATIENCE", 0.5)
    spec = config.load(write_study())
    s = connect(spec, Owner("a", 1, 0), 60)
    stuck = held_elsewhere(f"{spec.storage_url.removeprefix('sqlite:///')}.lock")
    try:
        t0 = time.monotonic()
        with pytest.raises(LockAbandoned), s.budget_lock(abort=lambda: True):
            pass
        assert time.monotonic() - t0 < 0.3  # a stopping driver does not wait
        with s.budget_lock() as locked:
            assert not locked and 0.5 <= time.monotonic() - t0 < 1.5
        t1 = time.monotonic()
        with s.budget_lock() as locked:  # still stuck: one try, no second wait
            assert not locked and time.monotonic() - t1 < 0.3
    finally:
        stuck.close()
    s.lock._stuck_until = 0.0
    with s.budget_lock() as locked:
        assert locked


@pytest.mark.grpc
def test_the_proxy_takes_its_lock_back_from_a_holder_that_keeps_it_too_long(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(_grpclock, "MAX_HOLD", 1.0)
    grpc = import_grpc()
    server, port = proxy.make_server(
        storageurl.StorageUrl.parse(f"sqlite:///{tmp_path}/p.db"), "127.0.0.1", 0, 8)
    try:
        frozen = _grpclock.Holder(grpc.insecure_channel(f"127.0.0.1:{port}"), "k")
        assert frozen.try_hold()  # and never lets go
        other = _grpclock.Holder(grpc.insecure_channel(f"127.0.0.1:{port}"), "k")
        assert not other.try_hold()
        assert wait_until(other.try_hold, 5)
        other.__exit__()
        frozen.__exit__()
    finally:
        server.stop(0)


@pytest.mark.slow
def test_a_driver_waiting_for_a_stuck_lock_stops_on_ctrl_c(write_study, tmp_path):
    study = write_study(study={"n_trials": 2})
    stuck = held_elsewhere(str(tmp_path / "probe.db.lock"))
    try:
        driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
        # it waits for the lock once it has the lock file open (the file is opened to take
        # it): a fixed 4 s sleep here came before that on a busy machine
        assert wait_until(lambda: has_open(driver.pid, tmp_path / "probe.db.lock"), 60)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=30)
    finally:
        stuck.close()
    assert driver.returncode == 130, err
    # nothing was asked or started: no trial folder (trials/ itself is made, and checked,
    # before the storage is opened), no trial in the study
    assert list((tmp_path / "probe" / "trials").iterdir()) == []
    assert optuna.load_study(study_name="probe",
                             storage=f"sqlite:///{tmp_path / 'probe.db'}").trials == []


@pytest.mark.grpc
@pytest.mark.slow
def test_the_proxy_gone_mid_run_is_one_line_and_the_next_run_reclaims(write_study, tmp_path,
                                                                      monkeypatch, capsys):
    """The driver and the proxy it loses are real processes; the proxy back and the next run
    are in this process (as `sweep storage-proxy` and `sweep run` run them)."""
    from conftest import run_cli

    behind = f"sqlite:///{tmp_path}/behind.db"
    first = start_proxy(behind)
    url = f"grpc://127.0.0.1:{first[1]}"
    study = write_study(study={"n_trials": 4, "storage": url},
                        trainer={"args": ["--sleep", "3"]})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    assert wait_until(lambda: len(list((tmp_path / "probe" / "trials").glob("*/probe_start.json")))
                      == 2, 60)
    first[0].kill()
    first[0].wait()
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith("sweep: error:")]
    assert len(errors) == 1 and "lost the storage grpc://127.0.0.1" in errors[0], err
    assert "run again" in errors[0] and "_InactiveRpcError" not in err
    # the one line for the event: no ERROR (or heartbeat WARNING) line per trial before it
    assert [line for line in err.splitlines() if not line.startswith("trial ")] == errors, err
    # gRPC's own words in the brackets depend on the moment the proxy went (no connection
    # yet: "... Connection refused"; one in use: "Stream removed (Socket closed)")
    assert " during the run (UNAVAILABLE: " in errors[0], err
    assert errors[0].endswith("); 2 trials not told (0, 1); once it is back, run again: trials "
                              "left RUNNING are reclaimed"), err
    assert all(len(line) < 400 for line in err.splitlines()), err
    second, _ = proxy.make_server(storageurl.StorageUrl.parse(behind), "127.0.0.1", first[1],
                                  8)  # back on the same port
    # the same study, its trials no longer held up (the proxy was killed while they ran)
    fast = write_study(study={"n_trials": 4, "storage": url},
                       trainer={"args": ["--sleep", "0.2"]}, name="fast.yaml")
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
    try:
        assert run_cli("run", str(fast)) == 0, capsys.readouterr().err
    finally:
        second.stop(0)
    stored = optuna.load_study(study_name="probe", storage=behind).trials
    assert [t.state.name for t in stored].count("COMPLETE") == 4
    assert "RUNNING" not in [t.state.name for t in stored]


def test_status_says_when_a_running_trial_has_no_driver_on_record(write_study, capsys):
    from conftest import run_cli

    spec = config.load(write_study())
    open_study(spec, open_storage(spec)).ask()  # a driver that stopped right after asking
    assert run_cli("status", str(spec.source)) == 0
    out = capsys.readouterr().out
    assert "trial 0 RUNNING for" in out and "asked, no driver on record yet" in out
    assert "nan" not in out


@pytest.mark.slow
def test_a_fresh_run_reclaims_a_trial_another_host_left_on_a_journal(write_study, tmp_path,
                                                                    monkeypatch, capsys):
    """Without Optuna's heartbeats a new run must watch a foreign trial before judging it:
    it stays one reclaim_after for that, then reclaims and finishes the budget. The victim is
    a real process (SIGKILLed); the later run, on another host, runs in this process."""
    from conftest import run_cli

    url = f"journal:///{tmp_path}/left.log"
    study = write_study(study={"n_trials": 1, "name": "left", "storage": url,
                               "heartbeat_interval": 1, "reclaim_after": 3},
                        trainer={"args": ["--mode", "hang", "--fault_once",  # hangs once only
                                          str(tmp_path / "hung")]})
    victim = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1", "SWEEP_HOST": "h0"})
    assert wait_until((tmp_path / "hung").exists, 60)  # its trainer runs, and hangs
    victim.kill()
    victim.wait()
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    monkeypatch.setenv("SWEEP_HOST", "h1")
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    states = [t.state.name for t in trials_of(url, "left")]
    assert states == ["FAIL", "COMPLETE"], states  # reclaimed, then run again to the end


def test_a_lock_held_by_drivers_that_keep_asking_is_waited_for_not_gone_around(
        write_study, monkeypatch):
    """Patience counts a wait with no new trial: a busy study is not a frozen holder."""
    import threading

    from sweep.study import budget

    monkeypatch.setattr(budget, "LOCK_PATIENCE", 1.5)  # progress is looked at each 1 s
    spec = config.load(write_study())
    s = connect(spec, Owner("a", 1, 0), 60)
    count = iter(range(10_000))
    monkeypatch.setattr(Store, "_progress", lambda self: next(count))  # trials keep coming
    busy = held_elsewhere(f"{spec.storage_url.removeprefix('sqlite:///')}.lock")
    threading.Timer(3.5, busy.close).start()
    t0 = time.monotonic()
    with s.budget_lock() as locked:
        assert locked and time.monotonic() - t0 >= 3.0  # waited its turn, past the patience


def test_ipv6_proxy_addresses_keep_their_brackets():
    assert storageurl.grpc_address("grpc://[::1]:13000") == ("[::1]", 13000)
    with pytest.raises(ValueError):
        storageurl.grpc_address("grpc://::1:13000")


def test_describe_says_the_databases_words_under_every_wrapper():
    """A storage error wrapped in Optuna's "invalid data in the commit" (once or twice, by
    `raise from` or in an `except`) is said in the database's own words."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from sweep.study.storage import describe

    cause = OperationalError("INSERT", {}, sqlite3.OperationalError(
        "attempt to write a readonly database"))
    wrapped = optuna.exceptions.StorageInternalError("invalid data in the commit")
    wrapped.__cause__ = cause
    twice = optuna.exceptions.StorageInternalError("invalid data in the commit")
    twice.__context__ = wrapped
    for error in (cause, wrapped, twice):
        assert describe(error) == "attempt to write a readonly database"
    alone = optuna.exceptions.StorageInternalError("the storage said no")
    assert describe(alone) == "the storage said no"


def test_a_streak_of_failed_heartbeats_is_said_once_from_its_second_pass():
    streak = Streak()
    assert [streak.failed() for _ in range(4)] == [False, True, False, False]
    assert streak.succeeded() is True and streak.succeeded() is False
    assert streak.failed() is False and streak.succeeded() is False  # one hiccup: nothing
    assert [streak.failed() for _ in range(2)] == [False, True]


class FailingBeats:
    """A store whose storage is gone: every beat fails, `beats` counts them."""

    def __init__(self, lost: str | None = None) -> None:
        self.lost, self.beats = lost, 0

    def beat(self, trial: object) -> None:
        self.beats += 1
        raise ConnectionError("connection refused")


@pytest.mark.parametrize("lost", [None, "UNAVAILABLE"])
def test_failed_heartbeats_are_one_line_for_all_trials_and_none_once_the_storage_is_lost(
        lost, caplog):
    """Losing the storage proxy printed a line per trial at each pass: a streak of failed
    passes is one warning, and none once the run knows its storage is gone (its last line
    says it); each trial's failure is at debug level (issue 32)."""
    store = FailingBeats(lost)
    beat = Heartbeat(store, 0.005)
    for number in range(5):
        beat.add(optuna.trial.FixedTrial({}, number))  # type: ignore[arg-type]
    with caplog.at_level("DEBUG", logger="sweep"), beat:
        assert wait_until(lambda: store.beats >= 5 * 6, 10, 0.01)
    said = [r for r in caplog.records if r.levelname != "DEBUG"]
    if lost is None:
        assert [r.getMessage() for r in said] == [
            "heartbeats of 5 of 5 running trials failed twice in a row (connection refused): "
            "other drivers take a trial for dead after study.reclaim_after; sweep keeps "
            "trying every 0.005 s"]
    else:
        assert said == []
    assert sum("heartbeat of trial 3 failed" in r.getMessage() for r in caplog.records) >= 6
