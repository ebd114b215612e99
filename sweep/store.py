"""Every read and write of the Optuna study: the only module of the run that speaks to Optuna.

It names the user attributes sweep stores, records who owns a running trial (before its
trainer starts), and finds the trials whose driver is gone. The few private Optuna APIs sweep
needs are in the shim at the bottom, covered by a contract test against the installed Optuna.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import fcntl
import hashlib
import json
import logging
import math
import os
import random
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import optuna
import psutil
import sqlalchemy
from optuna import distributions
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.trial import TrialState
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweep import grpclock, searchspace, sqlite, storageurl
from sweep.config import Spec
from sweep.errors import UsageError, short
from sweep.outcome import Outcome
from sweep.policy import Counts
from sweep.searchspace import FloatParam, IntParam, Searched

log = logging.getLogger("sweep")

# User attributes of a trial. OWNER is written right after the trial's first heartbeat and
# before its trainer starts: {"host", "pid", "started" (the driver's), "gpu", "dir"}.
OWNER = "owner"
GPU, HOST, ATTEMPT, RETRY_OF, RERUN_OF = "gpu", "host", "attempt", "retry_of", "rerun_of"
GPUS = "gpus"  # a trial of several devices: all of them, "0,1" (GPU is the first)
EXIT_CODE, FAIL_REASON = "exit_code", "fail_reason"
BEAT = "beat"  # the driver's heartbeat where the storage has none of Optuna's
METRIC_PREFIX = "metric_"  # the result's other numeric keys, in a namespace of their own
METRICS = "metrics"  # a study attribute: the result keys the objective values come from
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


HOST_ENV = "SWEEP_HOST"


def host_name() -> str:
    """The host a driver records and judges ownership by: `$SWEEP_HOST`, else the hostname
    (containers that share one; tests that simulate several hosts on one machine)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


@dataclass(frozen=True)
class Owner:
    """The driver process that runs a trial."""

    host: str
    pid: int
    started: float  # the process's start time (epoch s): pids are reused

    @classmethod
    def me(cls, host: str) -> Owner:
        proc = psutil.Process()
        return cls(host, proc.pid, proc.create_time())

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> Owner | None:
        """The owner recorded in a trial's user attributes (also sweep 0.1's loose ones)."""
        rec = attrs.get(OWNER)
        if isinstance(rec, dict) and "host" in rec and "pid" in rec:
            return cls(str(rec["host"]), int(rec["pid"]), float(rec.get("started") or 0))
        if "host" in attrs and "driver_pid" in attrs:
            return cls(str(attrs["host"]), int(attrs["driver_pid"]),
                       float(attrs.get("driver_started") or 0))
        return None

    def alive(self) -> bool:
        """Whether this driver process still runs (on this host)."""
        try:
            proc = psutil.Process(self.pid)
            return not self.started or abs(proc.create_time() - self.started) < 1.0
        except psutil.Error:
            return False


LOCK_PATIENCE = 30.0  # s with no new trial before a waiter goes around the lock's holder
LOCK_POLL = 0.05  # s between tries


class LockAbandoned(Exception):
    """The wait for the budget lock was given up: the driver is stopping."""


class Taken(Exception):
    """Another driver has told this driver's trial (it took this one for dead)."""


@dataclass(frozen=True)
class Asked:
    """A trial just asked and owned: its params (searched ones) and its place in retries."""

    trial: optuna.Trial
    number: int
    params: dict[str, Any]
    attempt: int
    origin: int  # the trial number this one retries, or its own


@dataclass(frozen=True)
class Orphan:
    """A RUNNING trial whose driver is gone."""

    trial: optuna.trial.FrozenTrial
    reason: str
    trial_dir: str | None  # set when its driver ran on this host: leftovers may be killed


def open_storage(spec: Spec) -> optuna.storages.BaseStorage:
    """The study's storage: a database with Optuna's heartbeats on (the driver records them
    for its trials), a journal file, or a gRPC storage proxy (neither has heartbeats: sweep
    writes its own, see `Store.orphans`)."""
    kind = storageurl.storage_kind(spec.storage_url)
    if kind == "journal":
        return _journal(spec.storage_url)
    if kind == "grpc":
        return _grpc_proxy(spec)
    engine_kwargs: dict[str, Any] = {}
    db_file = sqlite.file_of(spec.storage_url)
    if db_file is not None and sqlite.is_new(db_file):
        sqlite.adopt_wal(db_file)  # before Optuna writes its tables: no window for a kill
    if spec.storage_url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = optuna.storages.RDBStorage(
                    spec.storage_url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=spec.study.heartbeat_interval,
                    grace_period=spec.study.reclaim_seconds,
                )
            if db_file is not None:
                sqlite.tune(rdb.engine)
            return _Storage(rdb)
        except (IntegrityError, ProgrammingError, OperationalError,
                optuna.exceptions.StorageInternalError) as e:
            # Drivers starting at once on a new database all create the schema: one wins,
            # the others fail ("already exists", "database is locked") and try again.
            if attempt == 4 or (isinstance(e, (OperationalError, optuna.exceptions.
                                               StorageInternalError)) and not _racing(e)):
                raise
            time.sleep(0.2 + 0.4 * attempt)
    raise AssertionError("unreachable")


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Close a database storage's connections: SQLite then folds its write-ahead log into the
    study file and removes it. It stays usable (on new connections)."""
    rdb = _rdb(storage)
    if rdb is not None:
        rdb.engine.dispose()


def _journal(url: str) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(str(storageurl.journal_path(url))))


def _grpc_proxy(spec: Spec, wait: float = 10.0) -> optuna.storages.BaseStorage:
    grpc = grpclock.import_grpc()

    host, port = storageurl.grpc_address(spec.storage_url)
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
    if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__:
        error = error.__cause__
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
                      f"{storageurl.shown_url(spec.storage_url)}: "
                      f"{storageurl.redact(short(cause, 200), spec.storage_url)}")


def read_study(spec: Spec) -> optuna.Study | None:
    """The stored study, read without creating anything (no file, no table); None if there is
    none yet."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kind = storageurl.storage_kind(spec.storage_url)
    if kind != "rdb":
        if kind == "journal" and not storageurl.journal_path(spec.storage_url).exists():
            return None
        try:
            storage = open_storage(spec)
            return optuna.load_study(study_name=spec.study.name, storage=storage)
        except KeyError:
            return None
        except storage_errors() as e:
            raise unreachable(spec, e, "read") from None
    url = make_url(spec.storage_url)
    if url.get_backend_name() == "sqlite" and (
        not url.database or not Path(url.database).exists()
    ):
        return None
    read_only = sqlite.read_only_url(spec.storage_url)
    for attempt in (spec.storage_url, read_only or spec.storage_url):
        try:
            storage = optuna.storages.RDBStorage(attempt, skip_table_creation=True)
            return optuna.load_study(study_name=spec.study.name, storage=storage)
        except KeyError:
            return None
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            cause = str(e.__cause__ or e)
            if "no such table" in cause or "does not exist" in cause:
                return None
            if read_only and attempt != read_only and (
                    "unable to open database" in cause or "readonly database" in cause):
                continue  # a WAL file in a folder this reader cannot write: as last folded
            raise unreachable(spec, e, "read") from None
    raise AssertionError("unreachable")


