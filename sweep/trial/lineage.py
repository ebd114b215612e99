"""A trial's lineage: its first attempt and every attempt that carries it on (the continuation
after an interruption or a dead driver, a retry after a failure), and what they share: one
checkpoint folder, one run id, one curve of intermediate values (pure, but for `prepare`).

The lineage is carried in the user attributes of each attempt (`sweep._core.names.LINEAGE`:
`RETRY_OF` the first attempt's number, `ATTEMPT` its place, `CONTINUES` the attempt it carries
on, `RETRIES` the retries after a real failure so far, `RUN_ID`, `CLEAN`), so any driver of the
study that asks the queued attempt finds it. An interrupted attempt is not a failure of the
trial: its continuation counts against neither `trainer.max_retries` nor
`study.max_consecutive_failures`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep import protocol
from sweep._core import (
    ATTEMPT,
    CLEAN,
    CONTINUES,
    RETRIES,
    RETRY_OF,
    RUN_ID,
    UnsafePath,
    fill,
    make_own_folder,
    removable,
    remove_tree,
    write_file,
)

CHECKPOINT_ENV, RUN_ID_ENV = protocol.CHECKPOINT_ENV, protocol.RUN_ID_ENV
WANDB_RUN_ID, WANDB_RESUME = "WANDB_RUN_ID", "WANDB_RESUME"
CHECKPOINTS = "checkpoints"  # <output_dir>/checkpoints/<first attempt's number>/
LAST_CHECKPOINT = "last_checkpoint"  # the placeholder of trainer.resume_args only
HF_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
HF_STATE = "trainer_state.json"  # a HF Trainer checkpoint's last file


@dataclass(frozen=True)
class Lineage:
    """Where one attempt stands in its lineage."""

    origin: int  # the first attempt's number: names the checkpoint folder
    attempt: int = 0  # 0 for the first attempt, n for the n-th after it (any kind)
    retries: int = 0  # of those, the retries after a real failure (bounded by max_retries)
    continues: int | None = None  # the attempt this one carries on (None: the first)
    run_id: str | None = None
    clean: bool = False  # starts from scratch: a retry with trainer.retry_from: clean

    @classmethod
    def of(cls, attrs: Mapping[str, Any], number: int) -> Lineage:
        """The lineage recorded in an attempt's user attributes (trial `number`). Retries
        queued before lineages existed count each attempt as a retry."""
        attempt = int(attrs.get(ATTEMPT, 0))
        continues = attrs.get(CONTINUES)
        run_id = attrs.get(RUN_ID)
        return cls(int(attrs.get(RETRY_OF, number)), attempt, int(attrs.get(RETRIES, attempt)),
                   None if continues is None else int(continues),
                   None if run_id is None else str(run_id), bool(attrs.get(CLEAN, False)))

    @property
    def resumes(self) -> bool:
        """Whether this attempt takes up the lineage's checkpoint folder as it was left."""
        return self.continues is not None and not self.clean

    def next_attrs(self, number: int, retry: bool, clean: bool = False) -> dict[str, Any]:
        """The user attributes of the attempt that carries on attempt `number` (this one):
        a retry after a real failure (`retry`; `clean`: from scratch), else a continuation."""
        attrs: dict[str, Any] = {RETRY_OF: self.origin, ATTEMPT: self.attempt + 1,
                                 CONTINUES: number, RETRIES: self.retries + int(retry)}
        if self.run_id is not None:
            attrs[RUN_ID] = self.run_id
        if retry and clean:
            attrs[CLEAN] = True
        return attrs

    def again_attrs(self, number: int, kept: bool = False) -> dict[str, Any]:
        """The user attributes of the attempt that takes the place of attempt `number` (this
        one), which never ran (parked when its driver stopped, or its folders could not be
        prepared): it starts as this one would have, clean if this one did not resume (a first
        attempt, a clean retry) unless its folder is `kept` (a PBT exploit's copy, made), and
        spends no retry."""
        attrs = self.next_attrs(number, retry=False)
        if not self.resumes and not kept:
            attrs[CLEAN] = True
        return attrs


