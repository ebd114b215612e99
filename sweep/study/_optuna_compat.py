"""The few things sweep needs from Optuna that have no public form: each pinned by a contract test
(tests/e2e/test_optuna_compat.py) on SQLite, PostgreSQL, a journal file and the gRPC proxy.

No other module of sweep imports a private Optuna name; the `optuna` requirement in
pyproject.toml is bounded to the versions that test has passed on.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

# The message of Study.stop() called outside optimize(): a sampler that has searched its whole
# space (GridSampler, BruteForceSampler) calls it from `after_trial`, after the trial's state is
# written (Optuna's tell writes it in a `finally`).
_STOP_OUTSIDE_OPTIMIZE = "`Study.stop` is supposed to be invoked"


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial (what `BaseStorage` methods take): no public attribute."""
    return int(trial._trial_id)


def stale_trial_ids(storage: optuna.storages.RDBStorage, study_id: int) -> set[int]:
    """Ids of the study's RUNNING trials whose last heartbeat is older than the storage's grace
    period, by the database's clock; trials that never had a heartbeat are not among them.
    (`optuna.storages.fail_stale_trials` would fail them all at once, a live driver's too.)"""
    return set(storage._get_stale_trial_ids(study_id))


def tell(study: optuna.Study, trial: optuna.Trial, values: list[float] | None,
         state: TrialState) -> bool:
    """`study.tell(trial, values, state=state)` without its last step, a second read of the
    trial to return a copy of it that sweep does not use (one storage read per tell, not two);
    True if the sampler asked to stop because it has searched its whole space (the trial is
    told all the same). A trial finished before raises ValueError, one finished meanwhile
    UpdateFinishedTrialError, as Optuna's tell does."""
    from optuna.study._tell import _tell_with_warning

    try:
        _tell_with_warning(study, trial, values, state)
    except RuntimeError as e:
        if _STOP_OUTSIDE_OPTIMIZE not in str(e):
            raise
        return True
    return False


def add_storage_service(server: Any, storage: optuna.storages.BaseStorage) -> None:
    """Serve Optuna's gRPC storage API for `storage` on a `grpc.Server` of the caller's
    (Optuna's own `run_grpc_proxy_server` blocks and hides the port it bound)."""
    from optuna.storages._grpc.auto_generated.api_pb2_grpc import (
        add_StorageServiceServicer_to_server,
    )
    from optuna.storages._grpc.servicer import OptunaStorageProxyService

    add_StorageServiceServicer_to_server(OptunaStorageProxyService(storage), server)