def _racing(error: Exception) -> bool:
    text = f"{error} {error.__cause__}"
    return "already exists" in text or "database is locked" in text


def open_study(
    spec: Spec, storage: optuna.storages.BaseStorage, notes: list[str] | None = None
) -> optuna.Study:
    """Create the study, or load it; its directions, metrics and param types must match the
    file (UsageError before anything is written). Refinements are added to `notes`."""
    directions = spec.study.objective_directions
    metrics = spec.study.objective_metrics
    study = optuna.create_study(
        storage=storage,
        study_name=spec.study.name,
        sampler=searchspace.build_sampler(spec.study.sampler, spec.searched, str(spec.source)),
        pruner=searchspace.build_pruner(spec.study.pruner, str(spec.source)),
        directions=directions,
        load_if_exists=True,
    )
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise UsageError(
            f"{spec.source}: study.direction: study {spec.study.name!r} in storage optimises "
            f"{stored}, the file says {directions}; rename the study or fix the direction"
        )
    key = "study.metrics" if len(metrics) > 1 else "study.metric"
    stored_metrics = study.user_attrs.get(METRICS)
    if stored_metrics is not None and stored_metrics != metrics:
        raise UsageError(
            f"{spec.source}: {key}: study {spec.study.name!r} in storage optimises "
            f"{stored_metrics}, the file says {metrics}; rename the study or fix the metric"
        )
    said = check_params(spec, study)
    if notes is not None:
        notes += said
    if stored_metrics is None:
        study.set_user_attr(METRICS, metrics)
    if len(directions) > 1 and not study.metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metrics)
    return study


