"""One writer per lineage folder: an exclusive `flock` on `checkpoints/.<origin>.lock`, beside
the lineage's checkpoint folder (not in it: a script may take anything there for a checkpoint).

The driver takes it before it prepares an attempt's folder and hands it to the attempt's guard,
which holds it (it is not passed on to the command) until the attempt's whole tree is gone; the
driver's own copy is closed once the guard has it. So the lock is free exactly when no guard of
the lineage lives: an attempt whose lineage's lock is held is not started, and a dead driver's
trial is not told FAIL and continued while the lock is held. The lock goes with the processes
that hold it, whatever ends them (a kill -9 too): nothing is left to clean up, and the lock file
is never removed (sweep removes nothing for it).

On a shared file system the lock holds across hosts where the file system carries `flock`
(NFS emulates it with a whole-file byte-range lock, so the file is opened for writing; a mount
with `local_lock=flock` or `nolock` keeps locks to its host). A file system that cannot lock at
all (`Unsupported`: no lock daemon) is said, and the attempt starts unlocked.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from sweep._core import UnsafePath, file_problem
from sweep.trial.lineage import CHECKPOINTS, make_checkpoints

FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
CANNOT_LOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})


class Unsupported(Exception):
    """The file system of `path` cannot lock (`flock` fails with ENOLCK or EOPNOTSUPP)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(path, why)
        self.path, self.why = path, why

    def __str__(self) -> str:
        return f"cannot lock {self.path}: {self.why}"


class LineageBusy(Exception):
    """An attempt not started: another process holds its lineage's lock (an earlier attempt's
    guard, still ending; a frozen driver's trainer, on this host or another). `keeps_device`:
    whether it waits on its devices (a wait the run itself ends soon) or gives them back (a
    wait on another process, however long)."""

    keeps_device = False

    def __init__(self, origin: int, path: Path) -> None:
        super().__init__(origin, path)
        self.origin, self.path = origin, path

    def __str__(self) -> str:
        return (f"its lineage's checkpoint folder is still in use (the lock {self.path} is "
                "held: an earlier attempt's processes are still ending)")


def lock_path(output_dir: Path, origin: int) -> Path:
    """The lock file of lineage `origin`: `<output_dir>/checkpoints/.<origin>.lock`."""
    return output_dir / CHECKPOINTS / f".{origin}.lock"


def take(output_dir: Path, origin: int) -> int | None:
    """The lineage's lock, taken: its descriptor (the caller closes it, or hands it to a guard
    first); None if another process holds it. `checkpoints/` and the lock file are made if
    they are not there (never through a link). OSError if that cannot be done; Unsupported
    if the file system cannot lock."""
    make_checkpoints(output_dir)
    return _lock(lock_path(output_dir, origin), create=True)


def busy(output_dir: Path, origin: int) -> bool:
    """Whether a process holds the lineage's lock now (creates nothing; a lock file that is not
    there, or cannot be opened, is not held)."""
    try:
        fd = _lock(lock_path(output_dir, origin), create=False)
    except (OSError, Unsupported):
        return False
    if fd is None:
        return True
    os.close(fd)
    return False


def _lock(path: Path, create: bool) -> int | None:
    fd = os.open(path, FLAGS | (os.O_CREAT if create else 0), 0o600)
    try:
        problem = file_problem(os.fstat(fd))
        if problem:
            raise UnsafePath(path, problem)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as e:
        os.close(fd)
        if e.errno in CANNOT_LOCK:
            raise Unsupported(path, e.strerror or str(e)) from e
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd
