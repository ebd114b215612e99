"""The typed owner record of a trial (`Owner`: the driver that runs it; `OwnerRecord`: that
driver, the trial's device(s) and folder), written and read only through `OwnerRecord.to_attr`
/ `OwnerRecord.of` and `Owner.of`, and the documented columns of where a trial ran (`place`).
The attributes' names and the record's keys: `sweep._core.names`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from sweep._core import (
    ATTEMPT,
    DIR,
    DRIVER_PID,
    DRIVER_STARTED,
    GPU,
    GPUS,
    HOST,
    OWNER,
    PID,
    STARTED,
)


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
        if isinstance(rec, dict) and HOST in rec and PID in rec:
            return cls(str(rec[HOST]), int(rec[PID]), float(rec.get(STARTED) or 0))
        if HOST in attrs and DRIVER_PID in attrs:
            return cls(str(attrs[HOST]), int(attrs[DRIVER_PID]),
                       float(attrs.get(DRIVER_STARTED) or 0))
        return None

    def alive(self) -> bool:
        """Whether this driver process still runs (on this host)."""
        try:
            proc = psutil.Process(self.pid)
            return not self.started or abs(proc.create_time() - self.started) < 1.0
        except psutil.Error:
            return False


@dataclass(frozen=True)
class OwnerRecord:
    """What a trial's OWNER attribute holds: the driver that runs it, its device(s), its folder."""

    owner: Owner
    gpu: int | None = None
    dir: str | None = None  # the trial's folder, as its driver made it
    gpus: str | None = None  # a trial of several devices: all of them, "0,1"

    def to_attr(self) -> dict[str, Any]:
        """The OWNER attribute's value."""
        record: dict[str, Any] = {HOST: self.owner.host, PID: self.owner.pid,
                                  STARTED: self.owner.started, GPU: self.gpu, DIR: self.dir}
        if self.gpus:
            record[GPUS] = self.gpus
        return record

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> OwnerRecord | None:
        """The record in a trial's user attributes; None where no owner is recorded."""
        owner = Owner.of(attrs)
        if owner is None:
            return None
        rec = attrs.get(OWNER)
        rec = rec if isinstance(rec, dict) else {}
        gpu, folder, gpus = rec.get(GPU), rec.get(DIR), rec.get(GPUS)
        return cls(owner, None if gpu is None else int(gpu),
                   None if folder is None else str(folder), None if gpus is None else str(gpus))


def devices_shown(gpus: Sequence[int]) -> str | None:
    """A trial's devices as stored (`gpus` attribute, the owner record's key): "0,1" for a
    trial of several, None for one."""
    return ",".join(map(str, gpus)) if len(gpus) > 1 else None


def place(gpu: int, host: str, attempt: int, gpus: Sequence[int] = ()) -> dict[str, Any]:
    """The documented columns of where a trial ran: `gpu`, `host`, `attempt`, and `gpus`
    for a trial of several devices (`devices_shown`)."""
    where: dict[str, Any] = {GPU: gpu, HOST: host, ATTEMPT: attempt}
    shown = devices_shown(gpus)
    if shown is not None:
        where[GPUS] = shown
    return where
