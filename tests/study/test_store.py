"""The store against real SQLite storage: ownership on record before the trainer starts, the
rules that find a dead driver's trials (the window Optuna's public ask leaves closed by rule),
and a study file deleted or replaced under the driver."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from conftest import study_dict
from optuna.trial import TrialState

from sweep._core import names
from sweep._core.errors import UsageError
from sweep.spec import config, searchspace
from sweep.study import _carried, ownership
from sweep.study._optuna_compat import trial_id
from sweep.study.attrs import Owner
from sweep.study.connect import connect
from sweep.study.opening import open_study
from sweep.study.ownership import Judged, Sighting, judge
from sweep.study.storage import StudyFileReplaced, open_storage
from sweep.study.store import Store

HOST = "this-host"


def make_store(tmp_path: Path, owner: Owner | None = None, clock=time.monotonic,
               **sections) -> Store:
    path = tmp_path / "study.yaml"
    data = study_dict(study={"heartbeat_interval": 1, "reclaim_after": 2, **sections})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return connect(config.load(path), owner or Owner.me(HOST), clock=clock)


def dead_owner() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return Owner(HOST, proc.pid, time.time())


def searched(store_: Store) -> dict:
    return {"x": searchspace.FloatParam(type="float", low=0.0, high=1.0)}


def watch(s: Store) -> list[str]:
    """The statements a database store runs from now on, and "COMMIT" at each commit."""
    import sqlalchemy

    seen: list[str] = []
    engine = s.storage.engine  # type: ignore[attr-defined]
    sqlalchemy.event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    sqlalchemy.event.listen(engine, "commit", lambda *a: seen.append("COMMIT"))
    return seen


def test_a_trial_failed_by_another_driver_is_not_told_again(tmp_path):
    """Another driver, which took this one for dead, has failed the trial: the tell writes
    nothing and says so."""
    s = make_store(tmp_path)
    asked = s.ask(searched(s), gpu=0, trial_dir=str)
    other = connect(config.load(tmp_path / "study.yaml"), Owner("b", 1, 0.0), 2)
    [theirs] = other.study.get_trials(deepcopy=False)
    assert other.fail_orphan(ownership.Orphan(theirs, "driver died", None))
    assert s.tell(asked.trial, TrialState.COMPLETE, [1.0], {names.EXIT_CODE: 0}) == (False, False)
    assert s.tell(asked.trial, TrialState.FAIL, None, {names.EXIT_CODE: 0}) == (False, False)
    trial = s.storage.get_trial(trial_id(asked.trial))
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs[names.FAIL_REASON] == "driver died"
    assert names.EXIT_CODE not in trial.user_attrs


def test_a_param_whose_distribution_changed_is_refused_as_optuna_refuses_it(tmp_path):
    """Optuna refuses a param whose distribution changed under its name: the trial fails."""
    s = make_store(tmp_path)
    s.ask(searched(s), gpu=0, trial_dir=str)
    changed = {"x": searchspace.CategoricalParam(type="categorical", choices=["a", "b"])}
    with pytest.raises(ValueError, match="distribution"):
        s.ask(changed, gpu=0, trial_dir=str)
    failed = s.study.get_trials(deepcopy=False)[-1]
    assert failed.state == TrialState.FAIL and failed.params == {}
    assert failed.user_attrs[names.FAIL_REASON].startswith("could not start the trial: ")


def test_the_study_names_its_objectives_for_optuna_dashboard(tmp_path):
    """`study.set_metric_names` from study.metric: Optuna's trials_dataframe says value_score."""
    s = make_store(tmp_path)
    assert s.study.metric_names == ["score"]
    s.tell(s.ask(searched(s), gpu=0, trial_dir=str).trial, "COMPLETE", [0.5], {"gpu": 0})
    assert "value_score" in s.study.trials_dataframe().columns


def test_ownership_is_on_record_before_the_params_and_the_trainer(tmp_path):
    """Optuna's ask, then the trial's first heartbeat, then its owner, each committed, and only
    then its params: a trainer never starts for a trial nobody owns on record."""
    s = make_store(tmp_path)
    seen = watch(s)
    asked = s.ask(searched(s), gpu=3, trial_dir=lambda number: f"/trials/{number}")
    frozen = s.study.get_trials(deepcopy=False)[asked.number]
    writes = [x.split("(")[0].split(" SET")[0].strip() for x in seen
              if x.startswith(("INSERT", "UPDATE"))]
    heartbeat = writes.index("INSERT INTO trial_heartbeats")
    owner_at = writes.index("INSERT INTO trial_user_attributes")
    params_at = writes.index("INSERT INTO trial_params")
    assert writes.index("INSERT INTO trials") < heartbeat < owner_at < params_at
    assert "COMMIT" in seen[seen.index(seen[0]):]  # each step is its own commit
    owner = frozen.user_attrs[names.OWNER]
    assert owner == {"host": HOST, "pid": os.getpid(), "started": s.owner.started, "gpu": 3,
                     "dir": "/trials/0"}
    assert 0 <= asked.params["x"] <= 1 and (asked.attempt, asked.origin) == (0, 0)
    assert s.orphans(set())[0] == []  # a live driver's trial is nobody's orphan


