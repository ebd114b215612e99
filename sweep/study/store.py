"""One study as one driver sees it: asking, telling, counting and reclaiming trials, through
Optuna's public API (the few names it has no public form for are in `_optuna_compat`).

It names the user attributes sweep stores on a trial, records who owns a running trial (its
heartbeat and owner, before its trainer starts), and finds the trials whose driver is gone.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import optuna
from optuna.trial import TrialState

from sweep._core import (
    ALIVE_UNTIL,
    ATTEMPT,
    BEAT,
    EXIT_CODE,
    FAIL_REASON,
    FIXED_PARAMS,
    GPU,
    GPU_MEM_PEAK_MB,
    GRID_ID,
    HOST,
    METRIC_PREFIX,
    OWNER,
    RETRY_OF,
)
from sweep.spec import Searched
from sweep.study import _carried
from sweep.study._optuna_compat import stale_trial_ids, trial_id
from sweep.study._optuna_compat import tell as compat_tell
from sweep.study.attrs import Owner, OwnerRecord, devices_shown, place
from sweep.study.budget import BudgetLock
from sweep.study.counts import Counts
from sweep.study.opening import sample
from sweep.study.ownership import BeatWatch, Orphan, Sighting, judge
from sweep.study.storage import (
    FileIdentity,
    StudyFileReplaced,
    close_storage,
    describe,
    storage_lost_errors,
)
from sweep.trial import Outcome, lineage

log = logging.getLogger("sweep")

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

class Taken(Exception):
    """Another driver has told this driver's trial (it took this one for dead)."""


@dataclass(frozen=True)
class Asked:
    """A trial just asked and owned: its params (searched ones) and its lineage."""

    trial: optuna.Trial
    number: int
    params: dict[str, Any]
    lineage: lineage.Lineage  # where it stands in its lineage (origin, attempt, ...)
    reached: int = 0  # the last step of the curve its lineage's earlier attempts carried

    @property
    def attempt(self) -> int:
        return self.lineage.attempt

    @property
    def origin(self) -> int:
        """The trial number of its lineage's first attempt (its own for a new one)."""
        return self.lineage.origin


