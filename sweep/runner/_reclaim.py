"""Reclaiming the trials of drivers that are gone: what is left of their processes is given its
grace, then each trial is told FAIL and its lineage queued to continue.

Which trials are orphans is `ownership.judge`'s decision (read through `Store.orphans`). An
orphan is told, and its continuation queued, only once nothing of it is left to write its
lineage's folder (`decide`): on this host, no process that runs for its trial folder (`ending`
them: SIGTERM unless its guard lives and already stops them, `trainer.stop_grace`, SIGKILL),
and, on any host, no process holding its lineage's lock (`lineage_lock`: a frozen driver's
trainer on another host sharing the file system). Each is followed on the driver's clock
between its passes, never by blocking it, and told through the driver's one way out
(`trials.Trials.finish`).
"""

from __future__ import annotations

import enum
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from optuna.trial import TrialState

from sweep._core import BEAT
from sweep.gpus import SAMPLES_NAME, last_seen
from sweep.runner._events import Events
from sweep.runner._trials import Trials
from sweep.spec import Spec
from sweep.study import Orphan, Owner, Store
from sweep.trial import GUARD_MARGIN, Lineage, folders, lineage_lock, process

POLL_SECONDS = 0.5  # how often an orphan's processes and lock are looked at while they end


class Next(enum.Enum):
    """What the reclaim of one orphan does now (`decide`)."""

    WAIT = "wait"  # its processes are ending, or its lineage's lock is held: look again
    KILL = "kill"  # its grace is over: SIGKILL what is left of it on this host
    TELL = "tell"  # nothing of it is left: tell it FAIL and queue its continuation


def decide(alive: bool, locked: bool, now: float, kill_at: float | None,
           killed: bool) -> Next:
    """The reclaim's next step for one orphan: `alive`, processes of it run on this host;
    `locked`, its lineage's lock is held; `kill_at`, when its grace ends (None: nothing of it
    to kill here); `killed`, it was SIGKILLed already."""
    if not alive and not locked:
        return Next.TELL
    if alive and not killed and kill_at is not None and now >= kill_at:
        return Next.KILL
    return Next.WAIT


def last_alive(orphan: Orphan, output_dir: Path) -> float | None:
    """An orphan's last sign of life (epoch s), when it stopped holding its devices: the
    later of its `beat` (storages without Optuna's heartbeats) and its dead driver's last GPU
    sample of it (`monitor.last_seen`); None if neither is found."""
    t = orphan.trial
    signs = [float(b) for b in [t.user_attrs.get(BEAT)] if isinstance(b, int | float)]
    owner = Owner.of(t.user_attrs)
    if owner is not None:
        seen = last_seen(folders.driver_dir(output_dir, owner.host, owner.pid) / SAMPLES_NAME,
                         t.number)
        signs += [seen] if seen is not None else []
    return max(signs, default=None)


@dataclass
class Ending:
    """An orphan whose processes, or lineage's lock, are not gone yet."""

    orphan: Orphan
    origin: int  # its lineage's first trial: names its checkpoint folder and lock
    kill_at: float | None  # when what is left of it here is SIGKILLed (None: nothing here)
    killed: bool = False
    said: bool = False


Find = Callable[[str], list[psutil.Process]]  # a trial folder -> the processes that run for it


