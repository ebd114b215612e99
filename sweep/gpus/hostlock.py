"""Device slots shared by every sweep on one host: one `flock`ed file per slot.

A device with `capacity` slots has the files `<key>.0.lock` ... `<key>.<capacity-1>.lock` in
`<lock dir>/<host>/`; a driver holds a slot while it holds the lock. The kernel drops the lock
when the driver's process ends, even by SIGKILL, so a dead sweep frees its devices at once,
and the lock is taken before the trial's processes exist (NVML could not show them yet).
The lock dir is `$SWEEP_LOCK_DIR`, else `/tmp/sweep-locks`, shared by every user: its folders
are sticky (mode 1777), a lock file another user created is locked through a read-only
descriptor, and nothing another user put there is trusted: no symbolic link is followed, a
folder writable by others without the sticky bit is refused, and each lock file is checked
after opening (a regular file, no other hard links). A refusal is a `safefs.UnsafePath`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from pathlib import Path

from sweep._core import (
    DIR_FLAGS,
    SweepError,
    UnsafePath,
    UsageError,
    file_problem,
    shared_folder_problem,
)

LOCK_DIR_ENV = "SWEEP_LOCK_DIR"
DEFAULT_DIR = Path("/tmp/sweep-locks")
SHARED_MODE = 0o1777


def usable_lock_dir(host: str) -> Path:
    """`lock_dir(host)`, or a UsageError in one line saying what is wrong with it (for a run
    or `sweep gpus` before it touches anything)."""
    try:
        return lock_dir(host)
    except OSError as e:
        raise UsageError(f"the host's lock folder: {e}") from None


def lock_dir(host: str) -> Path:
    """The folder of this host's slot files, created world-writable and sticky if missing.
    UnsafePath if it, or the lock dir, is a symbolic link or may be changed by anyone, or a
    lock file in it is a symbolic link or not a regular file (planted there)."""
    base = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_DIR)
    folder = base / re.sub(r"[^A-Za-z0-9._-]", "_", host)
    if not os.path.lexists(base):
        base.parent.mkdir(parents=True, exist_ok=True)
        _make_shared(base, None)
    top = _open_shared(base, None, fix=True)
    try:
        _make_shared(folder, top)
        fd = _open_shared(folder, top, fix=True)
        try:
            _check_lock_files(folder, fd)
        finally:
            os.close(fd)
    finally:
        os.close(top)
    return folder


LOCK_SUFFIXES = (".lock", ".mutex")


def _check_lock_files(folder: Path, fd: int) -> None:
    """LockFileError for the first lock file (`*.lock`, `*.mutex`) of the folder open as
    `fd` that is a symbolic link or not a regular file: no sweep could take that slot."""
    with os.scandir(fd) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.name.endswith(LOCK_SUFFIXES):
                continue
            if entry.is_symlink():
                raise _refused(folder / entry.name, "is a symbolic link")
            if not entry.is_file(follow_symlinks=False):
                raise _refused(folder / entry.name, "is not a regular file")


def _make_shared(path: Path, parent_fd: int | None) -> None:
    """Create the shared folder `path` (in `parent_fd`, if given) with mode 1777, unless
    something is there already."""
    name: str | Path = path.name if parent_fd is not None else path
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        os.fchmod(fd, SHARED_MODE)  # after the umask, and never through a link
    finally:
        os.close(fd)


class LockFileError(UnsafePath, SweepError):
    """A lock folder or lock file sweep will not use: an `UnsafePath` that is said in one
    line, as a `SweepError` is."""


def _refused(path: Path, why: str) -> LockFileError:
    return LockFileError(path, f"{why}: remove it, or set ${LOCK_DIR_ENV} to a folder of "
                         "your own")


def _open_shared(path: Path, parent_fd: int | None, fix: bool = False) -> int:
    """A descriptor of the shared folder `path` (opened in `parent_fd`, if given), checked:
    UnsafePath if it is a link, not a folder, or writable by others without the sticky
    bit (with `fix`, a folder of this user's own is made sticky instead)."""
    name: str | Path = path.name if parent_fd is not None else path
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(path, "is a symbolic link or not a folder") from None
        raise
    st = os.fstat(fd)
    problem = shared_folder_problem(st)
    if problem and fix and st.st_uid == os.geteuid():
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)
        problem = None
    if problem:
        os.close(fd)
        raise _refused(path, problem)
    return fd


MUTEX_WAIT = 2.0  # s a sweep waits for another's `take` of the same device


def open_lock(path: Path) -> int:
    """A descriptor to flock `path` with, creating it; another user's lock file (mode 0644)
    is opened read-only, which locks as well. No symbolic link is followed (the file's, its
    folder's or the folder above); UnsafePath if what was opened is not a regular file of
    one link, or a folder may be changed by anyone."""
    top = _open_shared(path.parent.parent, None)
    try:
        folder = _open_shared(path.parent, top)
    finally:
        os.close(top)
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO would block a read-only open
    try:
        try:
            fd = os.open(path.name, os.O_RDWR | os.O_CREAT | flags, 0o644, dir_fd=folder)
        except PermissionError:
            fd = os.open(path.name, os.O_RDONLY | flags, dir_fd=folder)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise _refused(path, "is not a regular file (a symbolic link?)") from None
        raise
    finally:
        os.close(folder)
    problem = file_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise _refused(path, problem)
    return fd


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
