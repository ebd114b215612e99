"""The study in its Optuna storage: opening storages, SQLite and the gRPC proxy, the budget
lock, the store (ask, tell, counts, orphans), ownership and heartbeats, and the one shim over
Optuna's private names (`_optuna_compat`). Imports `_core`, `spec` and `trial`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.study.attrs import Owner, OwnerRecord
    from sweep.study.budget import LOCK_PATIENCE, LockAbandoned
    from sweep.study.connect import check_not_moved
    from sweep.study.counts import Counts, Tally
    from sweep.study.heartbeat import Heartbeat
    from sweep.study.opening import check_stored, sample
    from sweep.study.ownership import Orphan, host_name
    from sweep.study.storage import (
        Found,
        describe,
        find,
        read_study,
        reading,
        storage_errors,
        storage_lost_errors,
        unreachable,
    )
    from sweep.study.store import FINISHED, Asked, Store, Taken

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
