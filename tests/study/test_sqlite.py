"""SQLite study files: WAL for the files sweep creates on a local filesystem, the journal
mode of others left alone, readers that do not block a driver, commits a kill cannot undo."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import load_trials, run_cli, study_dict

from sweep.spec import config, schema
from sweep.study import _sqlite
from sweep.study.attrs import Owner
from sweep.study.connect import connect
from sweep.study.storage import open_storage
from sweep.study.store import Asked, Store
from sweep.trial.outcome import Outcome


def part(mountpoint: str, fstype: str) -> SimpleNamespace:
    return SimpleNamespace(mountpoint=mountpoint, fstype=fstype)


MOUNTS = [part("/", "ext4"), part("/mnt/nfs", "nfs4"), part("/mnt/nfs/scratch", "xfs"),
          part("/home", "fuse.sshfs"), part("/dev/shm", "tmpfs")]


@pytest.mark.parametrize("path, kind", [
    ("/work/study.db", "ext4"),
    ("/mnt/nfs/study.db", "nfs4"),
    ("/mnt/nfs/scratch/a/study.db", "xfs"),  # the deepest mount point holds it
    ("/mnt/nfsdata/study.db", "ext4"),  # a name that starts like a mount point is not in it
    ("/home/me/study.db", "fuse.sshfs"),
    ("/dev/shm/study.db", "tmpfs"),
])
def test_the_filesystem_of_a_path_is_that_of_its_deepest_mount_point(path, kind):
    assert _sqlite.filesystem(Path(path), MOUNTS) == kind


def test_a_link_is_judged_by_where_it_points(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    mounts = [part("/", "ext4"), part(str(tmp_path / "real"), "nfs")]
    assert _sqlite.filesystem(tmp_path / "link" / "study.db", mounts) == "nfs"


def mode_of(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def test_a_file_on_a_network_filesystem_keeps_its_journal_mode(tmp_path):
    db = tmp_path / "study.db"
    sqlite3.connect(db).close()
    assert not _sqlite.adopt_wal(db, [part("/", "nfs4")])
    assert mode_of(db) == "delete"
    assert _sqlite.adopt_wal(db, [part("/", "ext4")])
    assert mode_of(db) == "wal"


def test_a_file_another_process_holds_locked_is_left_as_it_is(tmp_path, monkeypatch):
    db = tmp_path / "study.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(_sqlite, "SWITCH_PATIENCE", 0.2)
    try:
        assert not _sqlite.adopt_wal(db, [part("/", "ext4")])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert mode_of(db) == "delete"


def spec_at(tmp_path: Path, db: Path) -> schema.Spec:
    path = tmp_path / "study.yaml"
    data = study_dict(study={"storage": f"sqlite:///{db}"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return config.load(path)


def synchronous(storage: optuna.storages.BaseStorage) -> int:
    engine = storage.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("PRAGMA synchronous").scalar())


def local_only(path: Path) -> None:
    if _sqlite.filesystem(path) not in _sqlite.LOCAL:
        pytest.skip(f"{path} is not on a local filesystem")


def a_store_with_a_trial(tmp_path: Path) -> tuple[Path, Store, Asked]:
    """A new study file (WAL) with one trial asked: its file, its store, the trial."""
    local_only(tmp_path)
    db = tmp_path / "study.db"
    spec = spec_at(tmp_path, db)
    store = connect(spec, Owner.me("h"), 60)
    return db, store, store.ask(spec.searched, 0, lambda n: f"/t/{n}")


def test_a_study_file_sweep_creates_is_in_wal_and_one_that_exists_keeps_its_mode(tmp_path):
    local_only(tmp_path)
    new = tmp_path / "new.db"
    storage = open_storage(spec_at(tmp_path, new))
    assert mode_of(new) == "wal"
    assert synchronous(storage) == 1  # NORMAL: SQLite's advice under WAL

    old = tmp_path / "old.db"
    optuna.create_study(study_name="x", storage=f"sqlite:///{old}")  # Optuna's default mode
    storage = open_storage(spec_at(tmp_path, old))
    assert mode_of(old) == "delete"
    assert synchronous(storage) == 2  # FULL, SQLite's default, where the journal is a file


def test_a_reader_in_the_middle_of_a_read_does_not_hold_up_the_driver(tmp_path):
    """A dashboard or a notebook reading the study file: under a rollback journal its read
    lock keeps the driver's commit waiting (Optuna's "database is locked" after the timeout)."""
    db, store, asked = a_store_with_a_trial(tmp_path)
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM trials").fetchone()[0] == 1  # holds its read
    done = threading.Event()

    def tell() -> None:
        verdict = Outcome(optuna.trial.TrialState.COMPLETE, [0.5], exit_code=0)
        store.tell_verdict(asked.trial, verdict, 0, 0, {})
        done.set()

    threading.Thread(target=tell, daemon=True).start()
    try:
        assert done.wait(20), "the driver's tell waited for the reader"
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert store.study.get_trials(deepcopy=False)[0].state.name == "COMPLETE"


KILLED_AFTER_TELL = """
import os, signal, sys
import optuna
from sweep.spec import config
from sweep.trial.outcome import Outcome
from sweep.study.attrs import Owner
from sweep.study.connect import connect
spec = config.load(sys.argv[1])
store = connect(spec, Owner.me("h"), 60)
for i in range(3):
    asked = store.ask(spec.searched, 0, lambda n: f"/t/{n}")
    verdict = Outcome(optuna.trial.TrialState.COMPLETE, [i], exit_code=0)
    store.tell_verdict(asked.trial, verdict, 0, 0, {})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_a_killed_driver_committed_is_in_the_file(tmp_path):
    local_only(tmp_path)
    db = tmp_path / "study.db"
    spec = spec_at(tmp_path, db)
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_TELL, str(spec.source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert Path(f"{db}-wal").exists()  # the log was not checkpointed into the file
    study = optuna.load_study(study_name=spec.study.name, storage=f"sqlite:///{db}")
    assert [(t.state.name, t.value) for t in study.trials] == [("COMPLETE", float(i))
                                                               for i in range(3)]


def test_a_finished_run_leaves_the_study_in_one_file(write_study, fake_gpus, tmp_path):
    local_only(tmp_path)
    path = write_study(study_dict(study={"n_trials": 2}))
    assert run_cli("run", str(path)) == 0  # in this process: the run, not its exit, folds it
    db = tmp_path / "probe.db"
    assert mode_of(db) == "wal"
    assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    assert [t.state.name for t in load_trials(path)] == ["COMPLETE", "COMPLETE"]


def test_closing_the_store_folds_the_log_into_the_file(tmp_path):
    db, store, asked = a_store_with_a_trial(tmp_path)
    verdict = Outcome(optuna.trial.TrialState.COMPLETE, [0.5], exit_code=0)
    store.tell_verdict(asked.trial, verdict, 0, 0, {})
    assert Path(f"{db}-wal").exists()
    store.close()
    assert not Path(f"{db}-wal").exists()
    assert store.study.trials[0].value == 0.5  # still readable, on a new connection


NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner",
               "--inh-caps", "-dac_override,-dac_read_search,-fowner"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["a folder of mode 555", "an immutable folder"])
