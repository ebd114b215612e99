"""The study of a study file opened for one driver: its storage (an unreachable one is one
UsageError), the study created or loaded and checked against the file, and the `Store` the
driver works through."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna

from sweep._core import UsageError
from sweep.spec import Spec, searchspace
from sweep.study.attrs import Owner, OwnerRecord
from sweep.study.budget import target_of
from sweep.study.opening import open_study
from sweep.study.storage import (
    FileIdentity,
    Found,
    close_storage,
    open_storage,
    storage_errors,
    unreachable,
)
from sweep.study.store import Store
from sweep.trial import folders


def connect(
    spec: Spec, owner: Owner, reclaim_after: float | None = None,
    notes: list[str] | None = None, clock: Callable[[], float] = time.monotonic,
    found: Found | None = None,
) -> Store:
    """The study of `spec` in its storage, opened (created if new) for the driver `owner`;
    an unreachable storage is a UsageError. What changed since earlier runs, and may, is
    added to `notes`. With `found` (`storage.find`), the storage and study it read are gone
    on with where they can be: not opened again."""
    stored, storage = (None, None) if found is None else found.take()
    if storage is None:
        try:
            storage = open_storage(spec)
        except storage_errors() as e:
            raise unreachable(spec, e) from None
    try:
        study = open_study(spec, storage, notes, stored)
        identity = FileIdentity.of(spec.storage)
    except BaseException as e:
        close_storage(storage)  # a file refused leaves nothing beside the study's either
        if isinstance(e, storage_errors()):
            raise unreachable(spec, e) from None
        raise
    return Store(study, storage, owner,
                 spec.study.reclaim_seconds if reclaim_after is None else reclaim_after,
                 grid=spec.study.sampler.type == "grid",
                 sampler_for=(lambda number: searchspace.build_sampler(
                     spec.study.sampler, spec.searched, str(spec.source), number))
                 if searchspace.reseeds(spec.study.sampler) else None,
                 clock=clock, lock=target_of(spec.storage, storage), identity=identity)


def check_not_moved(spec: Spec, trials: Sequence[optuna.trial.FrozenTrial], host: str) -> None:
    """UsageError if this host last ran the study's trials in another `output_dir` that still
    holds them (its `study.json` names the study): changed in the study file, not moved, its
    lineages would start over without their checkpoints. A folder moved (the old one gone)
    is fine."""
    for t in sorted(trials, key=lambda t: -t.number):
        record = OwnerRecord.of(t.user_attrs)
        if record is None or record.dir is None or record.owner.host != host:
            continue
        old = Path(record.dir).parent.parent  # <output_dir>/trials/<n>
        found = folders.read_marker(old)
        if (os.path.realpath(old) != os.path.realpath(spec.output_dir) and found is not None
                and found.study == spec.study.name):
            raise UsageError(
                f"{spec.source}: study.output_dir: {spec.output_dir} is not where this study's "
                f"trials ran ({old}, which still holds their folders and checkpoints): set it "
                f"back, or move {old} to {spec.output_dir}, then run again")
        return
