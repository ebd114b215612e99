"""Who runs a trial: the driver process on record in its `owner` user attribute, whether it still
runs, and what a trial found without a live driver (an `Orphan`) carries.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from sweep.study.attrs import Owner

HOST_ENV = "SWEEP_HOST"


def host_name() -> str:
    """The host a driver records and judges ownership by: `$SWEEP_HOST`, else the hostname
    (containers that share one; tests that simulate several hosts on one machine)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


class BeatWatch:
    """What one driver has seen of its study's `beat` attributes (storages without Optuna's
    heartbeats), on its own clock: a trial is silent once its beat has not changed for
    `after` s of that clock (no clocks of two hosts compared)."""

    def __init__(self, after: float, clock: Callable[[], float]) -> None:
        self.after, self.clock = after, clock
        self._beats: dict[int, tuple[Any, float]] = {}  # trial id -> (beat seen, since when)
        self._first_seen: dict[int, float] = {}  # trial id -> when this driver first saw it

    def silent(self, key: int, beat: Any) -> bool:
        """Whether trial `key`'s beat, now `beat`, has not changed for `after` s."""
        now = self.clock()
        self._first_seen.setdefault(key, now)
        last = self._beats.get(key)
        if last is None or last[0] != beat:
            self._beats[key] = (beat, now)
            return False
        return now - last[1] >= self.after

    def silence_left(self, key: int) -> float:
        """Seconds until trial `key`'s beat, unchanged, makes it silent (0: unseen)."""
        seen = self._beats.get(key)
        return max(0.0, self.after - (self.clock() - seen[1])) if seen else 0.0

    def first_look_left(self, key: int) -> float | None:
        """Seconds until this driver has watched trial `key`'s beat for `after` s since it
        first saw it (None: it has, and the trial beats)."""
        first = self._first_seen.get(key)
        if first is None or self.clock() - first >= self.after:
            return None
        return self.silence_left(key)

    def keep(self, keys: set[int]) -> None:
        """Forget the trials not in `keys` (no longer running)."""
        self._beats = {k: v for k, v in self._beats.items() if k in keys}
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in keys}


@dataclass(frozen=True)
class Orphan:
    """A RUNNING trial whose driver is gone."""

    trial: optuna.trial.FrozenTrial
    reason: str
    trial_dir: str | None  # set when its driver ran on this host: leftovers may be killed


@dataclass(frozen=True)
class Sighting:
    """What a driver knows of another driver's RUNNING trial as it looks for orphans."""

    owner: Owner | None  # as recorded (None: its driver died before recording itself)
    alive: bool | None  # whether that owner runs, where it is on this host (None: elsewhere)
    stale: bool  # silent past the grace: Optuna's heartbeat, or its `beat` as this driver saw
    heartbeats: bool  # the storage has Optuna's heartbeats (a database)
    age: float | None = None  # seconds since it started, by the wall clock (databases)
    silence_left: float = 0.0  # seconds until its `beat` unchanged makes it silent
    first_look_left: float | None = None  # seconds until this driver has watched it enough


@dataclass(frozen=True)
class Judged:
    """An orphan's `reason`, or in how many seconds (`wait`) it may become one; neither: it
    is not one, and there is nothing to wait for."""

    reason: str | None = None
    wait: float | None = None


def judge(look: Sighting, reclaim_after: float) -> Judged:
    """Whether a RUNNING trial's driver is gone:

    - on this host: the recorded driver no longer runs (a live one is never overruled, even
      when its heartbeats are late);
    - elsewhere: silent past the grace (`stale`); without Optuna's heartbeats, a driver that
      has not yet watched a trial's `beat` for `reclaim_after` waits that long first;
    - no owner on record (the driver died between Optuna's ask and the owner record): started
      `reclaim_after` ago on a database; silent that long elsewhere.
    """
    owner = look.owner
    if owner is not None and look.alive is not None:
        return Judged() if look.alive else Judged(f"driver died (pid {owner.pid} on {owner.host})")
    if owner is not None:
        if look.stale:
            return Judged(f"driver on {owner.host} died (no heartbeat)")
        return Judged(wait=None if look.heartbeats else look.first_look_left)
    if look.stale:
        return Judged("driver died before recording itself (no owner, no heartbeat for "
                      f"{reclaim_after:.0f} s)")
    if not look.heartbeats:
        return Judged(wait=look.silence_left)
    if look.age is None:
        return Judged()
    if look.age < reclaim_after:
        return Judged(wait=reclaim_after - look.age)
    return Judged(f"driver died before recording itself (no owner after {look.age:.0f} s)")
