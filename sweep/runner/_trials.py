"""The trials one driver owns, one record each (`Owned`), from the ask until their devices go back
to the pool, and the one way out of every trial the driver ends, its own or a dead driver's
(`Trials.finish`).

A record's phase is PARKED from the ask until its processes start (asked, not started: its
lineage's folder is in use, or a PBT exploit's donor has no state to copy yet, and it waits,
with its lease or without it), then its `RunningTrial`'s. This module is the only one of the
runner that gives a lease back, discards a heartbeat or tells a trial: always in that order,
then the counts (`Tally`). What carries a trial's lineage on (`carry_on`, `again`) is queued
before the trial is finished (a kill between the two leaves it queued: `Store.requeue`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

from sweep._core import EXPLOIT_STEP
from sweep.gpus import Lease, Pool
from sweep.spec import Spec
from sweep.study import Asked, Heartbeat, Orphan, Store, Tally
from sweep.trial import MOVES, Lineage, Outcome, Phase, PhaseError, RunningTrial, Stop


@dataclass
class Owned:
    """What the driver holds of one trial it asked: the trial, its lease (None while it waits
    parked without its devices), the port held for a trial of several devices, and, once its
    processes started, its `RunningTrial`."""

    asked: Asked
    lease: Lease | None
    port: int | None = None
    run: RunningTrial | None = None

    @property
    def number(self) -> int:
        return self.asked.number

    @property
    def phase(self) -> Phase:
        """PARKED until its processes start, then its `RunningTrial`'s."""
        return Phase.PARKED if self.run is None else self.run.phase

    def started(self, run: RunningTrial) -> None:
        """Its processes started (`run`): the move from PARKED, checked against `MOVES`."""
        if Phase.RUNNING not in MOVES[self.phase]:
            raise PhaseError(f"trial {self.number}: {self.phase.value} -> running")
        self.run = run


