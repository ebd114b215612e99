"""The store against real SQLite storage: ownership on record before the trainer starts, the
rules that find a dead driver's trials, and the private Optuna APIs it relies on."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import study_dict
from optuna.trial import TrialState

from sweep import config, searchspace, store
from sweep.store import Owner, Store, open_storage, open_study

HOST = "this-host"


def make_store(tmp_path: Path, owner: Owner | None = None, **sections) -> Store:
    path = tmp_path / "study.yaml"
    data = study_dict(study={"heartbeat_interval": 1, "reclaim_after": 2, **sections})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = config.load(path)
    study = open_study(spec, open_storage(spec))
    return Store(study, owner or Owner.me(HOST), spec.study.reclaim_seconds)


def dead_owner() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return Owner(HOST, proc.pid, time.time())


def searched(store_: Store) -> dict:
    return {"x": searchspace.FloatParam(type="float", low=0.0, high=1.0)}


def test_private_optuna_apis_sweep_relies_on_still_exist_and_behave(tmp_path):
    """The shim's contract: fails first when an Optuna upgrade moves one of them."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    s = make_store(tmp_path)
    study = s.study
    assert is_heartbeat_enabled(study._storage)
    assert isinstance(study._study_id, int)
    trial = study.ask()
    assert isinstance(trial._trial_id, int)
    assert study.get_trials(deepcopy=False)[0]._trial_id == trial._trial_id
    study._storage.record_heartbeat(trial._trial_id)
    assert study._storage._get_stale_trial_ids(study._study_id) == []
    assert "in_optimize_loop" in vars(study._thread_local) or hasattr(
        study._thread_local, "in_optimize_loop")
    assert study._stop_flag is False
    # a sampler's stop() under ask/tell is allowed once marked as in optimize()
    study._thread_local.in_optimize_loop = True
    study.stop()
    study._thread_local.in_optimize_loop = False
    assert study._stop_flag is True
    assert list(inspect.signature(optuna.Trial.__init__).parameters)[1:] == ["study", "trial_id"]
    # Study.ask less its queue read; Study.tell less its read-back
    assert "cached_all_trials" in vars(study._thread_local)
    from optuna.study._tell import _tell_with_warning

    assert {"study", "trial", "value_or_values", "state", "skip_if_finished"} <= set(
        inspect.signature(_tell_with_warning).parameters)
    # what store._Storage builds on: Optuna's cache, and the steps of its RDBStorage's
    # writes, run in one transaction of sweep's instead of one each
    from optuna.storages._cached_storage import _CachedStorage, _StudyInfo

    assert {"param_distribution", "trials"} <= set(vars(_StudyInfo()))
    cached = vars(study._storage)
    assert {"_studies", "_lock", "_trial_id_to_study_id_and_number"} <= set(cached)
    assert callable(_CachedStorage._add_trials_to_cache)
    rdb_type = optuna.storages.RDBStorage
    for name, params in {
        "_get_prepared_new_trial": ["study_id", "template_trial", "session"],
        "_set_trial_param_without_commit": ["session", "trial_id", "param_name",
                                            "param_value_internal", "distribution",
                                            "previous_distribution"],
        "_set_trial_attr_without_commit": ["session", "model_cls", "trial_id", "key", "value"],
        "_set_trial_value_without_commit": ["session", "trial", "objective", "value"],
        "check_trial_is_updatable": ["trial_id", "trial_state"],
    }.items():
        assert list(inspect.signature(getattr(rdb_type, name)).parameters)[1:] == params, name
    # the budget lock finds the database behind Optuna's cached storage
    assert study._storage._backend.engine.url.get_backend_name() == "sqlite"
    # a trial's attributes written in one transaction, as Trial.set_user_attr would
    trial.set_user_attr("a", 0)
    store._set_user_attrs(study, trial._trial_id, {"a": 1, "b": [2, "x"]})
    assert study.get_trials(deepcopy=False)[0].user_attrs == {"a": 1, "b": [2, "x"]}
    assert isinstance(trial._cached_frozen_trial.user_attrs, dict)  # what Store.tell updates
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        store._set_user_attrs(study, trial._trial_id, {"a": 2, "c": 3})
    # the trials counted by state in one query, as Optuna reads them
    study.ask()
    study.enqueue_trial({"x": 0.5})
    other = optuna.create_study(study_name="other", storage=study._storage)
    other.ask()
    assert s._count_by_state() == {TrialState.COMPLETE: 1, TrialState.RUNNING: 1,
                                   TrialState.WAITING: 1}
    assert s.counts() == store.Counts(1, 1, 0, 1)
    assert s._settled[0] == trial._trial_id  # the finished first trial is not read again
    # no trial appears below that line later: Optuna creates trials holding the study's row
    assert "for_update=True" in inspect.getsource(
        optuna.storages.RDBStorage._create_new_trial)
    study.tell(study.ask(), 2.0)  # the queued one
    assert s.counts() == store.Counts(2, 1, 0, 0)
    # a new trial's heartbeat and owner in one transaction, as Optuna's record_heartbeat and
    # set_user_attr would write them; again (the heartbeat exists): Optuna's way
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    fresh = study.ask()
    for owner in ({"pid": 1}, {"pid": 2}):
        store._set_user_attrs(study, fresh._trial_id, {store.OWNER: owner}, beat=True)
        with _create_scoped_session(study._storage._backend.scoped_session) as session:
            beat = models.TrialHeartbeatModel.where_trial_id(fresh._trial_id, session)
            assert beat is not None and beat.heartbeat is not None
        assert study._storage.get_trial(fresh._trial_id).user_attrs == {store.OWNER: owner}


