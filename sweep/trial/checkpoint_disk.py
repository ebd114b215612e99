"""The disk a study's lineage checkpoint folders take (`<output_dir>/checkpoints/<origin>`),
and the removal of one of them: only a folder sweep made (its `made_marker` beside it), only
inside sweep's own real `checkpoints/` folder, never through a link, and nothing outside the
lineage's own folder (its marker files beside it stay). What to remove is decided elsewhere
(`sweep.runner.retention`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sweep._core.safefs import UnsafePath, own_folder_problem, remove_tree
from sweep.trial import lineage, lineage_lock


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


def remove(output_dir: Path, origin: int) -> None:
    """Remove lineage `origin`'s checkpoint folder with all that is in it. UnsafePath, with
    nothing removed, if `checkpoints/` is not this user's real folder, or the folder is not one
    sweep made (no marker beside it: then only an empty one goes), or `safefs.remove_tree`
    refuses it (a link, a mount point, another study's output_dir inside)."""
    parent = output_dir / lineage.CHECKPOINTS
    problem = own_folder_problem(os.lstat(parent))
    if problem:
        raise UnsafePath(parent, problem)
    marker = lineage.made_marker(output_dir, origin)
    made = marker.is_file() and not marker.is_symlink()
    remove_tree(lineage.checkpoint_dir(output_dir, origin), made)


def remove_unheld(output_dir: Path, origin: int) -> bool:
    """`remove` lineage `origin`'s folder holding its lineage lock, so that no process writes
    it meanwhile; False, with nothing removed, if another process holds the lock, the lock
    cannot be had now, or a straggler writes in it while it goes (another time). UnsafePath
    as `remove`."""
    try:
        fd = lineage_lock.take(output_dir, origin)
    except lineage_lock.Unsupported:
        fd = -1  # a file system that cannot lock: the trial states decide
    except UnsafePath:
        raise
    except OSError:
        return False
    if fd is None:
        return False
    try:
        remove(output_dir, origin)
    except UnsafePath:
        raise
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    return True
