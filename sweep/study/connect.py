"""The study of a study file opened for one driver: its storage (an unreachable one is one
UsageError), the study created or loaded and checked against the file, and the `Store` the
driver works through."""

from __future__ import annotations

import time
from collections.abc import Callable

from sweep.spec import searchspace
from sweep.spec.schema import Spec
from sweep.study.attrs import (
    Owner,
)
from sweep.study.budget import target_of
from sweep.study.opening import open_study
from sweep.study.storage import (
    FileIdentity,
    close_storage,
    open_storage,
    storage_errors,
    unreachable,
)
from sweep.study.store import Store


def connect(
    spec: Spec, owner: Owner, reclaim_after: float | None = None,
    notes: list[str] | None = None, clock: Callable[[], float] = time.monotonic,
) -> Store:
    """The study of `spec` in its storage, opened (created if new) for the driver `owner`;
    an unreachable storage is a UsageError. What changed since earlier runs, and may, is
    added to `notes`."""
    try:
        storage = open_storage(spec)
    except storage_errors() as e:
        raise unreachable(spec, e) from None
    try:
        study = open_study(spec, storage, notes)
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