class Killed(BaseException):
    """A SIGKILL of the driver at that line: nothing after it runs, not even `except`."""


def test_a_trial_cut_right_after_its_params_has_its_run_id(tmp_path, monkeypatch):
    """The window found by the SIGKILL stress test: killed after its params were written but
    before its run id, a trial's continuation had no run id (W&B and SWEEP_RUN_ID lost the
    lineage). The run id is written before the owner record and the params."""
    s = make_store(tmp_path)

    def killed(*args: object) -> None:
        raise Killed

    monkeypatch.setattr(_carried, "curve", killed)
    with pytest.raises(Killed):
        s.ask(searched(s), gpu=0, trial_dir=lambda number: f"/trials/{number}")
    [frozen] = s.study.get_trials(deepcopy=False)
    assert frozen.state == TrialState.RUNNING and frozen.params
    assert frozen.user_attrs[names.RUN_ID].startswith("probe-0-")


def test_a_trial_cut_between_ask_and_its_owner_is_reclaimed_after_reclaim_after(tmp_path):
    """The window Optuna's public ask leaves (RUNNING, no heartbeat, no owner yet) is closed
    by rule: on a database, a trial without an owner is an orphan once it started
    `reclaim_after` (2 s) ago; forced here with the clock given to `orphans`, exactly."""
    s = make_store(tmp_path)
    orphan = s.study.ask()  # the driver died before its first heartbeat
    start = s.study.get_trials(deepcopy=False)[0].datetime_start
    found, wait = s.orphans(set(), now=start + timedelta(seconds=1.5))
    assert found == [] and wait == 0.5
    found, wait = s.orphans(set(), now=start + timedelta(seconds=2))
    assert [o.trial.number for o in found] == [orphan.number] and wait is None
    assert found[0].reason == "driver died before recording itself (no owner after 2 s)"
    assert s.fail_orphan(found[0])
    assert not s.fail_orphan(found[0])  # told once only
    states = [t.state for t in s.study.get_trials(deepcopy=False)]
    assert states == [TrialState.FAIL]  # it had no params yet: nothing to queue again


def test_on_a_journal_a_trial_cut_before_its_owner_is_reclaimed_by_this_drivers_clock(
        tmp_path):
    """Without Optuna's heartbeats the same window is timed on this driver's own clock: the
    trial is an orphan once it has been seen silent, with no owner, for `reclaim_after`."""
    now = [100.0]
    s = make_store(tmp_path, clock=lambda: now[0], storage=f"journal:///{tmp_path}/j.log")
    orphan = s.study.ask()
    assert s.orphans(set()) == ([], 2.0)
    now[0] += 1.5
    assert s.orphans(set()) == ([], 0.5)
    now[0] += 0.5
    found, wait = s.orphans(set())
    assert [o.trial.number for o in found] == [orphan.number] and wait is None
    assert found[0].reason == ("driver died before recording itself (no owner, no heartbeat "
                               "for 2 s)")


def test_a_dead_driver_on_this_host_is_reclaimed_at_once_a_live_one_never(tmp_path):
    dead = make_store(tmp_path, owner=dead_owner())
    cut = dead.ask(searched(dead), gpu=0, trial_dir=lambda n: f"/d/{n}")
    live = Store(dead.study, dead.storage, Owner(HOST, os.getpid(), 0.0), 2)  # heartbeats late
    mine = live.ask(searched(live), gpu=1, trial_dir=lambda n: f"/d/{n}")
    time.sleep(2.5)  # both heartbeats are now stale
    me = Store(dead.study, dead.storage, Owner.me(HOST), 2)
    found, _ = me.orphans(set())
    assert [(o.trial.number, o.trial_dir) for o in found] == [(cut.number, f"/d/{cut.number}")]
    assert found[0].reason.startswith("driver died (pid")
    assert mine.number not in [o.trial.number for o in found]