def watch(storage) -> list[str]:
    """The statements a database storage runs from now on, and "COMMIT" at each commit."""
    import sqlalchemy

    seen: list[str] = []
    engine = storage._backend.engine
    sqlalchemy.event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    sqlalchemy.event.listen(engine, "commit", lambda *a: seen.append("COMMIT"))
    return seen


def test_a_running_trial_is_read_from_its_copy_written_through(tmp_path):
    """`store._Storage` keeps a copy of each trial its driver runs, written through: every
    read of it (Optuna's at each ask, at each tell, a pruner's at each report) is what the
    database would give, with no query, until the trial is told."""
    s = make_store(tmp_path)
    storage = s.study._storage
    assert isinstance(storage, store._Storage)
    rdb = storage._backend
    seen = watch(storage)
    space = {"x": searchspace.FloatParam(type="float", low=0.0, high=1.0),
             "lr": searchspace.FloatParam(type="float", low=1e-5, high=1.0, log=True),
             "n": searchspace.IntParam(type="int", low=1, high=9, step=2),
             "opt": searchspace.CategoricalParam(type="categorical", choices=["adam", None, 3])}
    for _ in range(2):  # the second: the study knows the distributions (Optuna's cache)
        seen.clear()
        asked = s.ask(space, gpu=0, trial_dir=str, queued=False)
        # the trial with its owner and heartbeat, then its four params: two transactions
        assert seen.count("COMMIT") == 2
        assert sum(x.startswith("INSERT INTO trial_params") for x in seen) in (1, 4)
    trial, trial_id = asked.trial, asked.trial._trial_id

    def read_alike() -> None:
        seen.clear()
        mine = storage.get_trial(trial_id)
        assert seen == []
        assert mine == rdb.get_trial(trial_id)
        mine.user_attrs["mutated"] = True  # a caller's change is not the storage's
        mine.params.clear()
        assert storage.get_trial(trial_id) == rdb.get_trial(trial_id)

    read_alike()
    trial.report(0.5, 0)
    trial.report(float("inf"), 3)
    read_alike()
    trial.set_user_attr("pair", (1, {"k": [2.5]}))  # read back from JSON as a list
    storage.set_trial_system_attr(trial_id, "grid_id", 7)
    read_alike()
    assert not trial.should_prune()
    # the tell: its attributes, values and state in one transaction, then read from the
    # database (the copy is gone)
    seen.clear()
    assert s.tell(trial, TrialState.COMPLETE, [0.25],
                  {"gpu": 0, "exit_code": 0, "peak": float("nan")})
    assert seen.count("COMMIT") == 1
    told = rdb.get_trial(trial_id)
    assert (told.state, told.values, told.user_attrs["gpu"]) == (TrialState.COMPLETE, [0.25], 0)
    assert "peak" not in told.user_attrs
    assert storage.get_trial(trial_id) == told
    assert trial_id not in storage._mine