class Trials:
    """The trials one driver of `spec` owns (see the module's docstring): `store` tells them,
    `pool` takes their leases back, `heartbeat` beats them, `tally` holds the study's counts
    as last read plus what this driver did since; `now` is the driver's clock, `say` gives
    the user one line."""

    def __init__(self, spec: Spec, store: Store, pool: Pool, now: Callable[[], float],
                 say: Callable[[str], None]) -> None:
        self.spec, self.store, self.pool, self.now, self.say = spec, store, pool, now, say
        self.heartbeat = Heartbeat(store, spec.study.heartbeat_interval)
        self.tally = Tally(store.counts, grid=store.grid)
        self._owned: dict[int, Owned] = {}

    def own(self, asked: Asked, lease: Lease) -> Owned:
        """`asked` was asked for `lease` (bound to it): owned, parked, beating."""
        owned = self._owned[asked.number] = Owned(asked, lease)
        self.heartbeat.add(asked.trial)
        return owned

    def record(self, number: int) -> Owned:
        return self._owned[number]

    def numbers(self) -> set[int]:
        """Every owned trial's number: none of them is an orphan."""
        return set(self._owned)

    def running(self) -> list[RunningTrial]:
        """The owned trials whose processes started, oldest first."""
        return [o.run for o in self._owned.values() if o.run is not None]

    def parked(self) -> list[Owned]:
        """The owned trials not started, oldest first."""
        return [o for o in self._owned.values() if o.run is None]

    def runs_lineage(self, origin: int) -> bool:
        """Whether an attempt of lineage `origin` runs here (its guard holds the lineage's
        lock)."""
        return any(run.lineage.origin == origin for run in self.running())

    def park(self, owned: Owned, keeps_device: bool) -> None:
        """`owned` could not start yet: it waits on its devices (`keeps_device`), or gives
        them back, and its port, to start on the devices free then."""
        if not keeps_device and owned.lease is not None:
            self.give_back(owned.lease)
            owned.lease, owned.port = None, None

    def give_back(self, lease: Lease, oom: bool = False) -> None:
        """The one place a lease goes back to the pool (`oom`: its trial ran out of memory)."""
        self.pool.release(lease, oom=oom)

    def end(self, owned: Owned, oom: bool = False) -> None:
        """Its devices go back to the pool (`oom`: it ran out of memory), and its record goes:
        a told trial's once its processes are gone and its devices clear, or one `finish`ed
        with no verdict (nothing of it runs)."""
        del self._owned[owned.number]
        if owned.lease is not None:
            self.give_back(owned.lease, oom)

    def carry_on(self, params: dict[str, Any], number: int, line: Lineage, retry: bool,
                 resume: bool, why: str = "interrupted",
                 attrs: dict[str, Any] | None = None) -> bool:
        """Queue the next attempt of trial `number`'s lineage: a retry after a real failure, or
        the continuation (`resume`) of a trial that was interrupted or failed on a sick device
        (`why`), with `attrs` if given (else `Lineage.next_attrs`'s). True if this call
        queued it."""
        if not (retry or resume):
            return False
        searched = {k: v for k, v in params.items() if k in self.spec.searched}
        if attrs is None:
            attrs = line.next_attrs(number, retry=retry,
                                    clean=self.spec.trainer.retry_from == "clean")
        queued = self.store.requeue(searched, line.origin, line.attempt + 1, attrs)
        if queued and resume:
            self.say(f"trial {number} {why}: queued to continue (same params, its checkpoint "
                     "folder)")
        return queued

    def again(self, asked: Asked, why: str) -> None:
        """Queue the attempt that takes the place of `asked`, which never ran (`why`): it
        starts as `asked` would have (`Lineage.again_attrs`; a PBT copy made for it kept)."""
        kept = EXPLOIT_STEP in asked.trial.user_attrs
        self.carry_on(asked.params, asked.number, asked.lineage, False, True, why,
                      asked.lineage.again_attrs(asked.number, kept))

    def finish(self, trial: Owned | Orphan, state: TrialState, reason: Stop | str | None = None,
               verdict: Outcome | None = None, usage: Mapping[str, float] | None = None,
               alive_until: float | None = None) -> tuple[bool, bool]:
        """The one way out of a trial: told `state`, in one order.

        1. Its devices go back to the pool, and its record goes, unless it is told on its
           `verdict` (a trial judged: its processes may still hold them; `end` gives them
           back once they are gone).
        2. Its heartbeat is discarded.
        3. It is told: on its `verdict` (with `usage`); FAIL with `reason`, a `Stop` (the
           driver stopped it: where it ran or waited is stored too) or a text (it could not
           start); PRUNED (it did not start: `NotStarted`); an `Orphan`, a dead driver's,
           FAIL with its reason (and `alive_until`, its driver's last sign of life), its
           continuation queued first by the store. A started trial moves to TOLD.
        4. The counts: one of its own told, one trial less running (and one more finished but
           for FAIL); else they are read again (another driver told it; an orphan's
           continuation was queued).

        Returns (told: False if another driver told it first, or the storage could not be
        reached; whether the sampler has searched its whole space)."""
        owned = trial if isinstance(trial, Owned) else None  # an orphan holds nothing here
        if owned is not None and verdict is None:
            self.end(owned)
        if owned is not None:
            self.heartbeat.discard(owned.number)
        told, exhausted = self._tell(trial, state, reason, verdict, usage or {}, alive_until)
        if owned is not None and owned.run is not None and not owned.run.judged:
            owned.run.judged_now(self.now())
        if told and owned is not None:
            self.tally.add(finished=state is not TrialState.FAIL, running=-1)
        else:
            self.tally.forget()
        return told, exhausted

    def _tell(self, trial: Owned | Orphan, state: TrialState, reason: Stop | str | None,
              verdict: Outcome | None, usage: Mapping[str, float],
              alive_until: float | None) -> tuple[bool, bool]:
        """Step 3 of `finish`: the store's word for it."""
        if isinstance(trial, Orphan):
            return self.store.fail_orphan(trial, alive_until), False
        asked, lease, run = trial.asked, trial.lease, trial.run
        if verdict is not None:
            assert run is not None
            return self.store.tell_verdict(run.trial, verdict, run.device, run.attempt, usage,
                                           run.devices)
        if state is not TrialState.FAIL:
            return self.store.tell(asked.trial, state, None, {})
        if isinstance(reason, Stop):  # where it ran, or waited
            gpu = run.device if run is not None else None if lease is None else lease.device
            return self.store.tell_failed(asked.trial, reason.value, gpu, asked.attempt), False
        return self.store.tell_failed(asked.trial, str(reason)), False
