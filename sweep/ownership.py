"""Who runs a trial: the driver process on record in its `owner` user attribute, whether it still
runs, and what a trial found without a live driver (an `Orphan`) carries.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
import psutil

OWNER = "owner"  # the trial's user attribute: {"host", "pid", "started", "gpu", "dir"}

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


@dataclass(frozen=True)
class Orphan:
    """A RUNNING trial whose driver is gone."""

    trial: optuna.trial.FrozenTrial
    reason: str
    trial_dir: str | None  # set when its driver ran on this host: leftovers may be killed