@pytest.fixture
def far_time_zone(monkeypatch):
    """This process in UTC+14 for the test."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def stored_rows(storage, trial_id: int) -> dict[str, list[dict]]:
    """Every row of a trial in Optuna's tables, less their ids and its number; each time
    (naive UTC, as Optuna stores them) checked to be within a minute of now, then left out."""
    import sqlalchemy

    utc_now = datetime.now(timezone.utc).replace(tzinfo=None)
    out: dict[str, list[dict]] = {}
    with storage._backend.engine.connect() as connection:
        for table in ("trials", "trial_values", "trial_user_attributes", "trial_params",
                      "trial_system_attributes", "trial_heartbeats",
                      "trial_intermediate_values"):
            rows = []
            for row in connection.execute(sqlalchemy.text(
                    f"SELECT * FROM {table} WHERE trial_id = :i"), {"i": trial_id}).mappings():
                kept = {}
                for k, v in row.items():
                    if k in ("datetime_start", "datetime_complete", "heartbeat"):
                        assert abs(datetime.fromisoformat(v) - utc_now) < timedelta(minutes=1)
                    elif not k.endswith("_id") and k != "number":
                        kept[k] = v
                rows.append(kept)
            out[table] = sorted(rows, key=repr)
    return out


@pytest.mark.parametrize("told", [("COMPLETE", [float("-inf")]), ("FAIL", None)])
def test_what_sweep_writes_in_one_transaction_is_what_optuna_writes_in_several(
        tmp_path, told, far_time_zone):
    """`store._Storage`'s own transactions (a trial with its owner and heartbeat; its params
    and a sampler's notes; its attributes with its state) leave the rows Optuna's own calls
    leave: checked against the installed Optuna's RDBStorage, table by table, in a time zone
    far from UTC (Optuna stores naive UTC times)."""
    assert time.localtime().tm_gmtoff == 14 * 3600
    s = make_store(tmp_path)
    storage, study_id = s.study._storage, s.study._study_id
    rdb = storage._backend
    state, values = TrialState[told[0]], told[1]
    owner = {"host": "h", "pid": 1, "dir": "/t", "gpu": (0, 1)}
    dist = optuna.distributions.CategoricalDistribution(["a", None, 2.5])
    attrs = {"gpu": 0, "exit_code": 1, "metric_acc": 0.5, "fail_reason": "x"}

    theirs = rdb.create_new_trial(study_id)  # Optuna, one call (and commit) at a time
    rdb.record_heartbeat(theirs)
    rdb.set_trial_user_attr(theirs, store.OWNER, owner)
    rdb.set_trial_param(theirs, "c", 1.0, dist)
    rdb.set_trial_system_attr(theirs, "grid_id", 3)
    for key, value in attrs.items():
        rdb.set_trial_user_attr(theirs, key, value)
    assert rdb.set_trial_state_values(theirs, state, values)

    mine = storage.create_owned_trial(study_id, lambda number: {store.OWNER: owner})
    storage.set_trial_param(mine, "c", 1.0, dist)
    storage.set_trial_system_attr(mine, "grid_id", 3)
    storage.flush(mine)
    storage.stage_user_attrs(mine, attrs)
    assert storage.set_trial_state_values(mine, state, values)

    assert stored_rows(storage, mine) == stored_rows(storage, theirs)
    a, b = rdb.get_trial(theirs), rdb.get_trial(mine)
    assert (b.number, b.state, b.values) == (a.number + 1, a.state, a.values)
    assert (b.params, b.user_attrs, b.system_attrs) == (a.params, a.user_attrs, a.system_attrs)


def test_new_trials_are_numbered_as_optuna_numbers_them_whoever_made_the_others(tmp_path):
    """A trial's number is how many of its study's trials came before it (Optuna's rule),
    with trials made by Optuna's own calls (queued, added, asked) and by sweep's in between,
    and another study's trials interleaved."""
    s = make_store(tmp_path)
    study, storage = s.study, s.study._storage
    other = optuna.create_study(study_name="other", storage=storage)
    made = []
    for i in range(12):
        if i % 4 == 0:
            study.enqueue_trial({"x": 0.5})
        elif i % 4 == 1:
            study.add_trial(optuna.trial.create_trial(
                params={"x": 0.5}, distributions={"x": optuna.distributions.FloatDistribution(
                    0, 1)}, value=1.0))
        elif i % 4 == 2:
            other.ask()
            study.ask()
        made.append(storage.create_owned_trial(study._study_id, lambda number: {"n": number}))
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t._trial_id)
    assert [t.number for t in trials] == list(range(len(trials)))
    for trial_id in made:
        trial = storage.get_trial(trial_id)
        assert trial.user_attrs == {"n": trial.number}
        assert storage._backend.get_trial(trial_id).number == trial.number