def _kind(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"categorical {short(repr(list(dist.choices)), 60)}"
    kind = "float" if isinstance(dist, FloatDistribution) else "int"
    return f"{kind}{' (log)' if getattr(dist, 'log', False) else ''}"


def check_params(spec: Spec, study: optuna.Study) -> list[str]:
    """Compare the file's params with those the stored trials used.

    A param whose type (float, int, categorical), log scale or choices changed is a
    UsageError: Optuna cannot mix the two. A changed range or a new param is a refinement:
    returned as one line each, to be said to the user.
    """
    stored: dict[str, BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            stored.setdefault(name, dist)
    notes = []
    for name, dist in searchspace.distributions(spec.searched).items():
        old = stored.get(name)
        if old is None:
            if stored:
                notes.append(f"params.{name}: new in this run (earlier trials did not have it)")
            continue
        if _kind(old) != _kind(dist):
            raise UsageError(
                f"{spec.source}: params.{name}: the stored study searched it as {_kind(old)}, "
                f"the file says {_kind(dist)}; a param's type, log scale and choices cannot "
                "change: rename the param or the study")
        if old != dist:
            notes.append(f"params.{name}: range changed from {_range(old)} to {_range(dist)}")
    return notes


def _range(dist: BaseDistribution) -> str:
    """"[low, high]", and its step where it has one: "[0.0, 0.5] step 0.1"."""
    step = getattr(dist, "step", None)
    text = f"[{getattr(dist, 'low', None)}, {getattr(dist, 'high', None)}]"
    return text if step is None or (isinstance(dist, IntDistribution) and step == 1) else \
        f"{text} step {step}"


def suggest(trial: optuna.Trial, name: str, param: Searched) -> Any:
    """One searched param through Optuna's public suggest API."""
    if isinstance(param, FloatParam):
        return trial.suggest_float(name, param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, IntParam):
        return trial.suggest_int(name, param.low, param.high, step=param.step, log=param.log)
    return trial.suggest_categorical(name, param.choices)


def sample(
    study: optuna.Study, trial: optuna.Trial,
    searched: Mapping[str, Searched],
    sampler_for: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """The params of a trial just asked, sampled by `sampler_for(trial.number)` if given."""
    if sampler_for is not None:
        study.sampler = sampler_for(trial.number)
    return {name: suggest(trial, name, p) for name, p in searched.items()}


class Store:
    """One study in its storage, as one driver (`owner`) sees it."""

    def __init__(
        self, study: optuna.Study, owner: Owner, reclaim_after: float, grid: bool = False,
        sampler_for: Callable[[int], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.study = study
        self.owner = owner
        self.reclaim_after = reclaim_after
        self.grid = grid
        self.sampler_for = sampler_for  # trial number -> the sampler that samples it
        self.clock = clock
        self._channel: Any = None  # to the storage proxy's lock, opened on first use
        self._optuna_beats = _heartbeat_enabled(study._storage)
        self._beats: dict[int, tuple[Any, float]] = {}  # trial id -> (beat seen, since when)
        self._first_seen: dict[int, float] = {}  # trial id -> when this driver first saw it
        self._stuck_until = -math.inf  # the budget lock looked stuck: no waiting till then
        # (trial id, counts by state) of the study's first trials, all finished (`counts`)
        self._settled: tuple[int, collections.Counter[TrialState]] = (-1, collections.Counter())

    # ---- asking -----------------------------------------------------------------------

    def enqueue(self, params: Sequence[dict[str, Any]]) -> None:
        """Queue trials to run first; params already queued or run are not queued again
        (under the budget lock: drivers starting together queue each of them once)."""
        if not params:
            return
        with self.budget_lock():
            for p in params:
                self.study.enqueue_trial(p, skip_if_exists=True)

    def requeue(self, params: Mapping[str, Any], origin: int, attempt: int) -> None:
        """Queue the same params again, as attempt `attempt` of trial `origin`."""
        self.study.enqueue_trial(
            dict(params), user_attrs={RETRY_OF: origin, ATTEMPT: attempt}, skip_if_exists=False
        )

    def ask(
        self,
        searched: Mapping[str, Searched],
        gpu: int,
        trial_dir: Callable[[int], str],
        gpus: Sequence[int] = (),
        queued: bool = True,
    ) -> Asked:
        """A new trial, owned on record (heartbeat and owner) before its params are sampled:
        on a database, in the transaction that creates it, and its params in one more.

        `queued` False: the caller has just seen no WAITING trial, so the queue is not read
        (Optuna reads it in full at every ask). If sampling fails, the trial is told FAIL and
        the error raised.
        """
        def owner(number: int) -> dict[str, Any]:
            record: dict[str, Any] = {
                "host": self.owner.host, "pid": self.owner.pid, "started": self.owner.started,
                "gpu": gpu, "dir": trial_dir(number)}
            if len(gpus) > 1:
                record[GPUS] = ",".join(map(str, gpus))
            return record

        storage = self.study._storage
        owned = False
        if not queued and isinstance(storage, _Storage) and self._optuna_beats:
            owned = True  # Study.ask, less its look at the queue; the owner in its transaction
            self.study._thread_local.cached_all_trials = None
            trial = optuna.Trial(self.study, storage.create_owned_trial(
                self.study._study_id, lambda number: {OWNER: owner(number)}))
        elif queued:
            with warnings.catch_warnings():
                # Optuna warns that heartbeats are meant for optimize(); sweep records its own.
                warnings.filterwarnings("ignore", message="Heartbeat of storage")
                trial = self.study.ask()
        else:  # Study.ask, less its look at the queue
            self.study._thread_local.cached_all_trials = None
            trial = optuna.Trial(self.study, storage.create_new_trial(self.study._study_id))
        try:
            if not owned:
                record = owner(trial.number)
                if self._optuna_beats:  # heartbeat and owner in one commit
                    _set_user_attrs(self.study, trial._trial_id, {OWNER: record}, beat=True)
                    trial._cached_frozen_trial.user_attrs[OWNER] = record
                else:
                    self.beat(trial)
                    trial.set_user_attr(OWNER, record)
            params = sample(self.study, trial, searched, self.sampler_for)
            if owned:  # the params (and what the sampler noted) in one transaction
                cast(_Storage, storage).flush(trial._trial_id)
        except Exception as e:
            self.tell_failed(trial, f"could not start the trial: {e}".splitlines()[0])
            raise
        attrs = trial.user_attrs
        return Asked(trial, trial.number, params, int(attrs.get(ATTEMPT, 0)),
                     int(attrs.get(RETRY_OF, trial.number)))

    @contextlib.contextmanager
    def budget_lock(self, abort: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Held by one driver of the study at a time, around "is there budget left?" and the
        `ask` that spends it, so drivers never start more than `n_trials` between them.

        A PostgreSQL advisory lock (any host); an flock on `<file>.lock` beside a SQLite file
        or `<file>.budget.lock` beside a journal (one host, or a shared disk with working
        locks); the proxy's lock through `sweep storage-proxy`; nothing for other storages.

        The wait is a loop of tries: `abort()` true (the driver was asked to stop) raises
        `LockAbandoned`; when it is held `LOCK_PATIENCE` s with no new trial in the study (a
        frozen or stopped holder, not drivers taking turns), it is gone around: the block runs
        unlocked, and is told so by the yielded False. After that, for `LOCK_PATIENCE` x 6 s,
        one try each time and no wait, until the lock is had again.
        """
        backend = _backend(self.study)
        if backend is None:
            yield True
            return
        with self._lock_of(*backend) as try_lock:
            began, got = self.clock(), try_lock()
            patient = self.clock() >= self._stuck_until
            progress, looked = (0, 0.0) if got else (self._progress(), self.clock())
            while not got and patient:
                if abort():
                    raise LockAbandoned("stopping")
                if self.clock() - looked >= 1.0:  # holders that ask trials are working
                    now_at, looked = self._progress(), self.clock()
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

    def _progress(self) -> int:
        """How many trials the study has: it grows while holders of the lock do their work."""
        try:
            return self.study._storage.get_n_trials(self.study._study_id)
        except Exception:  # a storage hiccup: no news
            return -1

    @contextlib.contextmanager
    def _lock_of(self, kind: str, target: Any) -> Iterator[Callable[[], bool]]:
        """A function that tries once to take the lock; what it took is released on exit."""
        if kind == "file":
            with open(target, "a") as lock:
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
        if kind == "grpc":
            if self._channel is None:
                grpc = grpclock.import_grpc()
                self._channel = grpc.insecure_channel(f"{target[0]}:{target[1]}")
            with grpclock.Holder(self._channel, f"sweep:{self.study.study_name}") as holder:
                yield holder.try_hold
            return
        key = int.from_bytes(hashlib.sha256(
            f"sweep:{self.study.study_name}".encode()).digest()[:8], "big", signed=True)
        with target.connect() as plain:
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

    def close(self) -> None:
        """See `close_storage`."""
        close_storage(self.study._storage)

    # ---- reading ----------------------------------------------------------------------

    def counts(self) -> Counts:
        """Finished, running and waiting trials of every driver (and grid points started).

        On a database, the states of the trials after the oldest unfinished one (so a start
        costs about the same at trial 10,000 as at trial 10); elsewhere, and for a grid, the
        trials themselves."""
        by_state = None if self.grid else self._count_by_state()
        if by_state is not None:
            return Counts(sum(by_state.get(s, 0) for s in FINISHED),
                          by_state.get(TrialState.RUNNING, 0), 0,
                          by_state.get(TrialState.WAITING, 0))
        trials = self.study.get_trials(deepcopy=False)
        finished = sum(1 for t in trials if t.state in FINISHED)
        running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        waiting = sum(1 for t in trials if t.state == TrialState.WAITING)
        grid = 0
        if self.grid:
            grid = len({t.system_attrs.get("grid_id") for t in trials
                        if t.state != TrialState.WAITING} - {None})
        return Counts(finished, running, grid, waiting)

    def _count_by_state(self) -> dict[TrialState, int] | None:
        """The study's trials counted by state where the storage is a database (None
        elsewhere), reading only the trials after the oldest unfinished one: those before it
        are finished, so their states never change and their counts are kept. No trial
        appears below that line later: Optuna creates a trial holding its study's row (FOR
        UPDATE; SQLite has one writer), so trial ids become visible in order."""
        rdb = _rdb(self.study._storage)
        if rdb is None:
            return None
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        model, (settled_id, settled) = models.TrialModel, self._settled
        mine = model.study_id == self.study._study_id
        with _create_scoped_session(rdb.scoped_session) as session:
            rows = session.execute(
                sqlalchemy.select(model.trial_id, model.state)
                .where(mine, model.trial_id > settled_id).order_by(model.trial_id)).all()
        counts, settled = collections.Counter(settled), collections.Counter(settled)
        gap = False
        for trial_id, state in rows:
            state = TrialState(state)
            counts[state] += 1
            gap = gap or not state.is_finished()
            if not gap:
                settled_id = trial_id
                settled[state] += 1
        self._settled = (settled_id, settled)
        return dict(counts)

    def peaks(self) -> list[float]:
        """The GPU memory peaks (MB) of the study's finished trials, where measured."""
        return [float(t.user_attrs["gpu_mem_peak_mb"])
                for t in self.study.get_trials(deepcopy=False, states=FINISHED)
                if isinstance(t.user_attrs.get("gpu_mem_peak_mb"), (int, float))]

    def best(self, k: int = 3) -> list[tuple[int, list[float]]]:
        """The best trial (or up to `k` of the Pareto front) as (number, values)."""
        try:
            if len(self.study.directions) > 1:
                best = self.study.best_trials[:k]
            else:
                best = [self.study.best_trial]
        except ValueError:
            return []
        return [(t.number, list(t.values)) for t in best]

    # ---- following and telling ---------------------------------------------------------

    def report(self, trial: optuna.Trial, step: int, value: float) -> bool:
        """Store an intermediate value; False if Optuna refuses it (the step is skipped).
        Taken if another driver has told the trial meanwhile."""
        try:
            trial.report(value, step)
        except optuna.exceptions.UpdateFinishedTrialError:
            raise Taken(trial.number) from None
        except (ValueError, OverflowError, TypeError) as e:
            log.debug("trial %d: report (%r, %r) refused: %s", trial.number, step, value, e)
            return False
        return True

    def should_prune(self, trial: optuna.Trial) -> bool:
        return bool(trial.should_prune())

    def tell(
        self, trial: optuna.Trial, state: TrialState, values: list[float] | None,
        attrs: Mapping[str, Any],
    ) -> tuple[bool, bool]:
        """Store `attrs`, then tell `state` (COMPLETE, PRUNED, FAIL).

        Returns (told: False if another driver finished the trial first, whether the sampler
        has now searched its whole space).
        """
        kept = {k: v for k, v in attrs.items() if not (isinstance(v, float) and math.isnan(v))}
        storage, trial_id = self.study._storage, trial._trial_id
        if isinstance(storage, _Storage):  # the attributes go in the state's transaction
            storage.stage_user_attrs(trial_id, kept)
        else:
            try:
                _set_user_attrs(self.study, trial_id, kept)
            except optuna.exceptions.UpdateFinishedTrialError:
                return False, False
        try:
            done = _tell_as_in_optimize(
                self.study, trial, values if state is TrialState.COMPLETE else None, state)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False, False
        finally:
            # still staged: Optuna saw the trial finished and wrote nothing
            skipped = isinstance(storage, _Storage) and storage.unstage(trial_id)
        if skipped:
            return False, False
        trial._cached_frozen_trial.user_attrs.update(kept)
        return True, done

    def tell_verdict(
        self, trial: optuna.Trial, verdict: Outcome, gpu: int, attempt: int,
        usage: Mapping[str, float], gpus: Sequence[int] = (),
    ) -> tuple[bool, bool]:
        """Tell a judged trial with the attributes sweep stores (see `tell`); `gpus`: all its
        devices, for a trial of several (stored as "0,1")."""
        attrs: dict[str, Any] = {GPU: gpu, HOST: self.owner.host, ATTEMPT: attempt,
                 EXIT_CODE: verdict.exit_code, **usage,
                 **{METRIC_PREFIX + k: v for k, v in verdict.extras.items()}}
        if len(gpus) > 1:
            attrs[GPUS] = ",".join(str(g) for g in gpus)
        if verdict.fail_reason:
            attrs[FAIL_REASON] = verdict.fail_reason
        return self.tell(trial, verdict.state, verdict.values, attrs)

    def tell_failed(
        self, trial: optuna.Trial, reason: str, gpu: int | None = None, attempt: int | None = None
    ) -> None:
        """Tell FAIL with `reason` (and where it ran), as far as the storage still can."""
        attrs: dict[str, Any] = {FAIL_REASON: reason, HOST: self.owner.host}
        if gpu is not None:
            attrs.update({GPU: gpu, ATTEMPT: attempt or 0})
        try:
            self.tell(trial, TrialState.FAIL, None, attrs)
        except Exception as e:  # storage gone too: nothing more can be done from here
            log.error("could not tell trial %d: %s", trial.number, describe(e))

    # ---- owners, heartbeats and orphans -------------------------------------------------

    def beat(self, trial: optuna.Trial) -> None:
        """Record that the trial's driver is alive: Optuna's heartbeat where the storage has
        them (databases), else a `beat` attribute that changes each time (journal, proxy)."""
        storage = self.study._storage
        if self._optuna_beats:
            storage.record_heartbeat(trial._trial_id)  # type: ignore[attr-defined]
        else:
            storage.set_trial_user_attr(trial._trial_id, BEAT, time.time())

    def _silence_left(self, trial_id: int) -> float:
        """Seconds until a trial's `beat`, unchanged, makes it silent (0: unseen)."""
        seen = self._beats.get(trial_id)
        return max(0.0, self.reclaim_after - (self.clock() - seen[1])) if seen else 0.0

    def _first_look_left(self, trial_id: int) -> float | None:
        """Seconds until this driver has watched a trial's `beat` for `reclaim_after` since it
        first saw it (None: it has, and the trial beats)."""
        first = self._first_seen.get(trial_id)
        if first is None or self.clock() - first >= self.reclaim_after:
            return None
        return self._silence_left(trial_id)

    def _silent(self, t: optuna.trial.FrozenTrial) -> bool:
        """Whether a trial's `beat` has not changed for `reclaim_after` s of this driver's
        own clock (storages without Optuna heartbeats; no clocks of two hosts compared)."""
        now, seen = self.clock(), t.user_attrs.get(BEAT)
        self._first_seen.setdefault(t._trial_id, now)
        last = self._beats.get(t._trial_id)
        if last is None or last[0] != seen:
            self._beats[t._trial_id] = (seen, now)
            return False
        return now - last[1] >= self.reclaim_after

    def orphans(
        self, mine: set[int], now: datetime | None = None
    ) -> tuple[list[Orphan], float | None]:
        """RUNNING trials (not in `mine`) whose driver is gone, and in how many seconds a
        trial without an owner becomes one (None if there is none).

        - on this host: the recorded driver no longer runs (a live one is never overruled,
          even when its heartbeats are late);
        - elsewhere: Optuna's heartbeat is older than `reclaim_after` (without Optuna's
          heartbeats: its `beat` attribute did not change for that long, as this driver saw);
        - no owner on record (the driver died right after `ask`): started longer ago than
          `reclaim_after` (without Optuna's heartbeats: silent that long, as above).
        """
        now = now or datetime.now()
        stale = _stale_trial_ids(self.study)
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not self._optuna_beats:
            stale = {t._trial_id for t in running if self._silent(t)}
            ids = {t._trial_id for t in running}
            self._beats = {k: v for k, v in self._beats.items() if k in ids}
            self._first_seen = {k: v for k, v in self._first_seen.items() if k in ids}
        found: list[Orphan] = []
        wait: float | None = None
        for t in running:
            if t.number in mine:
                continue
            owner = Owner.of(t.user_attrs)
            trial_dir = None
            if owner is not None and owner.host == self.owner.host:
                if owner.alive():
                    continue
                reason = f"driver died (pid {owner.pid} on {owner.host})"
                trial_dir = (t.user_attrs.get(OWNER) or {}).get("dir")
            elif t._trial_id in stale and owner is not None:
                reason = f"driver on {owner.host} died (no heartbeat)"
            elif owner is not None and not self._optuna_beats:
                left = self._first_look_left(t._trial_id)
                if left is not None:  # still timing its beat: a fresh run stays that long
                    wait = left if wait is None else min(wait, left)
                continue
            elif t._trial_id in stale:
                reason = ("driver died before recording itself (no owner, no heartbeat for "
                          f"{self.reclaim_after:.0f} s)")
            elif owner is None and not self._optuna_beats:
                left = self._silence_left(t._trial_id)
                wait = left if wait is None else min(wait, left)
                continue
            elif owner is None and t.datetime_start is not None:
                age = (now - t.datetime_start).total_seconds()
                if age < self.reclaim_after:
                    left = self.reclaim_after - age
                    wait = left if wait is None else min(wait, left)
                    continue
                reason = f"driver died before recording itself (no owner after {age:.0f} s)"
            else:
                continue
            found.append(Orphan(t, reason, trial_dir))
        return found, wait

    def fail_orphan(self, orphan: Orphan) -> bool:
        """Tell an orphan FAIL with its reason and queue its params again; False if another
        driver got there first."""
        t = orphan.trial
        storage = self.study._storage
        owner = t.user_attrs.get(OWNER) or {}
        attrs = {FAIL_REASON: orphan.reason, HOST: owner.get("host"), GPU: owner.get("gpu"),
                 ATTEMPT: t.user_attrs.get(ATTEMPT, 0)}
        kept = {k: v for k, v in attrs.items() if v is not None}
        try:
            if isinstance(storage, _Storage):  # in the state's transaction
                storage.stage_user_attrs(t._trial_id, kept)
            else:
                _set_user_attrs(self.study, t._trial_id, kept)
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                return False
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        finally:
            if isinstance(storage, _Storage):
                storage.unstage(t._trial_id)
        # a queued trial's own params, where the driver died before it had written them all
        params = {**t.system_attrs.get("fixed_params", {}), **t.params}
        if params:  # none: the driver died before sampling them, so no trainer ran
            a = t.user_attrs
            self.requeue(params, int(a.get(RETRY_OF, t.number)), int(a.get(ATTEMPT, 0)) + 1)
        return True


class Heartbeat:
    """Records the heartbeat of the driver's trials every `interval` s, in its own thread, so
    a busy loop never makes a live trial look dead."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._trials: dict[int, optuna.Trial] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-heartbeat", daemon=True)

    def add(self, trial: optuna.Trial) -> None:
        with self._lock:
            self._trials[trial.number] = trial

    def discard(self, number: int) -> None:
        with self._lock:
            self._trials.pop(number, None)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                trials = list(self._trials.values())
            for trial in trials:
                try:
                    self.store.beat(trial)
                except optuna.exceptions.UpdateFinishedTrialError:
                    self.discard(trial.number)  # told between the copy and the beat
                except Exception as e:  # a storage hiccup: the next beat may go through
                    log.warning("heartbeat of trial %d failed: %s", trial.number, describe(e))


# ---- the private Optuna APIs sweep relies on (see tests/test_store.py's contract test) ------


class _Storage(_CachedStorage):
    """Optuna's cache over a database (what `optuna.create_study` wraps an `RDBStorage` in),
    plus a copy of each trial this driver created and runs, written through.

    Nobody writes a running trial but its driver, or a driver that found it orphaned and fails
    it (whose write then refuses this driver's next one). So the trial's reads (`optuna.Trial`'s
    at each ask, Optuna's at each tell, a pruner's at each report) are served from the copy
    instead of six queries each; a new trial is written with its owner and heartbeat, its
    params in one more transaction (`create_owned_trial`, `flush`), and its last attributes
    with its state (`stage_user_attrs`).
    """

    def __init__(self, backend: optuna.storages.RDBStorage) -> None:
        super().__init__(backend)
        self._mine: dict[int, optuna.trial.FrozenTrial] = {}  # trial id -> as stored
        self._pending: dict[int, list[tuple[Any, ...]]] = {}  # trial id -> writes to flush
        self._staged: dict[int, dict[str, Any]] = {}  # trial id -> user attrs for its state

    def _update(self, trial_id: int, change: Callable[[optuna.trial.FrozenTrial], None]) -> None:
        with self._lock:
            self._change(trial_id, change)

    def _change(self, trial_id: int, change: Callable[[optuna.trial.FrozenTrial], None]) -> None:
        """`change` the trial's copy, if there is one; the lock held."""
        mine = self._mine.get(trial_id)
        if mine is not None:
            change(mine)

    def _forget(self, trial_id: int) -> None:
        with self._lock:
            self._mine.pop(trial_id, None)
            self._pending.pop(trial_id, None)

    def create_new_trial(self, study_id: int,
                         template_trial: optuna.trial.FrozenTrial | None = None) -> int:
        trial_id = super().create_new_trial(study_id, template_trial)
        if template_trial is None:  # RUNNING, its number and start, nothing else
            with self._lock:
                _, number = self._trial_id_to_study_id_and_number[trial_id]
                self._mine[trial_id] = copy.deepcopy(self._studies[study_id].trials[number])
        return trial_id

    def create_owned_trial(self, study_id: int,
                           user_attrs: Callable[[int], Mapping[str, Any]]) -> int:
        """A new RUNNING trial with its first heartbeat and the user attributes
        `user_attrs(its number)` (a pure function: it runs inside the transaction), in the
        transaction that creates it: Optuna's `_create_new_trial` (the study's row held, the
        number counted) plus those rows. The trial's params and system attributes written
        from now on are written to the database by `flush`, in one transaction."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        rdb = self._backend
        studies, trials = models.StudyModel.__table__, models.TrialModel.__table__
        for attempt in range(1, 6):  # Optuna's retries, for a deadlock on a server
            try:
                with _create_scoped_session(rdb.scoped_session) as session:
                    if session.execute(sqlalchemy.select(studies.c.study_id).where(
                            studies.c.study_id == study_id).with_for_update()).first() is None:
                        raise KeyError(models.NOT_FOUND_MSG)
                    # the start as Optuna stores it (naive UTC), by its own model's setter
                    start = models.TrialModel(datetime_start=datetime.now())
                    trial_id = cast(Any, session.execute(sqlalchemy.insert(trials).values(
                        study_id=study_id, number=None, state=TrialState.RUNNING,
                        datetime_start=start._datetime_start_utc))).inserted_primary_key[0]
                    number = _number_after(session, study_id, trial_id)
                    session.execute(sqlalchemy.update(trials).where(
                        trials.c.trial_id == trial_id).values(number=number))
                    attrs = _as_stored(dict(user_attrs(number)))
                    session.execute(sqlalchemy.insert(models.TrialHeartbeatModel).values(
                        trial_id=trial_id))
                    _put_user_attrs(session, trial_id, attrs, fresh=True)
                    frozen = optuna.trial.FrozenTrial(
                        number=number, state=TrialState.RUNNING, value=None, values=None,
                        datetime_start=start.datetime_start, datetime_complete=None,
                        params={}, distributions={}, user_attrs=attrs, system_attrs={},
                        intermediate_values={}, trial_id=trial_id)
                break
            except optuna.exceptions.StorageInternalError:
                if attempt == 5:
                    raise
                time.sleep(random.random() * 2.0)
        with self._lock:
            self._studies.setdefault(study_id, _StudyInfo())
            self._add_trials_to_cache(study_id, [frozen])
            self._mine[trial_id] = copy.deepcopy(frozen)
            self._pending[trial_id] = []
        return trial_id

    def flush(self, trial_id: int) -> None:
        """Write what `create_owned_trial` left pending, in one transaction (as Optuna's
        `set_trial_param` and `set_trial_system_attr` would, each in its own); none is left
        pending from now on."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with self._lock:
            writes = self._pending.pop(trial_id, [])
        if not writes:
            return
        rdb = self._backend
        try:
            with _create_scoped_session(rdb.scoped_session, True) as session:
                rdb.check_trial_is_updatable(trial_id, _state_of(session, trial_id))
                rows = []
                for kind, *args in writes:
                    if kind == "system":
                        rdb._set_trial_attr_without_commit(
                            session, models.TrialSystemAttributeModel, trial_id, *args)
                        continue
                    name, value, distribution, known = args
                    if known is None:  # the study's first of that name, as far as we know
                        rdb._set_trial_param_without_commit(
                            session, trial_id, name, value, distribution)
                        continue
                    distributions.check_distribution_compatibility(known, distribution)
                    rows.append({"trial_id": trial_id, "param_name": name, "param_value": value,
                                 "distribution_json": distributions.distribution_to_json(
                                     distribution)})
                if rows:  # as Optuna's _set_trial_param_without_commit adds them
                    session.execute(sqlalchemy.insert(models.TrialParamModel), rows)
        except BaseException:
            self._forget(trial_id)
            raise
        with self._lock:
            study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
            known = self._studies[study_id].param_distribution
            for kind, *args in writes:
                if kind == "param":
                    known.setdefault(args[0], args[2])

    def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        with self._lock:
            mine = self._mine.get(trial_id)
            if mine is not None:
                return copy.deepcopy(mine)
        return super().get_trial(trial_id)

    def _write(self, trial_id: int, write: Callable[[], None],
               change: Callable[[optuna.trial.FrozenTrial], None],
               pending: tuple[Any, ...] | None = None) -> None:
        """`write` to the database, then `change` the trial's copy alike; or, while the
        trial's writes are pending (`create_owned_trial`), only note `pending` for `flush`.
        A failed write drops the copy: the database's state is not known here."""
        with self._lock:
            queue = self._pending.get(trial_id)
            if queue is not None and pending is not None:
                queue.append(pending)
                self._change(trial_id, change)
                return
        if queue is not None:
            self.flush(trial_id)
        try:
            write()
        except BaseException:
            self._forget(trial_id)
            raise
        self._update(trial_id, change)

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        def change(t: optuna.trial.FrozenTrial) -> None:
            t.params[param_name] = distribution.to_external_repr(param_value_internal)
            t.distributions[param_name] = distribution

        with self._lock:
            study_id, _ = self._trial_id_to_study_id_and_number[trial_id]
            known = self._studies[study_id].param_distribution.get(param_name)
        write = super().set_trial_param
        self._write(trial_id, lambda: write(trial_id, param_name, param_value_internal,
                                            distribution), change,
                    ("param", param_name, param_value_internal, distribution, known))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        stored, write = _as_stored({key: value}), super().set_trial_system_attr
        self._write(trial_id, lambda: write(trial_id, key, value),
                    lambda t: t.system_attrs.update(stored), ("system", key, value))

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        stored, write = _as_stored({key: value}), super().set_trial_user_attr
        self._write(trial_id, lambda: write(trial_id, key, value),
                    lambda t: t.user_attrs.update(stored))

    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        write = super().set_trial_intermediate_value
        self._write(trial_id, lambda: write(trial_id, step, intermediate_value),
                    lambda t: t.intermediate_values.__setitem__(step, float(intermediate_value)))

    def stage_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """User attributes to write with the trial's next state (`set_trial_state_values`,
        in its transaction); read from now on. Dropped if that write fails."""
        stored = _as_stored(dict(attrs))
        with self._lock:
            self._staged.setdefault(trial_id, {}).update(stored)
        self._update(trial_id, lambda t: t.user_attrs.update(stored))

    def unstage(self, trial_id: int) -> bool:
        """Drop the attributes staged for a trial; True if there were any (no state was
        written since they were staged)."""
        with self._lock:
            return self._staged.pop(trial_id, None) is not None

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        with self._lock:
            attrs = self._staged.pop(trial_id, None) or {}
            self._pending.pop(trial_id, None)  # a trial told before its params were written
        try:
            if state.is_finished():
                return self._finish(trial_id, state, values, attrs)
            return super().set_trial_state_values(trial_id, state, values)
        finally:  # told (or refused: finished elsewhere): read from the database from now on
            self._forget(trial_id)

    def _finish(self, trial_id: int, state: TrialState, values: Sequence[float] | None,
                attrs: Mapping[str, Any]) -> bool:
        """Optuna's `RDBStorage.set_trial_state_values` to a finished `state`, with the user
        attributes `attrs` written in its transaction."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        rdb = self._backend
        trials, stored = models.TrialModel.__table__, models.TrialValueModel.__table__
        try:
            with _create_scoped_session(rdb.scoped_session) as session:
                rdb.check_trial_is_updatable(trial_id, _state_of(session, trial_id, True))
                if attrs:
                    _put_user_attrs(session, trial_id, attrs)
                if values:
                    rows = []
                    for objective, v in enumerate(values):
                        value, kind = models.TrialValueModel.value_to_stored_repr(float(v))
                        rows.append({"trial_id": trial_id, "objective": objective,
                                     "value": value, "value_type": kind})
                    session.execute(sqlalchemy.delete(stored).where(
                        stored.c.trial_id == trial_id))
                    session.execute(sqlalchemy.insert(stored), rows)
                # the end as Optuna stores it (naive UTC), by its own model's setter
                end = models.TrialModel(datetime_complete=datetime.now())
                session.execute(sqlalchemy.update(trials).where(
                    trials.c.trial_id == trial_id).values(
                        state=state, datetime_complete=end._datetime_complete_utc))
        except IntegrityError:
            return False
        return True


def _put_user_attrs(session: Any, trial_id: int, attrs: Mapping[str, Any],
                    fresh: bool = False) -> None:
    """A trial's user attributes as rows of Optuna's table, replacing those of the same keys
    (`fresh`: a trial created in this transaction, which has none)."""
    from optuna.storages._rdb import models

    table = models.TrialUserAttributeModel.__table__
    if not fresh:
        session.execute(sqlalchemy.delete(table).where(
            table.c.trial_id == trial_id, table.c.key.in_(list(attrs))))
    session.execute(sqlalchemy.insert(table), [
        {"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()])


def _number_after(session: Any, study_id: int, trial_id: int) -> int:
    """The number of a study's new trial `trial_id`: Optuna's `count_past_trials` (how many
    of the study's trials have a smaller id), read as the number of the one just before it
    plus one. The same: every trial was numbered so, holding its study's row. And one index
    step instead of a scan of the whole study (1 ms at 10,000 trials, at every trial)."""
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    mine = (trials.c.study_id == study_id, trials.c.trial_id < trial_id)
    last = session.execute(sqlalchemy.select(trials.c.number).where(*mine).order_by(
        trials.c.trial_id.desc()).limit(1)).first()
    if last is None:
        return 0
    if last.number is not None:
        return int(last.number) + 1
    return int(session.execute(  # never seen: Optuna's count, as it is
        sqlalchemy.select(sqlalchemy.func.count(trials.c.trial_id)).where(*mine)).scalar_one())


def _state_of(session: Any, trial_id: int, for_update: bool = False) -> TrialState:
    """A trial's state, read as Optuna's `TrialModel.find_or_raise_by_id` reads the trial
    (KeyError if there is none)."""
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    query = sqlalchemy.select(trials.c.state).where(trials.c.trial_id == trial_id)
    state = session.execute(query.with_for_update() if for_update else query).scalar()
    if state is None:
        raise KeyError(models.NOT_FOUND_MSG)
    return cast(TrialState, state)


def _as_stored(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as a database gives them back (JSON: a tuple is read as a list)."""
    return json.loads(json.dumps(attrs))


def _backend(study: optuna.Study) -> tuple[str, Any] | None:
    """("file", the lock file beside a SQLite or journal file), ("postgresql", the storage's
    SQLAlchemy engine) or ("grpc", (host, port) of the proxy)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = study._storage
    if isinstance(storage, optuna.storages.GrpcStorageProxy):
        return "grpc", (storage._host, storage._port)
    if isinstance(storage, JournalStorage):
        backend = storage._backend
        if isinstance(backend, JournalFileBackend):
            return "file", f"{os.path.realpath(backend._file_path)}.budget.lock"
        return None
    rdb = _rdb(storage)
    if rdb is None:
        return None
    engine = rdb.engine
    db_file = sqlite.file_of(engine.url)
    if db_file is not None:
        return "file", f"{os.path.realpath(db_file)}.lock"  # one lock per file, however named
    if engine.url.get_backend_name() == "postgresql":
        return "postgresql", engine
    return None


def _rdb(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage | None:
    """The database storage behind `storage` (Optuna's _CachedStorage wraps it, and keeps
    no user attributes of its own), or None if it is not one."""
    rdb = getattr(storage, "_backend", storage)
    return rdb if isinstance(rdb, optuna.storages.RDBStorage) else None


def _set_user_attrs(study: optuna.Study, trial_id: int, attrs: Mapping[str, Any],
                    beat: bool = False) -> None:
    """The user attributes of a trial, in one database transaction where the storage is one
    (Optuna commits each attribute on its own: a round trip each, on the way from one trial
    to the next); `beat`: its first heartbeat too, in the same transaction (Optuna's
    heartbeats must be on: a database). UpdateFinishedTrialError if the trial is finished."""
    storage = study._storage
    rdb = _rdb(storage)

    def one_by_one() -> None:
        if beat:
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)

    if rdb is None or (len(attrs) < 2 and not beat):
        one_by_one()
        return
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    def in_one() -> None:
        try:
            with _create_scoped_session(rdb.scoped_session) as session:  # 3 or 4 statements
                rdb.check_trial_is_updatable(trial_id, _state_of(session, trial_id))
                if beat:  # the time is the database's, as in Optuna's record_heartbeat
                    session.execute(sqlalchemy.insert(models.TrialHeartbeatModel).values(
                        trial_id=trial_id))
                _put_user_attrs(session, trial_id, attrs)
        except IntegrityError:  # another driver wrote one of them meanwhile: Optuna's way
            one_by_one()

    if isinstance(storage, _Storage):  # and its copy of the trial, alike
        stored = _as_stored(dict(attrs))
        storage._write(trial_id, in_one, lambda t: t.user_attrs.update(stored))
    else:
        in_one()


def _heartbeat_enabled(storage: optuna.storages.BaseStorage) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return bool(is_heartbeat_enabled(storage))


def _stale_trial_ids(study: optuna.Study) -> set[int]:
    """Ids of RUNNING trials whose heartbeat is older than the storage's grace period."""
    storage = study._storage
    if not _heartbeat_enabled(storage):
        return set()
    return set(storage._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]


def _tell_as_in_optimize(
    study: optuna.Study, trial: optuna.Trial, values: list[float] | None, state: TrialState
) -> bool:
    """`study.tell`, letting a sampler end the search as it would under optimize().

    GridSampler and BruteForceSampler call study.stop() once their space is exhausted; Optuna
    allows that only inside optimize(). Returns True if the sampler asked to stop.
    """
    from optuna.study._tell import _tell_with_warning

    local = study._thread_local
    local.in_optimize_loop = True
    try:  # Study.tell, less the copy of the told trial it reads back and returns
        _tell_with_warning(study, trial, values, state=state, skip_if_finished=True)
    finally:
        local.in_optimize_loop = False
    if study._stop_flag:
        study._stop_flag = False
        return True
    return False
