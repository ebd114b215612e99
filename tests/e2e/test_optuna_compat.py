"""The contract of `sweep.study._optuna_compat` (what sweep needs from Optuna without a public
form), on every storage sweep supports: SQLite, PostgreSQL, a journal file and the gRPC proxy.
It fails first when an Optuna release moves one of them; pyproject.toml bounds `optuna` to what
it has passed on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import optuna
import pytest
from conftest import study_dict
from optuna.trial import TrialState

from sweep.spec import schema
from sweep.spec.storageurl import StorageUrl
from sweep.study import _optuna_compat, proxy
from sweep.study.storage import close_storage, open_storage

KINDS = ["sqlite", "journal", pytest.param("grpc", marks=pytest.mark.grpc),
         pytest.param("postgresql",
                      marks=[pytest.mark.slow, pytest.mark.xdist_group("postgres")])]


@pytest.fixture
def storage(request, tmp_path) -> Iterator[optuna.storages.BaseStorage]:
    """The storage sweep opens for each kind of URL (heartbeats every 1 s, stale after 1 s)."""
    kind, server = request.param, None
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/c.db"
    elif kind == "journal":
        url = f"journal:///{tmp_path}/c.log"
    elif kind == "grpc":  # served by `sweep storage-proxy`'s server, in this process
        server, port = proxy.make_server(
            StorageUrl.parse(f"sqlite:///{tmp_path}/behind.db"), "127.0.0.1", 0, 4)
        url = f"grpc://127.0.0.1:{port}"
    else:
        url = request.getfixturevalue("postgres_url")
    spec = schema.Spec.model_validate(study_dict(study={
        "storage": url, "name": f"c{time.monotonic_ns()}", "heartbeat_interval": 1,
        "reclaim_after": 1}))
    opened = open_storage(spec)
    try:
        yield opened
    finally:
        close_storage(opened)
        if server is not None:
            server.stop(0)


def new_study(storage, sampler=None) -> optuna.Study:
    return optuna.create_study(storage=storage, sampler=sampler,
                               study_name=f"s{time.monotonic_ns()}")


@pytest.mark.parametrize("storage", KINDS, indirect=True)
def test_trial_id_is_the_id_the_storage_takes(storage):
    study = new_study(storage)
    study.enqueue_trial({"x": 0.5})
    trials = [study.ask(), study.ask()]
    frozen = study.get_trials(deepcopy=False)
    for trial, seen in zip(trials, frozen, strict=True):
        key = _optuna_compat.trial_id(trial)
        assert isinstance(key, int) and _optuna_compat.trial_id(seen) == key
        assert storage.get_trial(key).number == trial.number
        storage.set_trial_user_attr(key, "k", trial.number)
    assert [t.user_attrs["k"] for t in study.get_trials(deepcopy=False)] == [0, 1]


@pytest.mark.parametrize("storage", KINDS, indirect=True)
def test_tell_says_when_the_sampler_has_searched_its_whole_space(storage):
    study = new_study(storage, optuna.samplers.GridSampler({"x": [0, 1]}))
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        trial.suggest_int("x", 0, 1)
    assert _optuna_compat.tell(study, first, [1.0], TrialState.COMPLETE) is False
    assert _optuna_compat.tell(study, second, None, TrialState.FAIL) is True  # told all the same
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.COMPLETE,
                                                                   TrialState.FAIL]
    with pytest.raises(ValueError, match="Cannot tell a COMPLETE trial"):
        _optuna_compat.tell(study, first, [2.0], TrialState.COMPLETE)


@pytest.mark.parametrize("storage", KINDS, indirect=True)
def test_tell_stores_what_optunas_tell_stores_and_reads_the_trial_once(storage, monkeypatch):
    study = new_study(storage)
    ours, optunas = study.ask(), study.ask()
    for trial in (ours, optunas):
        trial.suggest_float("x", 0, 1)
        trial.report(0.25, 3)
    reads = []
    monkeypatch.setattr(study._storage, "get_trial", lambda key, _get=study._storage.get_trial:
                        reads.append(key) or _get(key))
    assert _optuna_compat.tell(study, ours, None, TrialState.PRUNED) is False
    assert reads == [_optuna_compat.trial_id(ours)]
    study.tell(optunas, None, state=TrialState.PRUNED)
    told = study.get_trials(deepcopy=False)
    assert [(t.state, t.values, t.intermediate_values) for t in told] == \
        [(TrialState.PRUNED, [0.25], {3: 0.25})] * 2


@pytest.mark.parametrize("storage", KINDS, indirect=True)
def test_stale_trial_ids_are_those_whose_heartbeat_is_older_than_the_grace(storage):
    """Optuna's heartbeats are a database's (sweep writes its own `beat` elsewhere)."""
    is_database = isinstance(storage, optuna.storages.RDBStorage)
    assert is_database == (storage.__class__.__name__ == "RDBStorage")
    if not is_database:
        assert not hasattr(storage, "record_heartbeat")
        return
    study = new_study(storage)
    study_id = storage.get_study_id_from_name(study.study_name)
    beating, silent, never = study.ask(), study.ask(), study.ask()
    del never  # a RUNNING trial never heartbeaten is not stale
    storage.record_heartbeat(_optuna_compat.trial_id(silent))
    assert _optuna_compat.stale_trial_ids(storage, study_id) == set()
    time.sleep(2.2)  # past the 1 s grace by the database's clock (SQLite's: whole seconds)
    storage.record_heartbeat(_optuna_compat.trial_id(beating))
    assert _optuna_compat.stale_trial_ids(storage, study_id) == {_optuna_compat.trial_id(silent)}