def new_run_id(study: str, number: int) -> str:
    """A run id for a new lineage: the study's name, the trial number, and 8 random hex
    digits (a study deleted and run again gets new ones); only letters, digits, - and _, as
    W&B takes them."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", study).strip("-")[:40] or "study"
    return f"{slug}-{number}-{secrets.token_hex(4)}"


def merged_curve(attempts: Sequence[tuple[int, Mapping[int, float]]]) -> dict[int, float]:
    """The lineage's intermediate values from its earlier attempts, given as (attempt,
    values): each step's value from the latest attempt that reported it."""
    curve: dict[int, float] = {}
    for _, values in sorted(attempts, key=lambda a: a[0]):
        curve.update(values)
    return curve


def checkpoint_dir(output_dir: Path, origin: int) -> Path:
    """The lineage's checkpoint folder: `<output_dir>/checkpoints/<origin>`."""
    return output_dir / CHECKPOINTS / str(origin)


def last_checkpoint(folder: Path) -> Path | None:
    """The newest `checkpoint-N` folder (largest N) in `folder`, as a HF `Trainer` writes them
    under its `--output_dir`: the newest that holds `trainer_state.json` (the Trainer writes
    it last) if any does, else the newest; None if there is none."""
    try:
        found = [(int(m.group(1)), p) for p in folder.iterdir()
                 if (m := HF_CHECKPOINT.match(p.name)) and p.is_dir()]
    except OSError:
        return None
    complete = [f for f in found if (f[1] / HF_STATE).is_file()]
    pick = complete or found
    return max(pick)[1] if pick else None


@dataclass(frozen=True)
class Start:
    """What a starting attempt gets from its lineage: its checkpoint folder, whether it
    continues from what is there (`resume`: the lineage is carried on and the folder is not
    empty), the newest HF checkpoint in it, and the run id."""

    checkpoint_dir: Path
    resume: bool = False
    last_checkpoint: Path | None = None
    run_id: str | None = None
    # the step of the state it resumes from, where its lineage's curve does not say it (a PBT
    # exploit's copy of its donor's): where counted steps go on from
    after: int | None = None
    gone: bool = False  # it carries its lineage on, but the folder sweep made for it was gone


def made_marker(output_dir: Path, origin: int) -> Path:
    """The file beside a lineage's checkpoint folder that says sweep made that folder:
    `checkpoints/.<origin>.sweep` (beside it, not in it: a script may take a folder with
    anything in it for a checkpoint)."""
    return output_dir / CHECKPOINTS / f".{origin}.sweep"


def make_checkpoints(output_dir: Path) -> None:
    """Make `<output_dir>/checkpoints/` (0700) if it is not there: this user's real folder (a
    link is refused before anything in it is touched). OSError if it cannot."""
    folder = output_dir / CHECKPOINTS
    try:
        make_own_folder(folder, 0o700)
    except UnsafePath as e:
        if e.why != "is a symbolic link":
            raise
        raise UnsafePath(folder, "is a symbolic link: sweep writes no checkpoint "
                         "through a link; to keep checkpoints on another disk, put "
                         "study.output_dir there") from None


def prepare(output_dir: Path, lineage: Lineage) -> Start:
    """Make the lineage's checkpoint folder ready for an attempt: a first attempt or a clean
    retry gets it empty, an attempt that carries the lineage on gets it as it was left.

    `checkpoints/` must be this user's real folder (a link is refused before anything in it
    is touched). The folder is the lineage's only if sweep made it (`made_marker` beside it,
    written before the folder is made): one with anything in it that sweep did not make
    (left by someone, or by an earlier study of this output_dir before markers) is refused,
    UnsafePath, for every attempt: it is neither removed nor taken for the lineage's
    checkpoints, and no marker is written beside it. A first attempt or a clean retry
    removes the lineage's folder, never through a link, across a mount point, or with
    another study's output_dir in it (`removal.remove_tree`). OSError if it cannot."""
    folder = checkpoint_dir(output_dir, lineage.origin)
    make_checkpoints(output_dir)
    marker = made_marker(output_dir, lineage.origin)
    ours = _is_file(marker)
    gone = lineage.resumes and ours and not os.path.lexists(folder)
    if not lineage.resumes:
        remove_tree(folder, ours)  # UnsafePath if not sweep's and not empty
    elif not ours:
        removable(folder, False)  # UnsafePath: not empty, and not sweep's
    if not ours:
        write_file(marker, f"{lineage.origin}\n", 0o600)
    make_own_folder(folder, 0o700)
    return dataclasses.replace(planned(output_dir, lineage), gone=gone)