def test_another_hosts_trial_is_reclaimed_when_its_heartbeat_is_stale(tmp_path):
    other = make_store(tmp_path, owner=Owner("elsewhere", 1, 0.0))
    theirs = other.ask(searched(other), gpu=0, trial_dir=str)
    me = Store(other.study, other.storage, Owner.me(HOST), 2)
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
        frozen = s.storage.get_trial(trial_id(trial))
        assert frozen.params == {}
        assert s.fail_orphan(ownership.Orphan(frozen, "driver died", None))
    waiting = [t for t in s.study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert [t.system_attrs[names.FIXED_PARAMS] for t in waiting] == [{"x": 0.125}]
    # its continuation: a dead driver spends no retry (retries stays 0)
    assert waiting[0].user_attrs == {names.RETRY_OF: queued.number, names.ATTEMPT: 1,
                                     names.CONTINUES: queued.number, names.RETRIES: 0}


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_study_file_deleted_or_replaced_under_the_driver_stops_it(tmp_path, change):
    """Issue 26 item 2: the driver kept writing to the unlinked file. Now the next ask, tell
    or look at the study raises StudyFileReplaced (a lost storage: one line, exit 1), and a
    trial it cannot tell is not written into the old file."""
    s = make_store(tmp_path)
    asked = s.ask(searched(s), gpu=0, trial_dir=str)
    db = tmp_path / "probe.db"
    assert s.identity is not None and s.identity.path == db
    if change == "deleted":
        db.unlink()
    else:
        other = tmp_path / "other.db"
        other.write_bytes(db.read_bytes())
        os.replace(other, db)
    for step in (lambda: s.ask(searched(s), gpu=0, trial_dir=str), s.counts,
                 lambda: s.orphans(set()),
                 lambda: s.tell(asked.trial, "COMPLETE", [1.0], {names.EXIT_CODE: 0})):
        with pytest.raises(StudyFileReplaced, match=f"the study file {db} was {change}"):
            step()
    s.tell_failed(asked.trial, "interrupted")  # quietly not told
    assert asked.trial.user_attrs.get(names.FAIL_REASON) is None


def test_a_trial_whose_params_cannot_be_sampled_is_told_fail(tmp_path):
    s = make_store(tmp_path)
    s.study.enqueue_trial({"x": "abc"})
    with pytest.raises(ValueError):
        s.ask(searched(s), gpu=0, trial_dir=str)
    [trial] = s.study.get_trials(deepcopy=False)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs[names.FAIL_REASON].startswith("could not start the trial: ")


def test_a_changed_metric_is_refused_like_a_changed_direction(tmp_path):
    make_store(tmp_path)
    path = tmp_path / "study.yaml"
    data = study_dict(study={"metric": "other"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = config.load(path)
    with pytest.raises(UsageError, match=r"study\.metric: .*\['score'\].*\['other'\]"):
        open_study(spec, open_storage(spec))


@pytest.mark.slow
def test_drivers_starting_at_once_on_a_new_database_all_open_it(tmp_path):
    """Four processes create the schema of one new SQLite file at the same moment, six times
    over (six new files, a second apart; each process imports once): none fails ("table ...
    already exists" was seen in CI)."""
    code = (
        "import sys, time\n"
        "from sweep.spec import config\n"
        "from sweep.study.opening import open_study\n"
        "from sweep.study.storage import open_storage\n"
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


ELSEWHERE = Owner("elsewhere", 7, 1.0)


@pytest.mark.parametrize(("look", "judged"), [
    # on this host: a dead driver's trial at once, a live one's never (late heartbeats too)
    (Sighting(Owner(HOST, 7, 1.0), False, False, True), Judged("driver died (pid 7 on this-host)")),
    (Sighting(Owner(HOST, 7, 1.0), True, True, True), Judged()),
    # elsewhere: silent past the grace
    (Sighting(ELSEWHERE, None, True, True), Judged("driver on elsewhere died (no heartbeat)")),
    (Sighting(ELSEWHERE, None, False, True, age=100.0), Judged()),
    (Sighting(ELSEWHERE, None, True, False), Judged("driver on elsewhere died (no heartbeat)")),
    # without Optuna's heartbeats, a fresh look watches the `beat` first
    (Sighting(ELSEWHERE, None, False, False, first_look_left=1.25), Judged(wait=1.25)),
    (Sighting(ELSEWHERE, None, False, False, first_look_left=None), Judged()),
    # no owner on record: by its start on a database, by its silence elsewhere
    (Sighting(None, None, False, True, age=1.5), Judged(wait=0.5)),
    (Sighting(None, None, False, True, age=2.0),
     Judged("driver died before recording itself (no owner after 2 s)")),
    (Sighting(None, None, False, True, age=None), Judged()),
    (Sighting(None, None, False, False, silence_left=0.75), Judged(wait=0.75)),
    (Sighting(None, None, True, False),
     Judged("driver died before recording itself (no owner, no heartbeat for 2 s)")),
    (Sighting(None, None, True, True),
     Judged("driver died before recording itself (no owner, no heartbeat for 2 s)")),
])
def test_the_reclaim_rules(look, judged):
    assert judge(look, reclaim_after=2.0) == judged


@pytest.mark.parametrize("cut", [(KeyboardInterrupt, "before"), (SystemExit, "after")])
def test_a_reclaimer_killed_at_its_fail_loses_no_point(tmp_path, cut):
    """Hostile pass: a reclaimer killed between telling FAIL and queueing the retry lost the
    point. The retry is queued first, once: a reclaimer cut just before or just after its
    FAIL leaves the retry queued, and the next reclaimer tells the orphan FAIL (if it is
    still RUNNING) without queueing a second one; the retry runs once."""
    error, when = cut
    dead = make_store(tmp_path, owner=Owner("gone", 1, 0.0))
    asked = dead.ask(searched(dead), gpu=0, trial_dir=str)
    first = connect(config.load(tmp_path / "study.yaml"), Owner("a", 2, 0.0), 2)
    frozen = first.storage.get_trial(trial_id(asked.trial))
    tell_state = first.storage.set_trial_state_values

    def killed(*args, **kwargs):
        if when == "after":
            tell_state(*args, **kwargs)
        raise error()

    first.storage.set_trial_state_values = killed  # type: ignore[method-assign]
    with pytest.raises(error):
        first.fail_orphan(ownership.Orphan(frozen, "driver died", None))
    second = connect(config.load(tmp_path / "study.yaml"), Owner("b", 3, 0.0), 2)
    trials = second.study.get_trials(deepcopy=False)
    orphan_state = TrialState.RUNNING if when == "before" else TrialState.FAIL
    assert [t.state for t in trials] == [orphan_state, TrialState.WAITING]
    assert second.fail_orphan(ownership.Orphan(trials[0], "driver died", None)) == (
        when == "before")
    assert not second.fail_orphan(ownership.Orphan(trials[0], "driver died", None))
    trials = second.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].user_attrs == {names.RETRY_OF: asked.number, names.ATTEMPT: 1,
                                    names.CONTINUES: asked.number, names.RETRIES: 0,
                                    names.RUN_ID: asked.lineage.run_id}
    retry = second.ask(searched(second), gpu=0, trial_dir=str)
    assert (retry.number, retry.params, retry.origin, retry.attempt) == (
        1, asked.params, asked.number, 1)
    assert second.tell(retry.trial, TrialState.COMPLETE, [1.0], {}) == (True, False)
    assert second.counts().waiting == 0 and len(second.study.get_trials()) == 2


def test_a_retry_queued_twice_is_queued_once(tmp_path):
    """`requeue` is idempotent per (origin, attempt): a driver's own retry queued before its
    tell, and a reclaimer's for the same trial, make one trial."""
    s = make_store(tmp_path)
    assert s.requeue({"x": 0.5}, 0, 1)
    assert not s.requeue({"x": 0.5}, 0, 1)
    assert s.requeue({"x": 0.5}, 0, 2)
    assert [t.user_attrs for t in s.study.get_trials(deepcopy=False)] == [
        {names.RETRY_OF: 0, names.ATTEMPT: 1}, {names.RETRY_OF: 0, names.ATTEMPT: 2}]


def test_a_tell_writes_only_the_attributes_the_trial_does_not_hold_already(tmp_path):
    """Each user attribute is a storage write: a continuation queued with its `attempt` and
    `retry_of` is not given them again at its tell; a value that changed is written."""
    s = make_store(tmp_path)
    s.requeue({"x": 0.5}, 0, 1)
    asked = s.ask(searched(s), 0, lambda n: str(tmp_path / str(n)))
    seen = watch(s)
    assert s.tell(asked.trial, TrialState.COMPLETE, [1.0],
                  {names.ATTEMPT: 1, names.RETRY_OF: 0, names.GPU: 3, names.EXIT_CODE: 0}) \
        == (True, False)
    updates = [q for q in seen if q.lstrip().upper().startswith(("INSERT", "UPDATE"))
               and "trial_user_attributes" in q]
    assert len(updates) == 2  # gpu and exit_code
    told = s.study.get_trials(deepcopy=False)[0].user_attrs
    assert {k: told[k] for k in ("attempt", names.RETRY_OF, "gpu", names.EXIT_CODE)} == {
        names.ATTEMPT: 1, names.RETRY_OF: 0, names.GPU: 3, names.EXIT_CODE: 0}


def test_a_beat_is_silent_after_it_stayed_the_same_for_reclaim_after_of_this_drivers_clock():
    now = [100.0]
    watch = ownership.BeatWatch(3.0, lambda: now[0])
    assert not watch.silent(7, 1.5) and watch.first_look_left(7) == 3.0
    now[0] = 102.0
    assert not watch.silent(7, 1.5) and watch.silence_left(7) == 1.0
    now[0] = 103.0
    assert watch.silent(7, 1.5) and watch.first_look_left(7) is None  # unchanged for 3 s
    assert not watch.silent(7, 2.5) and watch.silence_left(7) == 3.0  # it beat again
    watch.keep(set())
    assert watch.silence_left(7) == 0.0 and watch.first_look_left(7) is None  # forgotten
