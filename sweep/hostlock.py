"""Device slots shared by every sweep on one host: one `flock`ed file per slot.

A device with `capacity` slots has the files `<key>.0.lock` ... `<key>.<capacity-1>.lock` in
`<lock dir>/<host>/`; a driver holds a slot while it holds the lock. The kernel drops the lock
when the driver's process ends, even by SIGKILL, so a dead sweep frees its devices at once,
and the lock is taken before the trial's processes exist (NVML could not show them yet).
The lock dir is `$SWEEP_LOCK_DIR`, else `/tmp/sweep-locks` (shared by every user: a lock file
another user created is locked through a read-only descriptor).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

LOCK_DIR_ENV = "SWEEP_LOCK_DIR"
DEFAULT_DIR = Path("/tmp/sweep-locks")


def lock_dir(host: str) -> Path:
    """The folder of this host's slot files, created world-writable (sticky) if missing."""
    base = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_DIR)
    folder = base / re.sub(r"[^A-Za-z0-9._-]", "_", host)
    for path in (base, folder):
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            try:
                path.chmod(0o1777)
            except OSError:
                pass
    return folder


class Slot:
    """A held slot; `release()` (or the process's end) frees it."""

    def __init__(self, fd: int, key: str) -> None:
        self.fd, self.key = fd, key

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HostSlots:
    """`capacity` slots per device key, shared with every other sweep of this host."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder, self.capacity = folder, capacity

    def _open(self, key: str, slot: int) -> int:
        path = self.folder / f"{key}.{slot}.lock"
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:  # another user's lock file: a read-only descriptor locks too
            return os.open(path, os.O_RDONLY)

    def take(self, key: str) -> Slot | None:
        """A free slot of device `key`, now held; None when every slot is held."""
        for slot in range(self.capacity):
            fd = self._open(key, slot)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return Slot(fd, key)
        return None

    def held(self, key: str) -> int:
        """How many slots of `key` are held now, by any sweep of this host (this one too).

        It probes each free slot by taking it for an instant: another sweep's `take` in that
        instant finds it held and tries again at its next look (half a second later)."""
        taken = 0
        for slot in range(self.capacity):
            fd = self._open(key, slot)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                taken += 1
            finally:
                os.close(fd)  # closing drops a lock taken here
        return taken


def held_slots(folder: Path, key: str) -> int:
    """How many slots of device `key` the sweeps of this host hold now, whatever their
    `trials_per_gpu` (for `sweep gpus`)."""
    slots = len(list(folder.glob(f"{glob_escape(key)}.*.lock")))
    return HostSlots(folder, slots).held(key) if slots else 0


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


PORTS = range(29600, 30600)  # for torch.distributed's rendezvous of multi-GPU trials


def take_port(folder: Path, ports: range = PORTS) -> tuple[int, Slot] | None:
    """A TCP port no trial of this host's sweeps holds and nothing listens on, now held
    (`port.<n>.lock`) until the slot is released or its holders end; None if none is free.

    Something outside sweep may still bind it before the trial does: the window is the
    trial's start-up."""
    import socket

    for port in ports:
        fd = os.open(folder / f"port.{port}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                os.close(fd)
                continue
        return port, Slot(fd, f"port {port}")
    return None