def planned(output_dir: Path, lineage: Lineage) -> Start:
    """What `prepare` gives the attempt, read without touching anything (a dry run): it
    resumes if it carries the lineage on and the folder holds something."""
    folder = checkpoint_dir(output_dir, lineage.origin)
    resume = (lineage.resumes and _is_file(made_marker(output_dir, lineage.origin))
              and folder.is_dir() and any(folder.iterdir()))
    return Start(folder, resume, last_checkpoint(folder) if resume else None, lineage.run_id)


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def places(start: Start) -> dict[str, str]:
    """The placeholders an attempt's args, env and result file get from its lineage."""
    return {"checkpoint_dir": str(start.checkpoint_dir)}


def resumable(args: Sequence[str], start: Start, fill_places: Mapping[str, str],
              env: Mapping[str, str]) -> bool:
    """Whether an attempt has something to resume from with `trainer.resume_args` (`args`):
    it carries its lineage on into a folder that is not empty (`start.resume`), the newest
    `checkpoint-N` is there if they name `{last_checkpoint}`, and every path they name inside
    the checkpoint folder (an arg, or the value of `--opt=value`), filled, is there: a
    trainer stopped before its first save may have written something else (timm's
    `args.yaml`) but not the file they name (timm's `last.pth.tar`), and a script given a
    missing file to resume from fails."""
    if not start.resume:
        return False
    if any("{" + LAST_CHECKPOINT + "}" in a for a in args) and start.last_checkpoint is None:
        return False
    full = {**fill_places, LAST_CHECKPOINT: str(start.last_checkpoint or "")}
    inside = str(start.checkpoint_dir).rstrip(os.sep) + os.sep
    for arg in args:
        filled = fill(arg, full, env)
        for text in (filled, filled.partition("=")[2]):
            if text.startswith(inside) and not os.path.lexists(text):
                return False
    return True


def resume_args(args: Sequence[str], start: Start, fill_places: Mapping[str, str],
                env: Mapping[str, str]) -> list[str]:
    """`trainer.resume_args` for an attempt: filled, when it has something to resume from
    (`resumable`); none otherwise (it starts from scratch)."""
    if not resumable(args, start, fill_places, env):
        return []
    full = {**fill_places, LAST_CHECKPOINT: str(start.last_checkpoint or "")}
    return [fill(a, full, env) for a in args]


def env(start: Start, trainer_env: Mapping[str, Any]) -> dict[str, str]:
    """The variables an attempt gets from its lineage: SWEEP_CHECKPOINT_DIR, SWEEP_RUN_ID, and
    WANDB_RUN_ID + WANDB_RESUME=allow from it (a W&B run carries on too) unless `trainer_env`
    sets them."""
    out = {CHECKPOINT_ENV: str(start.checkpoint_dir)}
    if start.run_id is not None:
        out[RUN_ID_ENV] = start.run_id
        for name, value in ((WANDB_RUN_ID, start.run_id), (WANDB_RESUME, "allow")):
            if name not in trainer_env:
                out[name] = value
    return out


def image_file(start: Start) -> Path:
    """The file beside a lineage's checkpoint folder that names the image (its ID) the
    lineage started in, with `trainer.container`: `checkpoints/.<origin>.image`."""
    folder = start.checkpoint_dir
    return folder.parent / f".{folder.name}.image"


def started_in(start: Start) -> str | None:
    """The image ID the lineage of `start` started in; None if none is recorded."""
    path = image_file(start)
    if not _is_file(path):
        return None
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def image_refusal(start: Start, started: str | None, now: str, allowed: bool) -> str | None:
    """Why an attempt may not run in image `now` (pure): it carries on its lineage from
    what the checkpoint folder holds (`start.resume`) and the lineage started in another image
    (`started`), and the study does not allow that (`allowed`); None: it may."""
    if not start.resume or started is None or started == now or allowed:
        return None
    return (f"its lineage (checkpoints in {start.checkpoint_dir}) started in the image "
            f"{started}, and this run's image is {now}: it carries on only in the image it "
            "started in (rebuild or retag that image, or set "
            "trainer.container.continue_in_other_image: true)")


def record_image(start: Start, image: str) -> None:
    """Record the image an attempt of the lineage runs in, when it starts the lineage (or
    starts it over: its checkpoint folder is empty) or carries it on in another one by
    consent."""
    if started_in(start) != image:
        write_file(image_file(start), f"{image}\n", 0o600)
