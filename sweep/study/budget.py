"""The study's budget lock: one driver at a time between "is there budget left?" and the `ask`
that spends it, so drivers never start more than `n_trials` between them.

A PostgreSQL advisory lock (any host); an flock on `<file>.lock` beside a SQLite file or
`<file>.budget.lock` beside a journal (one host, or a shared disk with working locks); the
proxy's lock through `sweep storage-proxy`; nothing for other storages.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy

from sweep._core import import_grpc
from sweep.spec import StorageKind, StorageUrl
from sweep.study import _grpclock
from sweep.study.storage import describe

log = logging.getLogger("sweep")

LOCK_PATIENCE = 30.0  # s with no new trial before a waiter goes around the lock's holder
LOCK_POLL = 0.05  # s between tries


class LockAbandoned(Exception):
    """The wait for the budget lock was given up: the driver is stopping."""


@dataclass(frozen=True)
class Target:
    """What the lock is taken on: "file" (a lock file's path), "postgresql" (the storage's
    SQLAlchemy engine) or "grpc" ((host, port) of the proxy)."""

    kind: str
    where: Any


def target_of(url: StorageUrl, storage: optuna.storages.BaseStorage) -> Target | None:
    """The lock for a study stored at `url` in `storage` (as opened by `storage.open_storage`);
    None where there is none (an in-memory or other database)."""
    if url.lock_path is not None:  # a SQLite or journal file: one lock per file, however named
        return Target("file", str(url.lock_path))
    if url.address is not None:
        return Target("grpc", url.address)
    if url.kind is StorageKind.POSTGRESQL and isinstance(storage, optuna.storages.RDBStorage):
        return Target("postgresql", storage.engine)
    return None


class BudgetLock:
    """The budget lock of one study, as one driver takes it."""

    def __init__(self, target: Target | None, study_name: str, progress: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.name = f"sweep:{study_name}"
        self.progress = progress  # how many trials the study has (-1: not known)
        self.clock = clock
        self._channel: Any = None  # to the storage proxy's lock, opened on first use
        self._stuck_until = -math.inf  # the lock looked stuck: no waiting till then

    @contextlib.contextmanager
    def hold(self, abort: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Held around the block; yields whether it is held.

        The wait is a loop of tries: `abort()` true (the driver was asked to stop) raises
        `LockAbandoned`; when it is held `LOCK_PATIENCE` s with no new trial in the study (a
        frozen or stopped holder, not drivers taking turns), it is gone around: the block runs
        unlocked, and is told so by the yielded False. After that, for `LOCK_PATIENCE` x 6 s,
        one try each time and no wait, until the lock is had again.
        """
        if self.target is None:
            yield True
            return
        with self._lock_of(self.target) as try_lock:
            began, got = self.clock(), try_lock()
            patient = self.clock() >= self._stuck_until
            progress, looked = (0, 0.0) if got else (self.progress(), self.clock())
            while not got and patient:
                if abort():
                    raise LockAbandoned("stopping")
                if self.clock() - looked >= 1.0:  # holders that ask trials are working
                    now_at, looked = self.progress(), self.clock()
                    if now_at != progress:
                        progress, began = now_at, self.clock()
                if self.clock() - began >= LOCK_PATIENCE:
                    self._stuck_until = self.clock() + 6 * LOCK_PATIENCE
                    break
                time.sleep(LOCK_POLL)
                got = try_lock()
            if got:
                self._stuck_until = -math.inf
            yield got

    @contextlib.contextmanager
    def _lock_of(self, target: Target) -> Iterator[Callable[[], bool]]:
        """A function that tries once to take the lock; what it took is released on exit."""
        if target.kind == "file":
            with open(target.where, "a") as lock:
                held = False

                def try_file() -> bool:
                    nonlocal held
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        return False
                    held = True
                    return True

                try:
                    yield try_file
                finally:
                    if held:
                        fcntl.flock(lock, fcntl.LOCK_UN)
            return
        if target.kind == "grpc":
            if self._channel is None:
                grpc = import_grpc()
                self._channel = grpc.insecure_channel(f"{target.where[0]}:{target.where[1]}")
            with _grpclock.Holder(self._channel, self.name) as holder:
                yield holder.try_hold
            return
        key = int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:8], "big",
                             signed=True)
        with target.where.connect() as plain:
            conn = plain.execution_options(isolation_level="AUTOCOMMIT")  # no open transaction
            held = False

            def try_advisory() -> bool:
                nonlocal held
                held = bool(conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"),
                                         {"k": key}).scalar())
                return held

            try:
                yield try_advisory
            finally:
                if held:
                    try:  # a lost connection released the lock anyway
                        conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"),
                                     {"k": key})
                    except sqlalchemy.exc.SQLAlchemyError as e:
                        log.warning("could not release the budget lock: %s", describe(e))