def test_a_study_in_a_folder_the_reader_cannot_write_is_read_as_last_folded(
        write_study, fake_gpus, tmp_path, how):
    """A WAL file needs its `-shm` beside it: a reader that cannot write the folder (a
    colleague's results, a read-only mount) reads the file as it is (SQLite's `immutable`)."""
    local_only(tmp_path)
    prefix: list[str] = []
    if how == "a folder of mode 555" and os.geteuid() == 0:  # root writes anywhere: drop that
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv to read as root without its override of file modes")
        prefix = NO_OVERRIDE
    path = write_study(study_dict(study={"n_trials": 2, "output_dir": str(tmp_path / "out")}))
    assert run_cli("run", str(path)) == 0  # a finished run's file (in this process)
    folder = tmp_path / "results"
    folder.mkdir()
    (tmp_path / "probe.db").rename(folder / "probe.db")
    data = yaml.safe_load(path.read_text())
    data["study"]["storage"] = f"sqlite:///{folder / 'probe.db'}"
    path.write_text(yaml.safe_dump(data))
    lock, unlock = ((["chmod", "555"], ["chmod", "755"]) if how == "a folder of mode 555"
                    else (["chattr", "+i"], ["chattr", "-i"]))
    locked = subprocess.run([*lock, str(folder)], capture_output=True)
    if locked.returncode != 0:
        pytest.skip(f"{lock}: {locked.stderr.decode().strip()}")
    try:
        plain = subprocess.run([*prefix, sys.executable, "-c", PLAIN_READ, str(folder)],
                               capture_output=True, text=True, timeout=60)
        shown = subprocess.run([*prefix, sys.executable, "-m", "sweep", "summary", str(path)],
                               capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run([*unlock, str(folder)], check=True)
    assert plain.returncode != 0, "a plain reader opened it: the test does not forbid writing"
    assert shown.returncode == 0, shown.stderr
    assert "COMPLETE" in shown.stdout or "best" in shown.stdout.lower(), shown.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["probe.db"]


PLAIN_READ = """
import sqlite3, sys
sqlite3.connect(sys.argv[1] + "/probe.db").execute("SELECT 1 FROM trials").fetchone()
"""


def test_an_empty_file_left_by_a_stopped_first_run_is_made_a_wal_study(tmp_path):
    local_only(tmp_path)
    db = tmp_path / "study.db"
    db.touch()  # the first run was killed as it made the file
    open_storage(spec_at(tmp_path, db))
    assert mode_of(db) == "wal"


def test_drivers_that_name_one_file_two_ways_share_its_budget_lock(tmp_path):
    from sweep.study.budget import Target

    (tmp_path / "real").mkdir()
    db = tmp_path / "real" / "study.db"
    (tmp_path / "link.db").symlink_to(db)
    stores = [connect(spec, Owner.me("h"), 60)
              for spec in (spec_at(tmp_path, db), spec_at(tmp_path, tmp_path / "link.db"))]
    assert stores[0].lock.target == stores[1].lock.target == Target("file", f"{db}.lock")


@pytest.mark.slow
@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_run_whose_study_file_is_deleted_or_replaced_stops_with_one_line(write_study,
                                                                          tmp_path, change):
    """Issue 26 item 2: the driver kept writing to the unlinked file and said `4/4 trials
    finished`, exit 0. Now it stops as for a lost storage: one line, exit 1."""
    from conftest import spawn_cli, wait_until

    study = write_study(study={"n_trials": 4, "heartbeat_interval": 1},
                        trainer={"args": ["--sleep", "1.5"]})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
    assert wait_until(lambda: any((tmp_path / "probe" / "trials").glob("*/probe_start.json")),
                      60)
    db = tmp_path / "probe.db"
    if change == "deleted":
        db.unlink()  # `rm probe.db`: its -wal and -shm stay, open
    else:
        other = tmp_path / "other.db"
        optuna.create_study(study_name="probe", storage=f"sqlite:///{other}")
        os.replace(other, db)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("sweep: error:")]
    assert len(errors) == 1, err
    assert f"the study file {db} was {change}" in errors[0] and "lost the storage" in errors[0]