class Store:
    """One study in its storage, as one driver (`owner`) sees it.

    `storage` is the storage the study was opened on (as `storage.open_storage` gives it);
    `lock` what the budget lock is taken on; `identity` the SQLite study file as opened (a
    file deleted or replaced meanwhile stops the run: `StudyFileReplaced`).
    """

    def __init__(
        self, study: optuna.Study, storage: optuna.storages.BaseStorage, owner: Owner,
        reclaim_after: float, grid: bool = False,
        sampler_for: Callable[[int], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        lock: Any = None, identity: FileIdentity | None = None,
    ) -> None:
        self.study = study
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.owner = owner
        self.reclaim_after = reclaim_after
        self.grid = grid
        self.sampler_for = sampler_for  # trial number -> the sampler that samples it
        self.clock = clock
        self.identity = identity
        self.lock = BudgetLock(lock, study.study_name, lambda: self._progress(), clock)
        self._optuna_beats = isinstance(storage, optuna.storages.RDBStorage) and \
            storage.get_heartbeat_interval() is not None
        self.beats = BeatWatch(reclaim_after, clock)  # storages without Optuna's heartbeats
        self._enqueued_all = False  # every study.enqueue entry has a trial
        self.lost: str | None = None  # the storage is gone for this run: why (`lose`)
        self.untold: list[int] = []  # trials that could not be told since

    def check_file(self) -> None:
        """StudyFileReplaced if the SQLite study file is no longer the one opened."""
        if self.identity is not None:
            self.identity.check()

    # ---- asking -----------------------------------------------------------------------

    def enqueue_next(self, params: Sequence[Mapping[str, Any]]) -> bool:
        """For a caller that holds the budget lock and sees nothing queued: the first of
        `params` (`study.enqueue`) that no trial of the study has yet, queued to be asked
        next; False once every one has. One at a time, so what is queued meanwhile (a
        continuation, a retry, a promotion: Optuna asks the oldest queued trial first) runs
        before the rest of them, and drivers starting together queue each of them once."""
        if not params or self._enqueued_all:
            return False
        seen = [{**t.system_attrs.get(FIXED_PARAMS, {}), **t.params}
                for t in self.study.get_trials(deepcopy=False)]
        for p in params:
            if not any(all(k in s and s[k] == v for k, v in p.items()) for s in seen):
                self.study.enqueue_trial(dict(p), skip_if_exists=False)
                return True
        self._enqueued_all = True  # trials are never deleted: it stays so
        return False

    def requeue(self, params: Mapping[str, Any], origin: int, attempt: int,
                attrs: Mapping[str, Any] | None = None) -> bool:
        """Queue the same params again, as attempt `attempt` of trial `origin` (with `attrs`,
        the rest of its lineage: `lineage.Lineage.next_attrs`), unless a trial
        of that origin and attempt exists already (queued, running or finished): True if it
        queued one. Under the budget lock, so two drivers queue it once; idempotent, so it can
        go before the tell it follows from (a kill between the two leaves the retry queued,
        and whoever tells the trial after does not queue a second)."""
        with self.budget_lock():
            return self.requeue_held(params, origin, attempt, attrs)

    def requeue_held(self, params: Mapping[str, Any], origin: int, attempt: int,
                     attrs: Mapping[str, Any] | None = None) -> bool:
        """`requeue` for a caller that holds the budget lock already (it is not reentrant:
        a second take waits for the first)."""
        if self._retry_exists(origin, attempt):
            return False
        self.study.enqueue_trial(
            dict(params), user_attrs={**(attrs or {}), RETRY_OF: origin, ATTEMPT: attempt},
            skip_if_exists=False)
        return True

    def _retry_exists(self, origin: int, attempt: int) -> bool:
        """Whether the study has a trial that is attempt `attempt` of trial `origin`."""
        return any(t.user_attrs.get(RETRY_OF) == origin and t.user_attrs.get(ATTEMPT) == attempt
                   for t in self.study.get_trials(deepcopy=False))

    def ask(
        self,
        searched: Mapping[str, Searched],
        gpu: int,
        trial_dir: Callable[[int], str],
        gpus: Sequence[int] = (),
    ) -> Asked:
        """A new trial (a queued one first), owned on record (its first heartbeat, then its
        owner) before its params are sampled and its trainer starts.

        Killed between Optuna's ask and the owner record, a trial is RUNNING with no owner:
        `orphans` reclaims it after `reclaim_after`. If sampling fails, the trial is told FAIL
        and the error raised.
        """
        self.check_file()
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for optimize(); sweep records its own.
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        try:
            record = OwnerRecord(self.owner, gpu, trial_dir(trial.number), devices_shown(gpus))
            self.beat(trial)
            line = _carried.lineage_of(self.study, trial)  # its run id before anything runs
            trial.set_user_attr(OWNER, record.to_attr())
            params = sample(self.study, trial,
                            _carried.params(self.storage, self.study, trial, line, searched),
                            self.sampler_for)
            reached = _carried.curve(self.study, trial, line)
        except Exception as e:
            self.tell_failed(trial, f"could not start the trial: {e}".splitlines()[0])
            raise
        return Asked(trial, trial.number, params, line, reached)

    @contextlib.contextmanager
    def budget_lock(self, abort: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """See `budget.BudgetLock.hold`."""
        with self.lock.hold(abort) as held:
            yield held

    def _progress(self) -> int:
        """How many trials the study has: it grows while holders of the lock do their work."""
        try:
            return len(self.study.get_trials(deepcopy=False))  # Optuna's cache: no full read
        except Exception:  # a storage hiccup: no news
            return -1

    def close(self) -> None:
        """See `storage.close_storage`."""
        close_storage(self.storage)

    # ---- reading ----------------------------------------------------------------------

    def counts(self) -> Counts:
        """Finished, running and waiting trials of every driver (and grid points started)."""
        self.check_file()
        trials = self.study.get_trials(deepcopy=False)  # Optuna's cache: new and unfinished
        by_state = collections.Counter(t.state for t in trials)
        grid = 0
        if self.grid:
            grid = len({t.system_attrs.get(GRID_ID) for t in trials
                        if t.state != TrialState.WAITING} - {None})
        return Counts(sum(by_state[s] for s in FINISHED), by_state[TrialState.RUNNING], grid,
                      by_state[TrialState.WAITING])

    def peaks(self) -> list[float]:
        """The GPU memory peaks (MB) of the study's finished trials, where measured."""
        return [float(t.user_attrs[GPU_MEM_PEAK_MB])
                for t in self.study.get_trials(deepcopy=False, states=FINISHED)
                if isinstance(t.user_attrs.get(GPU_MEM_PEAK_MB), (int, float))]

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
            with warnings.catch_warnings():  # a step carried from an earlier attempt: kept
                warnings.filterwarnings("ignore", message="The reported value is ignored")
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
        """Store `attrs` (NaN left out, and those the trial holds already with the same value:
        each is a storage write), then tell `state` (COMPLETE, PRUNED, FAIL).

        Returns (told: False if another driver finished the trial first, whether the sampler
        has now searched its whole space).
        """
        self.check_file()
        state = TrialState[state] if isinstance(state, str) else state
        try:
            self.note(trial, {k: v for k, v in attrs.items()
                              if not (isinstance(v, float) and math.isnan(v))})
            done = compat_tell(self.study, trial,
                               values if state is TrialState.COMPLETE else None, state)
        except (Taken, optuna.exceptions.UpdateFinishedTrialError):
            return False, False
        except ValueError:  # "Cannot tell a FAIL trial": finished by another driver
            if self.storage.get_trial(trial_id(trial)).state.is_finished():
                return False, False
            raise
        return True, done

    def note(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        """Store `attrs` on a running trial (what it runs: `provenance.RunRecord.attrs`), but
        those it holds already with the same value (as this driver knows it: Optuna's trial
        keeps what was read at the ask and written since). Taken if another driver has told
        the trial meanwhile."""
        held = trial.user_attrs
        for key, value in attrs.items():
            if key not in held or held[key] != value:
                try:
                    trial.set_user_attr(key, value)
                except optuna.exceptions.UpdateFinishedTrialError:
                    raise Taken(trial.number) from None

    def moved(self, trial: optuna.Trial, gpu: int, gpus: Sequence[int]) -> None:
        """A trial asked for some devices starts on others (it was parked, without them): its
        owner record names these."""
        record = OwnerRecord.of(trial.user_attrs)
        if record is None:
            return
        self.note(trial, {OWNER: dataclasses.replace(record, gpu=gpu, gpus=devices_shown(gpus))
                          .to_attr()})

    def placed(self, trial: optuna.Trial, gpu: int, attempt: int,
               gpus: Sequence[int] = ()) -> None:
        """Where a trial started (`attrs.place`), once its trainer was spawned: off the
        device's hand-off (`tell_verdict` skips what this wrote). Taken if another driver has
        told the trial meanwhile."""
        self.note(trial, place(gpu, self.owner.host, attempt, gpus))

    def tell_verdict(
        self, trial: optuna.Trial, verdict: Outcome, gpu: int, attempt: int,
        usage: Mapping[str, float], gpus: Sequence[int] = (),
    ) -> tuple[bool, bool]:
        """Tell a judged trial with the attributes sweep stores (see `tell`); `gpus`: all its
        devices, for a trial of several (stored as "0,1")."""
        attrs: dict[str, Any] = {**place(gpu, self.owner.host, attempt, gpus),
                                 EXIT_CODE: verdict.exit_code, **usage,
                                 **{METRIC_PREFIX + k: v for k, v in verdict.extras.items()}}
        if verdict.fail_reason:
            attrs[FAIL_REASON] = verdict.fail_reason
        return self.tell(trial, verdict.state, verdict.values, attrs)

    def tell_failed(
        self, trial: optuna.Trial, reason: str, gpu: int | None = None, attempt: int | None = None
    ) -> bool:
        """Tell FAIL with `reason` (and where it ran), as far as the storage still can (not
        at all into a study file replaced meanwhile). True if it was told (not: another
        driver told it first, or the storage could not be reached)."""
        attrs: dict[str, Any] = {FAIL_REASON: reason, HOST: self.owner.host}
        if gpu is not None:
            attrs[GPU] = gpu
        if gpu is not None or attempt is not None:
            attrs[ATTEMPT] = attempt or 0
        try:
            return self.tell(trial, TrialState.FAIL, None, attrs)[0]
        except StudyFileReplaced:
            log.debug("trial %d not told: the study file is gone", trial.number)
        except storage_lost_errors() as e:  # the run's last line says it, with the count
            self.lose(e)
            self.untold.append(trial.number)
            log.debug("could not tell trial %d: %s", trial.number, describe(e))
        except Exception as e:
            log.error("could not tell trial %d: %s", trial.number, describe(e))
        return False

    def lose(self, error: BaseException) -> None:
        """The storage is gone for this run (`error` said so first): what fails against it
        from now on is said once, by the run's last line (`lost`, `untold`)."""
        if self.lost is None:
            self.lost = describe(error)

    # ---- owners, heartbeats and orphans -------------------------------------------------

    def beat(self, trial: optuna.Trial) -> None:
        """Record that the trial's driver is alive: Optuna's heartbeat where the storage has
        them (databases), else a `beat` attribute that changes each time (journal, proxy)."""
        if self._optuna_beats:
            cast(optuna.storages.RDBStorage, self.storage).record_heartbeat(trial_id(trial))
        else:
            self.storage.set_trial_user_attr(trial_id(trial), BEAT, time.time())

    def orphans(
        self, mine: set[int], now: datetime | None = None
    ) -> tuple[list[Orphan], float | None]:
        """RUNNING trials (not in `mine`) whose driver is gone, by the rules of
        `ownership.judge`, and in how many seconds one may become one (None: none may).
        `now`: the wall clock, naive local time as Optuna's `datetime_start`."""
        self.check_file()
        now = now or datetime.now()
        stale: set[int] = set()
        if self._optuna_beats:
            stale = stale_trial_ids(cast(optuna.storages.RDBStorage, self.storage),
                                    self.study_id)
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not self._optuna_beats:
            stale = {trial_id(t) for t in running if self.beats.silent(trial_id(t),
                                                                        t.user_attrs.get(BEAT))}
            self.beats.keep({trial_id(t) for t in running})
        found: list[Orphan] = []
        wait: float | None = None
        for t in running:
            if t.number in mine:
                continue
            key = trial_id(t)
            owner = Owner.of(t.user_attrs)
            here = owner is not None and owner.host == self.owner.host
            start = t.datetime_start
            judged = judge(Sighting(
                owner, (owner is not None and owner.alive()) if here else None, key in stale,
                self._optuna_beats, None if start is None else (now - start).total_seconds(),
                self.beats.silence_left(key), self.beats.first_look_left(key)),
                self.reclaim_after)
            if judged.wait is not None:
                wait = judged.wait if wait is None else min(wait, judged.wait)
            if judged.reason is not None:
                record = OwnerRecord.of(t.user_attrs)
                trial_dir = record.dir if here and record is not None else None
                found.append(Orphan(t, judged.reason, trial_dir))
        return found, wait

    def fail_orphan(self, orphan: Orphan, alive_until: float | None = None) -> bool:
        """Queue an orphan's params again, then tell it FAIL with its reason (and `alive_until`,
        its driver's last sign of life, epoch s: when it stopped holding its devices); False if
        another driver got there first.

        Safe against a kill at any point: the retry is queued before the FAIL (`requeue`
        queues it once), so a reclaimer killed in between leaves the orphan RUNNING with its
        retry queued, and the next reclaimer tells it FAIL without queueing a second. Its
        attributes are written before its state (a finished trial takes none): a driver
        wrongly taken for dead that tells in between keeps its own state, and its trial the
        reclaimer's `fail_reason` beside its own attributes (and the retry queued for it runs
        its params once more)."""
        t = orphan.trial
        key = trial_id(t)
        if self.storage.get_trial(key).state.is_finished():
            return False  # told meanwhile (by its driver, or another reclaimer)
        # a queued trial's own params, where the driver died before it had written them all
        params = {**t.system_attrs.get(FIXED_PARAMS, {}), **t.params}
        a = t.user_attrs
        if params:  # none: the driver died before sampling them, so no trainer ran
            # its continuation: a dead driver is no failure of the trial (no retry spent)
            line = lineage.Lineage.of(a, t.number)
            self.requeue(params, line.origin, line.attempt + 1,
                         line.next_attrs(t.number, retry=False))
        record = OwnerRecord.of(a)
        attrs = {FAIL_REASON: orphan.reason, HOST: record.owner.host if record else None,
                 GPU: record.gpu if record else None, ATTEMPT: a.get(ATTEMPT, 0),
                 ALIVE_UNTIL: alive_until}
        try:
            for k, v in attrs.items():
                if v is not None:
                    self.storage.set_trial_user_attr(key, k, v)
            return bool(self.storage.set_trial_state_values(key, state=TrialState.FAIL))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