def test_a_trial_failed_by_another_driver_is_not_told_again_from_a_stale_copy(tmp_path):
    """The copy says RUNNING; another driver, which took this one for dead, has failed the
    trial: the tell writes nothing and says so, and the trial is read from the database."""
    s = make_store(tmp_path)
    asked = s.ask(searched(s), gpu=0, trial_dir=str)
    other = Store(optuna.load_study(study_name=s.study.study_name,
                                    storage=s.study._storage._backend), Owner("b", 1, 0.0), 2)
    [theirs] = other.study.get_trials(deepcopy=False)
    assert other.fail_orphan(store.Orphan(theirs, "driver died", None))
    assert s.tell(asked.trial, TrialState.COMPLETE, [1.0], {"exit_code": 0}) == (False, False)
    trial = s.study._storage.get_trial(asked.trial._trial_id)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == "driver died" and "exit_code" not in trial.user_attrs
    assert s.study._storage._staged == {}


@pytest.mark.parametrize("known", [False, True])
def test_a_param_whose_distribution_changed_is_refused_as_optuna_refuses_it(tmp_path, known):
    """The params written together at the end of the ask are checked as Optuna checks each:
    against the distribution the study has under that name (`known`: as this process
    remembers it; else as read from the database). The trial fails, with no params."""
    s = make_store(tmp_path)
    if known:
        s.ask(searched(s), gpu=0, trial_dir=str, queued=False)
    else:
        s.study.add_trial(optuna.trial.create_trial(
            params={"x": 0.5}, distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
            value=1.0))
    changed = {"y": searchspace.IntParam(type="int", low=0, high=3),
               "x": searchspace.CategoricalParam(type="categorical", choices=["a", "b"])}
    with pytest.raises(ValueError, match="distribution"):
        s.ask(changed, gpu=0, trial_dir=str, queued=False)
    failed = s.study.get_trials(deepcopy=False)[-1]
    assert failed.state == TrialState.FAIL and failed.params == {}
    storage = s.study._storage
    assert failed._trial_id not in storage._mine and failed._trial_id not in storage._pending


def test_ownership_is_on_record_before_the_params_and_the_trainer(tmp_path):
    """The trial, its first heartbeat and its owner in one commit; its params after it."""
    s = make_store(tmp_path)
    seen = watch(s.study._storage)
    asked = s.ask(searched(s), gpu=3, trial_dir=lambda number: f"/trials/{number}",
                  queued=False)  # the driver's ask when it has seen no queued trial
    frozen = s.study.get_trials(deepcopy=False)[asked.number]
    commits = [i for i, x in enumerate(seen) if x == "COMMIT"]
    first = seen[:commits[0]]
    assert [x.split("(")[0].strip() for x in first if x.startswith("INSERT")] == [
        "INSERT INTO trials", "INSERT INTO trial_heartbeats", "INSERT INTO trial_user_attributes"]
    assert any(x.startswith("INSERT INTO trial_params") for x in seen[commits[0]:])
    owner = frozen.user_attrs[store.OWNER]
    assert owner == {"host": HOST, "pid": os.getpid(), "started": s.owner.started, "gpu": 3,
                     "dir": "/trials/0"}
    assert 0 <= asked.params["x"] <= 1 and (asked.attempt, asked.origin) == (0, 0)
    assert s.orphans(set())[0] == []  # a live driver's trial is nobody's orphan


def test_a_trial_cut_right_after_ask_is_reclaimed_once_the_grace_has_passed(tmp_path):
    """Defect 1 of issue 8: no owner and no heartbeat left a RUNNING trial forever."""
    s = make_store(tmp_path)
    orphan = s.study.ask()  # the driver died before its first heartbeat
    found, wait = s.orphans(set())
    assert found == [] and wait is not None and 0 < wait <= 2
    later = datetime.now() + timedelta(seconds=2.5)
    found, wait = s.orphans(set(), now=later)
    assert [o.trial.number for o in found] == [orphan.number] and wait is None
    assert "no owner" in found[0].reason
    assert s.fail_orphan(found[0])
    assert not s.fail_orphan(found[0])  # told once only
    states = [t.state for t in s.study.get_trials(deepcopy=False)]
    assert states == [TrialState.FAIL]  # it had no params yet: nothing to queue again


