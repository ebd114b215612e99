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
import time
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


MUTEX_WAIT = 2.0  # s a sweep waits for another's `take` of the same device


def open_lock(path: Path) -> int:
    """A descriptor to flock `path` with, creating it; another user's lock file (mode 0644)
    is opened read-only, which locks as well."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


def _lock_within(fd: int, seconds: float) -> bool:
    """Take an exclusive flock on `fd`, trying for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


class Slot:
    """A held slot; `release()` (or the end of every process holding `fds`) frees it."""

    def __init__(self, fd: int, key: str, extra: tuple[int, ...] = ()) -> None:
        self.fds, self.key = [fd, *extra], key

    @property
    def fd(self) -> int:
        return self.fds[0] if self.fds else -1

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class HostSlots:
    """Slots per device key, shared with every other sweep of this host.

    A device holds at most as many trials as the smallest `capacity` among the sweeps using
    it: each held slot comes with a shared lock on `<key>.cap<capacity>.lock`, which tells
    other sweeps the limit its holder counts on. Taking a slot happens under `<key>.mutex`.
    """

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder, self.capacity = folder, capacity

    def _open(self, name: str) -> int:
        return open_lock(self.folder / name)

    def _busy(self, name: str) -> bool:
        """Whether someone holds a lock on `name` (probed by taking it for an instant)."""
        fd = self._open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken here
        return False

    def _files(self, key: str, kind: str) -> list[tuple[int, str]]:
        """(number, file name) of `key`'s slot files ("slot") or cap markers ("cap")."""
        out = []
        key = file_key(key)
        for path in self.folder.glob(f"{glob_escape(key)}.*.lock"):
            middle = path.name[len(key) + 1:-len(".lock")]
            number = middle.removeprefix("cap") if kind == "cap" else middle
            if number.isdigit() and (kind == "cap") == middle.startswith("cap"):
                out.append((int(number), path.name))
        return sorted(out)

    def take(self, key: str) -> Slot | None:
        """A slot of device `key`, now held; None when the device holds as many trials as
        this sweep's capacity, or another sweep's on it, allows."""
        key = file_key(key)
        mutex = self._open(f"{key}.mutex")
        try:
            if not _lock_within(mutex, MUTEX_WAIT):  # its holder is stopped: look again later
                return None
            held = self.held(key)
            caps = [k for k, name in self._files(key, "cap") if self._busy(name)]
            if held >= min([self.capacity, *caps]):
                return None
            for slot in range(held + self.capacity + 1):
                fd = self._open(f"{key}.{slot}.lock")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                except BaseException:
                    os.close(fd)
                    raise
                try:
                    cap = self._open(f"{key}.cap{self.capacity}.lock")
                except BaseException:
                    os.close(fd)
                    raise
                fcntl.flock(cap, fcntl.LOCK_SH)  # no holder takes it exclusively for long
                return Slot(fd, key, (cap,))
            return None
        finally:
            os.close(mutex)

    def held(self, key: str) -> int:
        """How many slots of `key` are held now, by any sweep of this host (this one too).

        It probes each free slot by taking it for an instant: another sweep's `take` in that
        instant finds it held and tries again at its next look (half a second later)."""
        return sum(self._busy(name) for _, name in self._files(key, "slot"))


def held_slots(folder: Path, key: str) -> int:
    """How many slots of device `key` the sweeps of this host hold now (for `sweep gpus`)."""
    return HostSlots(folder, 1).held(key)


def file_key(key: str) -> str:
    """A device key as it may appear in a file name (old MIG UUIDs hold slashes)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


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
        fd = open_lock(folder / f"port.{port}.lock")
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
