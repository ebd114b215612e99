"""`sweep logs`: a trial's stdout or stderr log, followed while it runs until it is finished
or its driver is gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sweep._core import UsageError
from sweep.spec import config
from sweep.study import Owner, host_name, read_study
from sweep.trial import folders


def trial_log(
    path: str | Path, number: int, stderr: bool = False, follow: bool = False,
    storage: str | None = None, poll: float = 0.5,
) -> Iterator[str]:
    """The text of trial `number`'s stdout (or stderr) log; with `follow`, more of it as it
    comes, until the trial is finished, or its driver, of this host, is gone (then a last line
    says so)."""
    spec = config.load(path, runnable=False, storage=storage)
    folders.check_belongs(spec.output_dir, folders.owner_of(spec), spec.source)
    paths = folders.TrialPaths.of(spec.output_dir, number)
    log = paths.stderr if stderr else paths.stdout
    if not paths.dir.is_dir():
        raise UsageError(f"{path}: no trial {number} in {paths.dir.parent} (`sweep summary` "
                         "lists the study's trials)")
    if not log.exists():
        raise UsageError(f"{path}: trial {number} has no {log.name} at {log}")
    study = read_study(spec) if follow else None
    offset = 0
    while True:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
        offset += len(data)
        if data:
            yield data.decode("utf-8", errors="replace")
        if study is None or _finished(study, number):
            return
        if _driver_gone(study, number):
            yield (f"\n(sweep: trial {number}'s driver is gone: the trial stays RUNNING until "
                   "the next `sweep run` of the study reclaims it)\n")
            return
        time.sleep(poll)


def _finished(study: Any, number: int) -> bool:
    trials = study.get_trials(deepcopy=False)
    return number >= len(trials) or trials[number].state.is_finished()


def _driver_gone(study: Any, number: int) -> bool:
    """Whether trial `number` (RUNNING) was run by a driver of this host that is gone."""
    owner = Owner.of(study.get_trials(deepcopy=False)[number].user_attrs)
    return owner is not None and owner.host == host_name() and not owner.alive()
