"""Files and folders sweep writes, opened so that no one else can make it write elsewhere.

A symbolic link is never followed at the last step (`O_NOFOLLOW`); what was opened is checked
after opening (`fstat`: a regular file, not a hard link to another); a folder sweep writes its
own files in belongs to this user and is not writable by every user. A refusal is an
`UnsafePath`, an `OSError` whose text names the path and says why.

Removing what sweep made is `removal`; files written for the user (a report, a CSV), only
over those sweep wrote, are `userfiles`.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import tempfile
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafePath(OSError):
    """A path sweep will not write through: `path`, and `why` not."""

    def __init__(self, path: str | Path, why: str) -> None:
        super().__init__(errno.EPERM, why, str(path))
        self.path, self.why = str(path), why

    def __str__(self) -> str:
        return f"{self.path} {self.why}"


def user_name(uid: int) -> str:
    """The login name of `uid` (or `uid N` when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def own_folder_problem(st: os.stat_result) -> str | None:
    """Why a folder (its `lstat`) is not one to write this user's files in; None if it is."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    me = os.geteuid()
    if st.st_uid != me:
        return (f"is owned by {user_name(st.st_uid)}, not by {user_name(me)} who runs sweep "
                "(its owner could plant links there that sweep would write through)")
    if st.st_mode & stat.S_IWOTH:
        return (f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): anyone could "
                "plant links there that sweep would write through")
    return None


def shared_folder_problem(st: os.stat_result) -> str | None:
    """Why a folder every user shares (the host's lock folder) cannot be trusted; None if it
    can: a real folder, and, if others may write in it, sticky (no one removes or replaces
    another's files)."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"is owned by {user_name(st.st_uid)} and writable by others without the "
                f"sticky bit (mode {stat.S_IMODE(st.st_mode):o}): anyone could replace its "
                "lock files")
    return None


def file_problem(st: os.stat_result) -> str | None:
    """Why an opened file (its `fstat`) is not one to write or lock; None if it is one."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink > 1:
        return "has other hard links (it may be someone else's file)"
    return None


def own_file_problem(st: os.stat_result) -> str | None:
    """`file_problem`, or that the file (its `fstat`) is not this user's; None if neither."""
    return file_problem(st) or (None if st.st_uid == os.geteuid() else
                                f"is owned by {user_name(st.st_uid)}")


def named(e: OSError, path: str | Path) -> OSError:
    """`e` as an OSError that names `path` (a write error names none)."""
    if isinstance(e, UnsafePath):
        return e
    if e.errno == errno.ELOOP:
        return UnsafePath(path, "is a symbolic link")
    if e.errno == errno.ENXIO:
        return UnsafePath(path, "is a FIFO or socket, not a regular file")
    return OSError(e.errno, e.strerror or str(e), str(path))


def make_own_folder(path: Path, mode: int = 0o700) -> None:
    """Create `path` (its parent exists) with `mode`, or check the one there: this user's real
    folder, not writable by every user. UnsafePath (or the OSError, naming it) if not."""
    try:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
        problem = own_folder_problem(os.lstat(path))
    except OSError as e:
        raise named(e, path) from e
    if problem:
        raise UnsafePath(path, problem)


def check_output_dir(path: Path) -> None:
    """`path` (an existing folder) and the folders above it can be trusted with trial files:
    `path` is this user's and not writable by all, and no folder above it is writable by all
    without the sticky bit (where anyone could replace `path`)."""
    try:
        link = os.lstat(path)
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
            raise UnsafePath(path, f"is a symbolic link made by {user_name(link.st_uid)}")
        problem = own_folder_problem(os.stat(path))
        if problem:
            raise UnsafePath(path, problem)
        for above in Path(os.path.realpath(path)).parents:
            st = os.stat(above)
            if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
                raise UnsafePath(path, f"is inside {above}, writable by every user without "
                                 "the sticky bit: anyone could replace it")
    except OSError as e:
        raise named(e, path) from e


def open_for_writing(path: Path, mode: int = 0o600) -> int:
    """A descriptor writing `path` from its start (created with `mode`, or emptied): never
    through a symbolic link, never a file that is not this user's plain file (checked before
    it is emptied). An OSError names `path`."""
    try:
        fd = os.open(path, WRITE_FLAGS, mode)
    except OSError as e:
        raise named(e, path) from e
    try:
        problem = own_file_problem(os.fstat(fd))
        if problem:
            raise UnsafePath(path, problem)
        os.ftruncate(fd, 0)
        os.fchmod(fd, mode)
        os.set_blocking(fd, True)
    except OSError as e:
        os.close(fd)
        raise named(e, path) from e
    return fd


def write_file(path: Path, text: str, mode: int = 0o600) -> None:
    """`path` holds `text` and has `mode` (see `open_for_writing`). An OSError names `path`."""
    fd = open_for_writing(path, mode)
    try:
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(text)
    except OSError as e:
        raise named(e, path) from e
    finally:
        os.close(fd)


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """`path` holds `text`, written whole to a new file beside it that then takes its name
    (a reader never sees half of it); an existing `path` is replaced only if it is a plain
    file (never a link, a folder, a device or a FIFO: UnsafePath). An OSError names `path`."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise named(e, path) from e
    if st is not None:
        problem = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else file_problem(st))
        if problem:
            raise UnsafePath(path, f"{problem}: give the name of a new or plain file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    except OSError as e:
        raise named(e, path) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise named(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