class Reclaimer:
    """The reclaims of one run, beside the trials this driver owns (`trials`: never orphans;
    their way out is the orphans' too). `find`, `is_guard` and `send` (the processes of a
    trial folder, whether one is its guard, a signal to them) and `locked` (whether a
    lineage's lock is held) are fakes in tests."""

    def __init__(self, spec: Spec, store: Store, events: Events, trials: Trials,
                 find: Find = process.leftovers,
                 is_guard: Callable[[psutil.Process], bool] = process.is_guard,
                 send: Callable[[list[psutil.Process], int], list[int]] = process.signal_all,
                 locked: Callable[[Path, int], bool] = lineage_lock.busy) -> None:
        self.store, self.events = store, events  # what the user is told goes to events
        self.trials = trials
        self.output_dir, self.grace = spec.output_dir, spec.trainer.stop_grace
        self.interval = spec.study.heartbeat_interval  # between looks at the study's trials
        self.find, self.is_guard, self.send, self.locked = find, is_guard, send, locked
        # in how many seconds a trial whose owner is unknown may become an orphan (None: none)
        self.wait: float | None = None
        self.ending: dict[int, Ending] = {}
        self._look_at = -math.inf  # when the study is looked at again for orphans
        self._next = math.inf  # when the endings are looked at again
        self._mine: set[int] = set()  # this driver's own trials, as of the last look

    @property
    def waits(self) -> bool:
        """Whether the run has a reclaim to wait for: a trial that may become an orphan, or one
        whose processes are still ending."""
        return self.wait is not None or bool(self.ending)

    def next_wakeup(self, now: float) -> float:
        """When `look` or `follow` has something to do next (inf: nothing)."""
        return min(self._look_at, self._next if self.ending else math.inf)

    def look(self, now: float) -> bool:
        """When due (every heartbeat_interval, sooner where a trial may become an orphan
        before), reclaim the trials of drivers that are gone: each is told FAIL, and queued
        again, at once if nothing of it is left, else once it ended (`follow`). True if it
        looked (the study's trials were read)."""
        if now < self._look_at:
            return False
        self._reclaim(now)
        self._look_at = now + min(self.interval, math.inf if self.wait is None else self.wait)
        return True

    def _reclaim(self, now: float) -> None:
        mine = self._mine = self.trials.numbers()
        orphans, self.wait = self.store.orphans(mine | set(self.ending))
        for orphan in orphans:
            procs = self.find(orphan.trial_dir) if orphan.trial_dir else []
            guarded = any(self.is_guard(p) for p in procs)
            if procs and not guarded:  # no guard of it lives to stop them: stop them here
                self.send(procs, signal.SIGTERM)
            kill_at = now + self.grace + (GUARD_MARGIN if guarded else 0.0) if procs else None
            ending = Ending(orphan, Lineage.of(orphan.trial.user_attrs, orphan.trial.number)
                            .origin, kill_at)
            self.ending[orphan.trial.number] = ending
            self._step(ending, now, procs)
        if self.ending and self._next == math.inf:  # the ones already ending keep their pace
            self._next = now + POLL_SECONDS

    def follow(self, now: float) -> None:
        """Look again, when due, at the orphans whose processes were ending."""
        if not self.ending or now < self._next:
            return
        still: set[int] | None = None  # the endings still orphans: looked at before a tell
        for ending in list(self.ending.values()):
            trial_dir = ending.orphan.trial_dir
            procs = self.find(trial_dir) if trial_dir else []
            if decide(bool(procs), self._held(ending.origin), now,
                      ending.kill_at, ending.killed) is Next.TELL:
                if still is None:  # a driver frozen past reclaim_after may beat again
                    still = {o.trial.number for o in self.store.orphans(self._mine)[0]}
                if ending.orphan.trial.number not in still:
                    del self.ending[ending.orphan.trial.number]
                    self.events.message(f"trial {ending.orphan.trial.number}: its driver is "
                                        "back (or it was told): not reclaimed")
                    continue
            self._step(ending, now, procs)
        self._next = now + POLL_SECONDS if self.ending else math.inf

    def _held(self, origin: int) -> bool:
        """Whether lineage `origin`'s lock is held by another than this driver's own attempt
        of it (a continuation this driver started once the orphan's guard had ended)."""
        return self.locked(self.output_dir, origin) and not self.trials.runs_lineage(origin)

    def _step(self, ending: Ending, now: float, procs: list[psutil.Process]) -> None:
        orphan = ending.orphan
        locked = self._held(ending.origin)
        step = decide(bool(procs), locked, now, ending.kill_at, ending.killed)
        if step is Next.KILL:
            self.send(procs, signal.SIGKILL)
            ending.killed = True
        if step is not Next.TELL:
            if not ending.said:
                ending.said = True
                why = (f"its processes get trainer.stop_grace ({self.grace:g} s) to end"
                       if procs else "its lineage's checkpoint folder is still in use "
                       f"({lineage_lock.lock_path(self.output_dir, ending.origin)} is held)")
                self.events.message(f"trial {orphan.trial.number}: {orphan.reason}; {why}, "
                                    "then it is told FAIL and continued")
            return
        del self.ending[orphan.trial.number]
        told, _ = self.trials.finish(orphan, TrialState.FAIL, orphan.reason,
                                     alive_until=last_alive(orphan, self.output_dir))
        if told:
            self.events.message(
                f"trial {orphan.trial.number}: {orphan.reason}; told FAIL, queued again")
