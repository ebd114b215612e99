"""A study's storage: opened (a database, a journal file, the gRPC proxy), closed, read
without writing, and the errors it raises said in one line.

`FileIdentity` tells when a SQLite study file is deleted or replaced under a running driver.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweep._core import UsageError, import_grpc, short
from sweep.spec import Spec, StorageKind, StorageUrl
from sweep.study import _sqlite


def open_storage(spec: Spec, create: bool = True) -> optuna.storages.BaseStorage:
    """The study's storage: a database with Optuna's heartbeats on (the driver records them
    for its trials), a journal file, or a gRPC storage proxy (neither has heartbeats: sweep
    writes its own, see `Store.orphans`). Without `create`, a database's file and tables are
    not made (Optuna's errors say they are missing)."""
    url = spec.storage
    if url.kind is StorageKind.JOURNAL:
        return _journal(url)
    if url.kind is StorageKind.GRPC:
        return _grpc_proxy(url)
    engine_kwargs: dict[str, Any] = {}
    db_file = url.file if url.kind is StorageKind.SQLITE else None
    if create and db_file is not None and _sqlite.is_new(db_file):
        _sqlite.adopt_wal(db_file)  # before Optuna writes its tables: no window for a kill
    if url.kind in (StorageKind.SQLITE, StorageKind.MEMORY):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = checked_rdb(
                    url.url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=spec.study.heartbeat_interval,
                    grace_period=spec.study.reclaim_seconds,
                    skip_table_creation=not create,
                )
            if db_file is not None:
                _sqlite.tune(rdb.engine)
            return rdb
        except (IntegrityError, ProgrammingError, OperationalError,
                optuna.exceptions.StorageInternalError) as e:
            # Drivers starting at once on a new database all create the schema: one wins,
            # the others fail ("already exists", "database is locked") and try again.
            if attempt == 4 or (isinstance(e, (OperationalError, optuna.exceptions.
                                               StorageInternalError)) and not _racing(e)):
                raise
            time.sleep(0.2 + 0.4 * attempt)
    raise AssertionError("unreachable")


_SCHEMA_HEAD: dict[str, str] = {}  # Optuna's version -> the last revision of its schema


def checked_rdb(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
    """`optuna.storages.RDBStorage(url, **kwargs)`, its schema checked as Optuna checks it, but
    Optuna's schema history read once per process: Optuna's own check reads all of it (some
    30 revision files, run as Python) at every open. The first open reads the last revision
    (`get_head_version`); every open compares the file's (`get_current_version`) with it, and
    a file whose revision differs, or has none, is opened again with Optuna's check (its
    error, in its words: upgrade the storage, or Optuna)."""
    rdb = optuna.storages.RDBStorage(url, skip_compatibility_check=True, **kwargs)
    try:
        head = _SCHEMA_HEAD.get(optuna.__version__) or _SCHEMA_HEAD.setdefault(
            optuna.__version__, rdb.get_head_version())
        if rdb.get_current_version() == head:
            return rdb
    except AssertionError:  # no revision recorded (Optuna asserts one)
        pass
    rdb.engine.dispose()
    return optuna.storages.RDBStorage(url, **kwargs)


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Close a database storage's connections: SQLite then folds its write-ahead log into the
    study file and removes it. It stays usable (on new connections)."""
    if isinstance(storage, optuna.storages.RDBStorage):
        storage.engine.dispose()


def _journal(url: StorageUrl) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(str(url.file)))


def _grpc_proxy(url: StorageUrl, wait: float = 10.0) -> optuna.storages.BaseStorage:
    grpc = import_grpc()

    assert url.address is not None
    host, port = url.address
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        proxy = optuna.storages.GrpcStorageProxy(host=host, port=port)
    try:
        proxy.wait_server_ready(timeout=wait)
    except (grpc.FutureTimeoutError, ConnectionError):
        proxy.close()
        raise ConnectionError(f"no storage proxy answers on {host}:{port} "
                              "(start one with `sweep storage-proxy`)") from None
    return proxy


def storage_lost_errors() -> tuple[type[Exception], ...]:
    """What a storage raises during a run when it is gone (not a full disk of ours)."""
    from sqlalchemy.exc import SQLAlchemyError

    errors: tuple[type[Exception], ...] = (
        ConnectionError, SQLAlchemyError, optuna.exceptions.StorageInternalError)
    grpc = sys.modules.get("grpc")
    return errors if grpc is None else (*errors, grpc.RpcError)


def storage_errors() -> tuple[type[Exception], ...]:
    """What opening or reading a storage raises when the storage, not the code, is at fault
    (a journal file's own OSError too)."""
    return (OSError, *storage_lost_errors())


def describe(error: BaseException) -> str:
    """A storage error in one line: the database's or gRPC's own words, not a repr."""
    seen: set[int] = set()  # Optuna's wrapper(s) say "invalid data in the commit": the cause
    while isinstance(error, optuna.exceptions.StorageInternalError) and id(error) not in seen:
        seen.add(id(error))
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    details = getattr(error, "details", None)  # a grpc.RpcError
    if callable(details) and details():
        code = getattr(error, "code", None)
        name = getattr(code(), "name", "") if callable(code) else ""
        cause = f"{name}: {details()}" if name else str(details())
    else:
        cause = str(getattr(error, "orig", None) or error).strip() or type(error).__name__
    return short(cause.splitlines()[0], 160)


def unreachable(spec: Spec, error: Exception, doing: str = "open") -> UsageError:
    """The one line for a storage that cannot be used: no secret of its URL is shown."""
    cause = describe(error)
    return UsageError(f"{spec.source}: {spec.storage_from}: cannot {doing} "
                      f"{spec.storage.shown}: {spec.storage.redact(short(cause, 200))}")


def read_study(spec: Spec) -> optuna.Study | None:
    """The stored study, read without creating anything (no file, no table); None if there is
    none yet."""
    return _read(spec).study


@contextlib.contextmanager
def reading(spec: Spec) -> Iterator[optuna.Study | None]:
    """`read_study` for the block, its storage closed after (a SQLite file in WAL is left as
    it was found: no -wal or -shm beside it)."""
    with _read(spec) as found:
        yield found.study


def find(spec: Spec) -> Found:
    """The stored study as a run first reads it, creating nothing (as `read_study`), through
    the run's own storage (`open_storage` without `create`), left open in the `Found` for
    the run to go on with (`connect`): a run opens its storage once. Close it (`with`)."""
    return _read(spec, run=True)


@dataclass
class Found:
    """A study file's stored study as read: `study` (None: none yet), and the `storage` read
    through, open until `close`; a run goes on with it where `runs` (the run's own storage,
    its tables there), and `take` hands it over."""

    study: optuna.Study | None = None
    storage: optuna.storages.BaseStorage | None = None
    runs: bool = False

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The stored study's trials as they are now; [] with no study."""
        return [] if self.study is None else self.study.get_trials(deepcopy=False)

    def take(self) -> tuple[optuna.Study | None, optuna.storages.BaseStorage | None]:
        """The study and the storage for a run to go on with, now the caller's to close;
        (None, None) where the run opens its own (the storage read through is closed)."""
        if not self.runs:
            self.close()
            return None, None
        taken, self.storage, self.runs = (self.study, self.storage), None, False
        return taken

    def close(self) -> None:
        """Close the storage read through, unless taken."""
        if self.storage is not None:
            close_storage(self.storage)
            self.storage = None

    def __enter__(self) -> Found:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(spec: Spec, run: bool = False) -> Found:
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = spec.storage
    if not url.kind.database:
        if url.kind is StorageKind.JOURNAL and not (url.file and url.file.exists()):
            return Found()
        try:
            storage = open_storage(spec)
            try:
                return Found(optuna.load_study(study_name=spec.study.name, storage=storage),
                             storage, run)
            except KeyError:
                return Found(None, storage, run) if run else Found()
        except storage_errors() as e:
            raise unreachable(spec, e, "read") from None
    if url.kind is StorageKind.MEMORY or (url.file is not None and not url.file.exists()):
        return Found()
    read_only = _sqlite.read_only_url(url.file) if url.file is not None else None
    for attempt in (url.url, read_only or url.url):
        runs = run and attempt == url.url  # a read-only view is not the run's storage
        try:
            storage = (open_storage(spec, create=False) if runs else
                       checked_rdb(attempt, skip_table_creation=True))
            try:
                return Found(optuna.load_study(study_name=spec.study.name, storage=storage),
                             storage, runs)
            except KeyError:  # no such study beside the others: the run makes it there
                if runs:
                    return Found(None, storage, runs)
                close_storage(storage)
                raise
            except BaseException:
                close_storage(storage)
                raise
        except KeyError:
            return Found()
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            cause = str(e.__cause__ or e)
            if "no such table" in cause or "does not exist" in cause:
                return Found()
            if "alembic_version" in cause:  # Optuna's version row, written as another
                return Found()  # driver creates the schema this moment: nothing to read yet
            if read_only and attempt != read_only and (
                    "unable to open database" in cause or "readonly database" in cause):
                continue  # a WAL file in a folder this reader cannot write: as last folded
            raise unreachable(spec, e, "read") from None
    raise AssertionError("unreachable")


def _racing(error: Exception) -> bool:
    text = f"{error} {error.__cause__}"
    return "already exists" in text or "database is locked" in text



class StudyFileReplaced(ConnectionError):
    """The SQLite study file a driver opened was deleted, or another file put in its place."""


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when the study was opened: its device and inode."""

    path: Path
    dev: int
    ino: int

    @classmethod
    def of(cls, url: StorageUrl) -> FileIdentity | None:
        """The identity of a SQLite storage's file now (None: not a SQLite file)."""
        path = url.file if url.kind is StorageKind.SQLITE else None
        if path is None:
            return None
        st = path.stat()
        return cls(path, st.st_dev, st.st_ino)

    def check(self) -> None:
        """StudyFileReplaced if the path no longer names the same file."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise StudyFileReplaced(f"the study file {self.path} was deleted") from None
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            raise StudyFileReplaced(f"the study file {self.path} was replaced by another file")
