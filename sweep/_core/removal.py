"""Folders sweep made, removed: only if they are sweep's (`removable`), with all in them,
never through a link and never across a mount point, also one made while they are removed.

A refusal is a `safefs.UnsafePath`, naming the path and why, and nothing is removed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from sweep._core.safefs import DIR_FLAGS, UnsafePath, named, own_folder_problem

MOUNTINFO = Path("/proc/self/mountinfo")  # the mounts of this process, as the kernel lists them
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
        raise named(e, path) from e
    try:
        _remove_in(parent, path.name, path, path, _mount_of(parent))
    except OSError as e:
        raise named(e, path) from e
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
        raise named(e, path) from e
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
        raise named(e, path) from e
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