def test_a_dead_driver_on_this_host_is_reclaimed_at_once_a_live_one_never(tmp_path):
    dead = make_store(tmp_path, owner=dead_owner())
    cut = dead.ask(searched(dead), gpu=0, trial_dir=lambda n: f"/d/{n}")
    live = Store(dead.study, Owner(HOST, os.getpid(), 0.0), 2)  # pid alive, heartbeats late
    mine = live.ask(searched(live), gpu=1, trial_dir=lambda n: f"/d/{n}")
    time.sleep(2.5)  # both heartbeats are now stale
    me = Store(dead.study, Owner.me(HOST), 2)
    found, _ = me.orphans(set())
    assert [(o.trial.number, o.trial_dir) for o in found] == [(cut.number, f"/d/{cut.number}")]
    assert found[0].reason.startswith("driver died (pid")
    assert mine.number not in [o.trial.number for o in found]


def test_another_hosts_trial_is_reclaimed_when_its_heartbeat_is_stale(tmp_path):
    other = make_store(tmp_path, owner=Owner("elsewhere", 1, 0.0))
    theirs = other.ask(searched(other), gpu=0, trial_dir=str)
    me = Store(other.study, Owner.me(HOST), 2)
    assert me.orphans(set())[0] == []
    time.sleep(3.2)  # SQLite's clock for heartbeats counts whole seconds
    found, _ = me.orphans(set())
    assert [o.trial.number for o in found] == [theirs.number]
    assert found[0].reason == "driver on elsewhere died (no heartbeat)"
    assert found[0].trial_dir is None  # another host's processes are not ours to kill


def test_an_orphan_is_queued_again_with_the_params_it_was_given(tmp_path):
    """A queued trial whose driver died before it wrote the params it was given is queued
    again with those params (not with what it wrote, to be sampled afresh under its name); a
    trial whose driver died before it had any params is not queued again (no trainer ran)."""
    s = make_store(tmp_path)
    s.study.enqueue_trial({"x": 0.125})
    queued = s.study.ask()  # taken to run; its param not written yet
    fresh = s.study.ask()
    for trial in (queued, fresh):
        frozen = s.study._storage.get_trial(trial._trial_id)
        assert frozen.params == {}
        assert s.fail_orphan(store.Orphan(frozen, "driver died", None))
    waiting = [t for t in s.study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"x": 0.125}]
    assert waiting[0].user_attrs == {"retry_of": queued.number, "attempt": 1}


def test_a_trial_whose_params_cannot_be_sampled_is_told_fail(tmp_path):
    s = make_store(tmp_path)
    s.study.enqueue_trial({"x": "abc"})
    with pytest.raises(ValueError):
        s.ask(searched(s), gpu=0, trial_dir=str)
    [trial] = s.study.get_trials(deepcopy=False)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["fail_reason"].startswith("could not start the trial: ")


def test_a_changed_metric_is_refused_like_a_changed_direction(tmp_path):
    make_store(tmp_path)
    path = tmp_path / "study.yaml"
    data = study_dict(study={"metric": "other"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = config.load(path)
    with pytest.raises(store.UsageError, match=r"study\.metric: .*\['score'\].*\['other'\]"):
        open_study(spec, open_storage(spec))


@pytest.mark.slow
def test_drivers_starting_at_once_on_a_new_database_all_open_it(tmp_path):
    """Four processes create the schema of one new SQLite file at the same moment, six times
    over (six new files, a second apart; each process imports once): none fails ("table ...
    already exists" was seen in CI)."""
    code = (
        "import sys, time\n"
        "from sweep import config\n"
        "from sweep.store import open_storage, open_study\n"
        "at = float(sys.argv[1])\n"
        "for i, path in enumerate(sys.argv[2:]):\n"
        "    spec = config.load(path)\n"
        "    time.sleep(max(0, at + i - time.time()))\n"
        "    open_study(spec, open_storage(spec))\n"
    )
    paths = []
    for round_ in range(6):
        path = tmp_path / f"race{round_}.yaml"
        path.write_text(yaml.safe_dump(study_dict(study={"name": f"race{round_}"})))
        paths.append(str(path))
    at = time.time() + 4.0  # after the imports, all at once
    procs = [subprocess.Popen([sys.executable, "-c", code, str(at), *paths],
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
