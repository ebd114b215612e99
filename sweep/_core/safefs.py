"""Files and folders sweep writes, opened so that no one else can make it write elsewhere.

A symbolic link is never followed at the last step (`O_NOFOLLOW`); what was opened is checked
after opening (`fstat`: a regular file, not a hard link to another); a folder sweep writes its
own files in belongs to this user and is not writable by every user. A refusal is an
`UnsafePath`, an `OSError` whose text names the path and says why.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MOUNTINFO = Path("/proc/self/mountinfo")  # the mounts of this process, as the kernel lists them


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


def _named(e: OSError, path: str | Path) -> OSError:
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
        raise _named(e, path) from e
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
        raise _named(e, path) from e


def open_for_writing(path: Path, mode: int = 0o600) -> int:
    """A descriptor writing `path` from its start (created with `mode`, or emptied): never
    through a symbolic link, never a file that is not this user's plain file (checked before
    it is emptied). An OSError names `path`."""
    try:
        fd = os.open(path, WRITE_FLAGS, mode)
    except OSError as e:
        raise _named(e, path) from e
    try:
        problem = own_file_problem(os.fstat(fd))
        if problem:
            raise UnsafePath(path, problem)
        os.ftruncate(fd, 0)
        os.fchmod(fd, mode)
        os.set_blocking(fd, True)
    except OSError as e:
        os.close(fd)
        raise _named(e, path) from e
    return fd


def write_file(path: Path, text: str, mode: int = 0o600) -> None:
    """`path` holds `text` and has `mode` (see `open_for_writing`). An OSError names `path`."""
    fd = open_for_writing(path, mode)
    try:
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(text)
    except OSError as e:
        raise _named(e, path) from e
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
        raise _named(e, path) from e
    if st is not None:
        problem = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else file_problem(st))
        if problem:
            raise UnsafePath(path, f"{problem}: give the name of a new or plain file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    except OSError as e:
        raise _named(e, path) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _named(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MARKER = "study.json"  # what marks a folder as a study's output_dir (see sweep.trial.folders)


def remove_tree(path: Path, made: bool) -> None:
    """Remove `path`, a folder sweep made, with all that is in it; nothing if it is not there.

    It is removed only if `removable` says so; else UnsafePath, naming the path and why, and
    nothing is removed. Links inside are removed, never followed. A file system or a folder
    mounted in it after that check is still never crossed: each folder is opened (never
    through a link) and its mount (`mount_id`) compared with that of the folder `path` lies
    in before anything in it is removed; where they differ, UnsafePath, and nothing in that
    folder or under it is removed (what was removed of the rest stays removed)."""
    if not removable(path, made):
        return
    try:
        parent = os.open(path.parent, DIR_FLAGS)
    except OSError as e:
        raise _named(e, path) from e
    try:
        _remove_in(parent, path.name, path, path, _mount_of(parent))
    except OSError as e:
        raise _named(e, path) from e
    finally:
        os.close(parent)


def mount_id(fd: int) -> int | None:
    """The id of the mount the file open as `fd` lies on (`mnt_id:` of
    `/proc/self/fdinfo/<fd>`, Linux 3.15 on; a bind mount has its own); None where the
    kernel does not say."""
    try:
        info = Path(f"/proc/self/fdinfo/{fd}").read_text(encoding="ascii")
    except (OSError, ValueError):
        return None
    found = re.search(r"^mnt_id:\s*(\d+)$", info, re.MULTILINE | re.ASCII)
    return int(found[1]) if found else None


def _mount_of(fd: int) -> tuple[int | None, int]:
    """What says which mount the folder open as `fd` is on: its mount id, and its device
    number (compared where the kernel gives no mount id)."""
    return mount_id(fd), os.fstat(fd).st_dev


def _remove_in(parent: int, name: str, top: Path, path: Path,
               mount: tuple[int | None, int]) -> None:
    """Remove the folder `name` in the folder open as `parent` (at `path`, inside `top`, the
    folder `remove_tree` removes) with all in it, each folder first checked to be on `mount`
    (UnsafePath naming `top` if not)."""
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        here = _mount_of(fd)
        if (here[0] != mount[0] if None not in (here[0], mount[0]) else here[1] != mount[1]):
            where = ("is where a file system or a folder is mounted" if path == top else
                     f"holds {path}, where a file system or a folder is mounted")
            raise UnsafePath(top, f"{where}: unmount it first")
        with os.scandir(fd) as entries:
            names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for entry, is_dir in names:
            if is_dir:
                _remove_in(fd, entry, top, path / entry, mount)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def removable(path: Path, made: bool) -> bool:
    """Whether `path` may be removed whole: False if it is not there; True if it is this
    user's real folder (not a symbolic link, not a file) that sweep made (`made`: the caller
    knows it by sweep's own marker, never by what the folder holds; else only an empty
    folder is), neither it nor any folder inside it is a mount point (as the kernel lists
    them, `mounts_at_or_under`: a bind mount of a folder of the same file system is one;
    where the kernel's list cannot be read, a folder on another file system), and none holds
    a `study.json` (another study's output_dir); else UnsafePath, naming the path and why."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _named(e, path) from e
    problem = own_folder_problem(st)
    if problem:
        raise UnsafePath(path, problem)
    mounted = mounts_at_or_under(path)
    if mounted:
        where = ("is where a file system or a folder is mounted" if mounted[0] == "." else
                 f"holds {path / mounted[0]}, where a file system or a folder is mounted")
        raise UnsafePath(path, f"{where}: unmount it first")
    try:
        if os.lstat(path.parent).st_dev != st.st_dev:
            raise UnsafePath(path, "is where another file system is mounted")
        for folder, _, files, fd in os.fwalk(path, follow_symlinks=False):
            if folder == str(path) and not made and os.listdir(fd):
                raise UnsafePath(path, "holds files sweep did not put there: move or "
                                 "remove it, or give the study another output_dir")
            if os.fstat(fd).st_dev != st.st_dev:
                raise UnsafePath(path, f"holds {folder}, another file system mounted there")
            if MARKER in files and _names_a_study(MARKER, fd):
                raise UnsafePath(path, f"holds {Path(folder) / MARKER}, another study's "
                                 "output_dir")
    except OSError as e:
        raise _named(e, path) from e
    return True


def mount_points() -> list[str] | None:
    """Every mount point of this process, as absolute paths, from `/proc/self/mountinfo`
    (its fifth field, the kernel's octal escapes undone): bind mounts included, which share
    their file system's device number; None where that list cannot be read (not Linux)."""
    try:
        raw = MOUNTINFO.read_bytes()
    except OSError:
        return None
    points = []
    for line in raw.splitlines():
        fields = line.split(b" ")
        if len(fields) > 4:
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            points.append(os.fsdecode(point))
    return points


def mounts_at_or_under(path: Path) -> list[str]:
    """The mount points at `path` or inside it, each relative to it (`.` for `path` itself),
    sorted: `path`'s real path is compared with `mount_points`; [] where none are (or the
    kernel's list cannot be read)."""
    points = mount_points()
    if not points:
        return []
    real = os.path.realpath(path)
    inside = real.rstrip(os.sep) + os.sep
    return sorted({"." if p == real else p[len(inside):] for p in points
                   if p == real or p.startswith(inside)})


def _names_a_study(name: str, fd: int) -> bool:
    """Whether the file `name` in the folder open as `fd` is a study's marker (a JSON object
    naming a study and its storage), not a file a trainer happened to call so."""
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return False
    try:
        data = json.loads(os.read(handle, 1 << 16))
    except (OSError, ValueError):
        return False
    finally:
        os.close(handle)
    return isinstance(data, dict) and "study" in data and "storage" in data


# ---- files written for the user (a report, a CSV) -----------------------------------------


def output_mark(path: Path) -> Path:
    """The file beside a file sweep wrote for the user that proves it did: `.<name>.sweep`,
    holding the SHA-256 of what sweep wrote (one a line: while sweep writes, the one before
    and the one being written; see `replace_output`)."""
    return path.with_name(f".{path.name}.sweep")


DIGEST = 64  # characters of a SHA-256 in hex


def _digests(raw: bytes | None) -> set[bytes]:
    """The whole SHA-256 digests a mark holds (a line cut short by a crash is none)."""
    return {line for line in (raw or b"").split(b"\n") if len(line) == DIGEST}


def wrote(path: Path) -> bool:
    """Whether `path` holds exactly what sweep wrote there (`replace_output`): a plain file
    whose content's SHA-256 its `output_mark` names (a file edited, replaced or copied over
    since is not sweep's any more)."""
    content = _read_plain(path, None)
    return (content is not None and hashlib.sha256(content).hexdigest().encode()
            in _digests(_read_plain(output_mark(path), 1 << 12)))


def _same_path(path: Path, other: Path) -> bool:
    """Whether `path` names the file `other` names, whether or not it is there (folders
    above and links resolved; False if neither is there and the names differ)."""
    if os.path.realpath(path) == os.path.realpath(other):
        return True
    try:
        return _same_file(os.lstat(path), other)
    except OSError:
        return False


def _same_file(found: os.stat_result, other: Path) -> bool:
    """Whether `found` (a `stat`) is the file at `other` (links followed; False if none)."""
    try:
        return os.path.samestat(found, os.stat(other))
    except OSError:
        return False


def _read_plain(path: Path, limit: int | None) -> bytes | None:
    """The bytes of the plain file `path` (not through a link), at most `limit`; None if it
    is not one, or cannot be read."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def replace_output(path: Path, text: str, keep: Iterable[tuple[Path, str]] = ()) -> None:
    """Write `text` to `path` for the user (a report, a CSV: `replace_file`): only where no
    file is, or over one sweep wrote as it is now (`wrote`). UnsafePath, with nothing written,
    if `path` is one of `keep` (a file and what it is: the study file, its storage; there or
    not yet) or a file sweep did not write (the user's, or changed since).

    The mark is written first: it names the file's digest and the new one while the file is
    replaced, then the new one alone, each line written over the one before in place, so that
    a failure or a crash at any step leaves a file the mark names (the one before, or the new
    one): never one sweep wrote and would refuse. Two writers of `path` take turns (a lock on
    the mark); an OSError names the path it is about."""
    for other, what in keep:
        if _same_path(path, other):
            raise UnsafePath(path, f"is {what}")
    mark = output_mark(path)
    fd, made = _open_mark(mark)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released as `fd` closes
        try:
            before = _sweeps_file(path, _digests(os.pread(fd, 1 << 12, 0)))
            new = hashlib.sha256(text.encode("utf-8")).hexdigest().encode()
            _mark(fd, [before, new] if before else [new])
            replace_file(path, text)
        except OSError:
            if made:
                os.unlink(mark)  # made just now, and no file written: nothing is left
            raise
        _mark(fd, [new])
    except OSError as e:
        raise _named(e, mark) from e
    finally:
        os.close(fd)


def _open_mark(mark: Path) -> tuple[int, bool]:
    """`mark` open to read and write (blocking), and whether it was made now: this user's
    plain file, never through a link; else UnsafePath (or the OSError), naming it."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd, made = os.open(mark, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, made = os.open(mark, flags | os.O_NONBLOCK), False  # a FIFO never blocks
            os.set_blocking(fd, True)
    except OSError as e:
        raise _named(e, mark) from e
    problem = own_file_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise UnsafePath(mark, problem)
    return fd, made


def _sweeps_file(path: Path, marked: set[bytes]) -> bytes | None:
    """The digest of the file at `path` if it is one `marked` names (None where no file
    is); UnsafePath if it is a file sweep did not write. Links, folders, FIFOs are left to
    `replace_file` to refuse."""
    try:
        found: os.stat_result | None = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        found = None
    except OSError as e:
        raise _named(e, path) from e
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    content = _read_plain(path, None)
    digest = hashlib.sha256(content).hexdigest().encode() if content is not None else None
    if digest is None or digest not in marked:
        raise UnsafePath(path, "is a file sweep did not write, or one changed since")
    return digest


def _mark(fd: int, digests: list[bytes]) -> None:
    """The mark open as `fd` names `digests`, written over it from its start, then cut to
    their length: its first line is whole at every moment where it was the same before."""
    data = b"".join(d + b"\n" for d in digests)
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
