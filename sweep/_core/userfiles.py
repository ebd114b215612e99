"""Files sweep writes for the user (a report, a CSV), written over only where sweep wrote
them: each has a mark beside it (`.<name>.sweep`) holding the SHA-256 of what sweep wrote
(`replace_output`, `wrote`); never the study file or its storage.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sweep._core.safefs import READ_FLAGS, UnsafePath, named, own_file_problem, replace_file


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
        raise named(e, mark) from e
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
        raise named(e, mark) from e
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
        raise named(e, path) from e
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
