"""The folders and files of a sweep in `output_dir`: whose they are, and writing them safely.

`output_dir` belongs to one study: `study.json` there names it and its storage, and a driver
of another study refuses the folder before it writes anything (`claim_output_dir`), and so
does an output_dir inside another study's. A trial's folder `trials/<number>/` is made anew
before the trial starts, so no file in it is older than the trial; a declared result file
elsewhere is never removed, and counts only if the trial wrote it. sweep removes only
folders it made (its marker `trials/.<number>.sweep` beside each, written before the folder
is made), never through a link or a mount point (`removal.remove_tree`). Trial folders are 0700 and
their files 0600 (`command.sh` 0700, written by `command_script`), never written through a
symbolic link.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sweep._core import (
    MARKER,
    UnsafePath,
    UsageError,
    check_output_dir,
    make_own_folder,
    open_for_writing,
    remove_tree,
    write_file,
)
from sweep.spec import Spec, storage_identity
from sweep.trial import lineage, lineage_lock
from sweep.trial.command_script import command_script

MARKER_NAME = MARKER  # study.json: whose output_dir this is
FILE_MODE, SCRIPT_MODE, FOLDER_MODE = 0o600, 0o700, 0o700


@dataclass(frozen=True)
class TrialPaths:
    """The files of one trial, all under `<output_dir>/trials/<number>/`."""

    dir: Path

    @classmethod
    def of(cls, output_dir: Path, number: int) -> TrialPaths:
        return cls(output_dir / "trials" / str(number))

    @property
    def params(self) -> Path:
        return self.dir / "params.json"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def reports(self) -> Path:
        return self.dir / "reports.jsonl"

    @property
    def stdout(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.dir / "stderr.log"

    @property
    def command(self) -> Path:
        return self.dir / "command.sh"

    @property
    def made(self) -> Path:
        """The file beside the trial's folder that says sweep made it: `trials/.<number>.sweep`
        (written before the folder is made; beside it, not in it, so nothing a trainer or a
        user puts in a folder makes it sweep's)."""
        return self.dir.with_name(f".{self.dir.name}.sweep")


class Plan(Protocol):
    """What `prepare_trial_dir` needs of a `launch.LaunchPlan`."""

    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def paths(self) -> TrialPaths: ...
    @property
    def result(self) -> Path: ...


def trial_dir(output_dir: Path, number: int) -> Path:
    return TrialPaths.of(output_dir, number).dir


def driver_dir(output_dir: Path, host: str, pid: int) -> Path:
    """The files of one driver process (its accelerate config, its GPU samples): drivers on
    several hosts may share `output_dir` on a cluster filesystem."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host) or "host"
    return output_dir / "drivers" / f"{safe}.{pid}"


# ---- whose output_dir -------------------------------------------------------------------


@dataclass(frozen=True)
class OutputOwner:
    """The study an `output_dir` belongs to: its name and its storage as shown to users."""

    study: str
    storage: str


def owner_of(spec: Spec) -> OutputOwner:
    """Who `spec`'s output_dir belongs to: its study, in its storage (password hidden)."""
    return OutputOwner(spec.study.name, spec.storage.shown)


def same_owner(found: OutputOwner | None, owner: OutputOwner) -> bool:
    """Whether `found` (a study.json's) is `owner`: the same study name in the same storage,
    however each URL spells it (see `storage_identity`)."""
    return (found is not None and found.study == owner.study
            and storage_identity(found.storage) == storage_identity(owner.storage))


def read_marker(output_dir: Path) -> OutputOwner | None:
    """The study `output_dir` belongs to, from its `study.json`; None if it has none (yet)."""
    try:
        data = json.loads((output_dir / MARKER_NAME).read_text())
        return OutputOwner(str(data["study"]), str(data["storage"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return OutputOwner("<unreadable>", "<unreadable>")


def claim_output_dir(output_dir: Path, owner: OutputOwner, source: Path) -> None:
    """Make `output_dir` (created and checked: see `prepare_output_dir`) the folder of
    `owner`'s trials, or find it is already: UsageError, in one line, if it holds another
    study's (another name, or the same name in another storage: `storage_identity`).
    Drivers of one study on several hosts share it. An output_dir inside another one (a
    folder above it holds a study.json) is refused: its trials would be removed with that
    study's."""
    check_not_nested(output_dir, source)
    prepare_output_dir(output_dir, source=source)
    try:
        found = _mark(output_dir, owner)
    except OSError as e:
        raise UsageError(f"{source}: study.output_dir: cannot write "
                         f"{output_dir / MARKER_NAME}: {e.strerror or e}") from None
    if not same_owner(found, owner):
        raise UsageError(foreign(source, output_dir, found))


SWEEPS_OWN = ("trials", "checkpoints", "drivers")  # what sweep makes in an output_dir


def check_not_nested(output_dir: Path, source: Path) -> None:
    """UsageError if `output_dir` is the file system's root, or inside a folder sweep makes in
    another study's output_dir (`trials/`, `checkpoints/`, `drivers/` of a folder holding a
    study.json that names a study): it would be removed with that study's trial or lineage.
    Beside them (a study in `runs/ablation` next to one in `runs`) is fine."""
    real = Path(os.path.realpath(output_dir))
    if real == Path(real.anchor):
        raise UsageError(f"{source}: study.output_dir: {output_dir} is the file system's root: "
                         "give the study a folder of its own")
    for above in real.parents:
        found = read_marker(above)
        if found is None or found.study == "<unreadable>":
            continue
        part = real.relative_to(above).parts[0]
        if part in SWEEPS_OWN:
            raise UsageError(
                f"{source}: study.output_dir: {output_dir} is inside {above / part}, a folder "
                f"of {_whose(found)} (see {above / MARKER_NAME}) whose contents are removed "
                "with its trials: give this study a folder of its own")


def _mark(output_dir: Path, owner: OutputOwner) -> OutputOwner | None:
    """Write `owner` into `output_dir`'s study.json unless it has one: whom it names now."""
    found = read_marker(output_dir)
    if found is not None:
        return found
    tmp = output_dir / f".{MARKER_NAME}.{os.getpid()}.tmp"
    try:
        write_file(tmp, json.dumps({"study": owner.study, "storage": owner.storage},
                                   indent=1) + "\n", 0o644)
        try:
            os.link(tmp, output_dir / MARKER_NAME)  # the first claim wins; others read it
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_marker(output_dir)


def foreign(source: Path, output_dir: Path, found: OutputOwner | None) -> str:
    """The line that refuses `output_dir` holding the trials of `found`."""
    return (f"{source}: study.output_dir: {output_dir} holds the trials of {_whose(found)}, see "
            f"{output_dir / MARKER_NAME}: give this study another output_dir, or remove that "
            "folder to start afresh")


def _whose(found: OutputOwner | None) -> str:
    return ("an unreadable study.json" if found is None or found.study == "<unreadable>"
            else f"study {found.study!r} (storage {found.storage})")


def check_belongs(output_dir: Path, owner: OutputOwner, source: Path) -> None:
    """UsageError if `output_dir` is marked as another study's (an unmarked one may be)."""
    found = read_marker(output_dir)
    if found is not None and not same_owner(found, owner):
        raise UsageError(foreign(source, output_dir, found))


# ---- making folders and files ---------------------------------------------------------


def prepare_output_dir(output_dir: Path, own: Path | None = None,
                       source: Path | None = None) -> None:
    """Create `output_dir` (and check it: this user's, not writable by all), and, with the
    driver's folder `own`, that folder (and `drivers/`) and `trials/`, each this user's own
    real folder (a symbolic link is refused). With `source`, a problem is a
    UsageError naming `study.output_dir` of that file; else the OSError, naming the path."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if source is None:
            raise
        raise UsageError(f"{source}: study.output_dir: cannot create {output_dir}: "
                         f"{e.strerror or e}") from None
    with _refused_as_output_dir(output_dir, source):
        check_output_dir(output_dir)
    if own is not None:
        make_driver_dirs(output_dir, own, source)


def make_driver_dirs(output_dir: Path, own: Path, source: Path | None = None) -> None:
    """In `output_dir` (prepared: `prepare_output_dir`), the driver's folder `own` (and
    `drivers/`) and `trials/`, each this user's own real folder (a symbolic link is refused).
    With `source`, a problem is a UsageError naming `study.output_dir` of that file; else the
    OSError, naming the path."""
    with _refused_as_output_dir(output_dir, source):
        make_own_folder(own.parent, FOLDER_MODE)
        make_own_folder(own, FOLDER_MODE)
        make_own_folder(output_dir / "trials", FOLDER_MODE)


@contextlib.contextmanager
def _refused_as_output_dir(output_dir: Path, source: Path | None) -> Iterator[None]:
    """An OSError of the block, with `source`, as the UsageError naming `study.output_dir`
    of that file."""
    try:
        yield
    except OSError as e:
        if source is None:
            raise
        mine = "; use a folder of your own" if isinstance(e, UnsafePath) else ""
        raise UsageError(f"{source}: study.output_dir: {cannot(e, output_dir)}{mine}") from None


def older_trial_folders(output_dir: Path) -> list[int]:
    """The numbers of the trial folders in `output_dir/trials` that an older sweep made: a
    folder, not empty, without sweep's mark (`.<n>.sweep`) beside it, which no trial of that
    number can be prepared over (`prepare_trial_dir` refuses it); sorted. [] if none (or
    `trials/` cannot be read)."""
    trials = output_dir / "trials"
    try:
        names = os.listdir(trials)
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit() or name != str(int(name)) or _is_plain(trials / f".{name}.sweep"):
            continue
        try:
            if stat.S_ISDIR(os.lstat(trials / name).st_mode) and os.listdir(trials / name):
                found.append(int(name))
        except OSError:
            continue
    return sorted(found)


def older_note(output_dir: Path, numbers: list[int]) -> str:
    """The one line said as a run starts over `older_trial_folders` (`numbers`)."""
    trials = output_dir / "trials"
    shown = ", ".join(map(str, numbers[:5])) + (f" ... ({len(numbers)} in all)"
                                                if len(numbers) > 5 else "")
    return (f"{trials} holds trial folders of an older sweep, without sweep's mark "
            f"(.<n>.sweep) beside them: {shown}; sweep removes none of them, and a trial of "
            f"such a number fails to prepare: move {trials} away, or give the study another "
            "output_dir")


def ensure_driver_dir(spec: Spec, own: Path) -> None:
    """Before each trial: re-create the driver's folder `own`, and the study.json of `spec`'s
    output_dir, if they are gone (`output_dir` removed during the run); one `stat` when they
    are there. TrialFileError if they cannot be, or another study has taken it since."""
    if own.is_dir():
        return
    output_dir, owner = spec.output_dir, owner_of(spec)
    with _trial_files(own):
        prepare_output_dir(output_dir, own)
        found = _mark(output_dir, owner)
        if not same_owner(found, owner):
            raise UnsafePath(output_dir, "was removed during the run and now holds the "
                             f"trials of {_whose(found)}")


class TrialFileError(OSError):
    """A trial's folder or files, or the driver's folder, could not be made: `why` says
    which path and why (the disk is full, the folder read-only or gone, a planted link)."""

    def __init__(self, why: str, cause: OSError) -> None:
        super().__init__(cause.errno, why, cause.filename)
        self.why = why

    def __str__(self) -> str:
        return self.why


@contextlib.contextmanager
def _trial_files(fallback: Path) -> Iterator[None]:
    """Any OSError inside as a TrialFileError naming its path (`fallback` if it names none)."""
    try:
        yield
    except TrialFileError:
        raise
    except OSError as e:
        raise TrialFileError(cannot(e, fallback), e) from e


def cannot(e: OSError, fallback: Path) -> str:
    """An OSError as "cannot write PATH: why"."""
    if isinstance(e, UnsafePath):
        return str(e)
    return f"cannot write {e.filename or fallback}: {e.strerror or e}"


def prepare_checkpoint_dir(output_dir: Path, line: lineage.Lineage) -> lineage.Start:
    """`lineage.prepare` (the lineage's checkpoint folder, emptied for a new lineage or a
    clean retry); TrialFileError (naming the path) if it cannot be done."""
    with _trial_files(lineage.checkpoint_dir(output_dir, line.origin)):
        return lineage.prepare(output_dir, line)


def take_lineage_lock(output_dir: Path, line: lineage.Lineage) -> int | None:
    """`lineage_lock.take` (the lineage's lock, None if held); TrialFileError (naming the
    path) if it cannot be done."""
    with _trial_files(lineage_lock.lock_path(output_dir, line.origin)):
        return lineage_lock.take(output_dir, line.origin)


def prepare_trial_dir(plan: Plan, params: Mapping[str, Any],
                      secrets: Mapping[str, str] | None = None) -> os.stat_result | None:
    """Make the trial's folder anew (0700), with command.sh and params.json (the script's
    params). The folder is sweep's only if its marker (`TrialPaths.made`) is beside it,
    written before the folder is made: a folder an earlier trial of that number left is
    removed then (`removal.remove_tree`: never through a link, across a mount point, or with
    another study's output_dir in it); a link, a file, or a folder with anything in it and
    no marker beside it (whatever it holds: a `command.sh` makes no folder sweep's) is
    refused. The declared result file is never
    removed (a result written before the trial never counts: `written_before`), and one that
    is a folder is refused. `secrets` (see `arg_secrets`) are left out of command.sh's
    arguments, as are the values of the trial's variables whose names look secret.
    TrialFileError (naming the path) if it cannot be done; then nothing of the user's was
    removed.
    Returns the `stat` of the result file found elsewhere before the trial (for
    `written_before`), None if there was none."""
    with _trial_files(plan.paths.dir):
        return _prepare_trial_dir(plan, params, secrets or {})


def _prepare_trial_dir(plan: Plan, params: Mapping[str, Any],
                       secrets: Mapping[str, str]) -> os.stat_result | None:
    paths = plan.paths
    paths.dir.parent.parent.mkdir(parents=True, exist_ok=True)
    make_own_folder(paths.dir.parent, FOLDER_MODE)
    ours = _is_plain(paths.made)
    remove_tree(paths.dir, ours)  # UnsafePath if not sweep's and not empty
    if not ours:
        write_file(paths.made, f"{paths.dir.name}\n", FILE_MODE)
    os.mkdir(paths.dir, FOLDER_MODE)  # a folder made meanwhile by someone else fails here
    make_own_folder(paths.dir, FOLDER_MODE)
    before = None
    if plan.result.parent != paths.dir:  # (a path through the trial's folder resolves now)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            before = os.stat(plan.result)
        if before is not None and stat.S_ISDIR(before.st_mode):
            raise UnsafePath(plan.result, "is a folder: trainer.result.file must name a "
                             "file (the one the trainer writes)")
    write_file(paths.command, command_script(plan, secrets), SCRIPT_MODE)
    write_file(paths.params, json.dumps(dict(params), indent=2) + "\n", FILE_MODE)
    cwd = getattr(plan, "cwd", None)  # `trainer.workdir`: made if it is not there
    if cwd is not None:
        os.makedirs(cwd, FOLDER_MODE, exist_ok=True)
    return before


STALE_MARGIN_NS = 1_000_000_000  # a file's clock may differ this much from command.sh's


def _is_plain(path: Path) -> bool:
    """Whether `path` is a regular file (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def written_before(result: Path, paths: TrialPaths,
                   before: os.stat_result | None = None) -> bool:
    """Whether the trial's result file was not written by the trial: it is the very file
    found before the trial (`before`, from `prepare_trial_dir`), unchanged since, or it was
    last written before the trial was prepared (its command.sh) by over a second (only files
    of command.sh's file system are compared that way: another one's clock may differ)."""
    try:
        found, prepared = os.stat(result), os.stat(paths.command)
    except OSError:
        return False
    if before is not None and _same_file(found, before):
        return True
    return (found.st_dev == prepared.st_dev
            and found.st_mtime_ns < prepared.st_mtime_ns - STALE_MARGIN_NS)


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """The same file, unchanged: no write, rename or change of its inode in between."""
    return ((a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns)
            == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns, b.st_ctime_ns))


def open_log(path: Path) -> Any:
    """A trial's stdout.log or stderr.log, emptied, for the trainer to write (binary): never
    through a symbolic link, nor another user's file. TrialFileError (naming it) if not."""
    with _trial_files(path):
        return os.fdopen(open_for_writing(path, FILE_MODE), "wb")
