"""Who runs a trial: the driver process on record in its `owner` user attribute, whether it still
runs, and what a trial found without a live driver (an `Orphan`) carries.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import optuna

from sweep.study.attrs import Owner

HOST_ENV = "SWEEP_HOST"


def host_name() -> str:
    """The host a driver records and judges ownership by: `$SWEEP_HOST`, else the hostname
    (containers that share one; tests that simulate several hosts on one machine)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


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
