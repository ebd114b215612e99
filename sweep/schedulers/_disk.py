"""The disk a study's lineage checkpoint folders take (`<output_dir>/checkpoints/<origin>`),
and the removal of one of them: only a folder sweep made (its `made_marker` beside it), only
inside sweep's own real `checkpoints/` folder, never through a link, and nothing outside the
lineage's own folder (its marker files beside it stay). What to remove is decided elsewhere
(`sweep.schedulers._retention`).

A removal is two steps, so that the decision is quick where it must be (under the study's
budget lock): `retire` checks the folder and renames it to a trash name beside it
(`.<origin>.removing-<token>`, with `.<origin>.removing-<token>.sweep` written beside it first:
the proof that sweep made it), holding the lineage's lock (no process writes it meanwhile);
from then on the lineage's folder is gone (`removed`). `purge` removes the trash folders'
contents later, each under its lineage's lock (one remover at a time), including those a
driver killed between the two steps left; a folder of that name without its mark beside it is
not sweep's, and is left alone.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from sweep._core import (
    UnsafePath,
    mounts_at_or_under,
    own_folder_problem,
    removable,
    remove_tree,
    write_file,
)
from sweep.trial import lineage, lineage_lock

TRASH = re.compile(r"^\.(\d+)\.removing-[0-9a-f]{8}$")  # a retired folder, not purged yet
TRASH_MARK = ".sweep"  # beside a trash folder, its name + this: sweep retired it


def folder_bytes(folder: Path) -> int:
    """The bytes in the regular files under `folder` (a real folder), links not followed
    (nor counted); 0 for what vanishes while it is read."""
    total = 0
    for _, _, files, fd in os.fwalk(folder, follow_symlinks=False):
        for name in files:
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def sizes(output_dir: Path, origins: Iterable[int]) -> dict[int, int]:
    """The bytes in each of these lineages' checkpoint folders that is there as a real folder
    (a link or a file there is left out); none if `checkpoints/` is not sweep's real
    folder (`lineage.prepare` refuses it)."""
    out: dict[int, int] = {}
    try:
        if own_folder_problem(os.lstat(output_dir / lineage.CHECKPOINTS)):
            return out
    except FileNotFoundError:
        return out
    for origin in origins:
        folder = lineage.checkpoint_dir(output_dir, origin)
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                continue
            out[origin] = folder_bytes(folder)
        except FileNotFoundError:
            continue
    return out


def removed(output_dir: Path, origin: int) -> bool:
    """Whether lineage `origin`'s folder was made by sweep (its marker is there) and is gone:
    removed as one that can never continue (or by hand)."""
    return (lineage.made_marker(output_dir, origin).is_file()
            and not os.path.lexists(lineage.checkpoint_dir(output_dir, origin)))


def _made(output_dir: Path, origin: int) -> bool:
    """Whether sweep made lineage `origin`'s folder (its marker beside it, a regular file);
    UnsafePath if `checkpoints/` is not this user's real folder."""
    parent = output_dir / lineage.CHECKPOINTS
    problem = own_folder_problem(os.lstat(parent))
    if problem:
        raise UnsafePath(parent, problem)
    marker = lineage.made_marker(output_dir, origin)
    return marker.is_file() and not marker.is_symlink()


def retire(output_dir: Path, origin: int) -> Path | None:
    """Take lineage `origin`'s folder out of its place, holding its lineage lock (no process
    writes it meanwhile), renamed to a trash name beside it, for `purge`. The trash folder;
    None, with nothing done, if the folder is not there, another process holds the lock, or
    the lock cannot be had now (another time). UnsafePath, with nothing done, if
    `checkpoints/` is not this user's real folder, or the folder is not one sweep made (no
    marker beside it: then only an empty one goes), or `removal.removable` refuses it (a
    link, a mount point, another study's output_dir inside), or a file system or a folder
    was mounted in it meanwhile (found once renamed: it is renamed back)."""
    try:
        fd = lineage_lock.take(output_dir, origin)
    except lineage_lock.Unsupported:
        fd = -1  # a file system that cannot lock: the trial states decide
    except UnsafePath:
        raise
    except OSError:
        return None
    if fd is None:
        return None
    folder = lineage.checkpoint_dir(output_dir, origin)
    try:
        if not removable(folder, _made(output_dir, origin)):
            return None
        trash = folder.parent / f".{origin}.removing-{secrets.token_hex(4)}"
        mark = _mark(trash)
        write_file(mark, f"{origin}\n", 0o600)
        try:
            os.rename(folder, trash)
        except OSError:
            os.unlink(mark)  # the file just written: nothing was retired
            raise
        mounted = mounts_at_or_under(trash)  # one made since `removable` looked
        if mounted:
            os.rename(trash, folder)  # back in its place: nothing was retired
            os.unlink(mark)
            inside = "" if mounted[0] == "." else f"holds {folder / mounted[0]}, "
            raise UnsafePath(folder, f"{inside or 'is '}where a file system or a folder is "
                             "mounted: unmount it first")
        return trash
    except UnsafePath:
        raise
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _mark(trash: Path) -> Path:
    return trash.with_name(trash.name + TRASH_MARK)


def _marked(trash: Path) -> bool:
    """Whether `trash` has sweep's mark beside it (a regular file, not a link)."""
    try:
        return stat.S_ISREG(os.lstat(_mark(trash)).st_mode)
    except OSError:
        return False


def purge(output_dir: Path) -> tuple[list[Path], list[UnsafePath]]:
    """Remove the trash folders `retire` left in `checkpoints/` (this driver's, or a killed
    driver's: each with its mark beside it, which goes last), each holding its lineage's lock
    (a trash folder another driver is removing is left to it). A folder of a trash name
    without its mark is not sweep's: left alone, unsaid. Returns the folders removed, and an
    UnsafePath for each that `removal.remove_tree` refused (a file system mounted in it since)."""
    parent = output_dir / lineage.CHECKPOINTS
    try:
        if own_folder_problem(os.lstat(parent)):
            return [], []
        entries = sorted(os.listdir(parent))
    except OSError:
        return [], []
    done: list[Path] = []
    refused: list[UnsafePath] = []
    for name in entries:
        found = TRASH.match(name)
        if not found or not _marked(parent / name):
            continue
        try:
            fd = lineage_lock.take(output_dir, int(found.group(1)))
        except lineage_lock.Unsupported:
            fd = -1
        except OSError:
            continue
        if fd is None:
            continue
        try:
            remove_tree(parent / name, True)  # checked as retired, and marked so
            os.unlink(_mark(parent / name))
            done.append(parent / name)
        except UnsafePath as e:
            refused.append(e)
        except OSError:
            continue  # another time
        finally:
            if fd >= 0:
                os.close(fd)
    return done, refused
