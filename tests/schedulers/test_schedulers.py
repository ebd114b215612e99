"""study.scheduler: the study-file checks, and the decisions (rungs, pause, promote, brackets,
PBT exploit and explore) on lineages read from stored trials."""

from __future__ import annotations

import random
from typing import Any

import optuna
import pytest
import yaml
from conftest import study_dict
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep._core.errors import ConfigError
from sweep.schedulers import _explore, budget, halving, history
from sweep.schedulers.halving import GoOn, Halving, NewConfiguration, Pause, Promote
from sweep.schedulers.history import Standing
from sweep.schedulers.pbt import Pbt, Replace
from sweep.spec import config
from sweep.spec.scheduler import AshaScheduler, HyperbandScheduler, PbtScheduler
from sweep.spec.searchspace import CategoricalParam, FloatParam, IntParam

ASHA = AshaScheduler(type="asha", min_steps=2, max_steps=18, reduction_factor=3)


def load(tmp_path, **sections: Any) -> config.Spec:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(**sections), sort_keys=False))
    return config.load(path)


# ---- the study file -------------------------------------------------------------------


def test_each_scheduler_loads_from_the_study_file(tmp_path):
    spec = load(tmp_path, study={"scheduler": {"type": "asha", "min_steps": 2,
                                               "max_steps": 18, "reduction_factor": 3}})
    assert spec.study.scheduler == ASHA
    spec = load(tmp_path, study={"scheduler": {"type": "hyperband", "min_steps": 1,
                                               "max_steps": 27}})
    assert isinstance(spec.study.scheduler, HyperbandScheduler)
    assert spec.study.scheduler.reduction_factor == 3
    spec = load(tmp_path, study={"scheduler": {"type": "pbt", "population": 4, "interval": 5,
                                               "max_steps": 50}})
    assert spec.study.scheduler == PbtScheduler(type="pbt", population=4, interval=5,
                                                max_steps=50)
    assert load(tmp_path).study.scheduler is None


@pytest.mark.parametrize(("scheduler", "extra", "key", "text"), [
    ({"type": "asha", "min_steps": 18, "max_steps": 18}, {}, "study.scheduler",
     "min_steps (18) must be below max_steps (18)"),
    ({"type": "asha", "min_steps": 2, "max_steps": 18, "reduction_factor": 1}, {},
     "study.scheduler.reduction_factor", "greater than or equal to 2"),
    ({"type": "asha", "min_steps": 2, "max_steps": 18},
     {"pruner": {"type": "median"}}, "study.scheduler", "study.scheduler or study.pruner"),
    ({"type": "pbt", "population": 4, "interval": 5, "max_steps": 50}, {"n_trials": 3},
     "study.n_trials", "below the pbt population (4)"),
    ({"type": "pbt", "population": 4, "interval": 50, "max_steps": 50}, {"n_trials": 8},
     "study.scheduler", "interval (50) must be below max_steps (50)"),
    ({"type": "pbt", "population": 4, "interval": 5, "max_steps": 50, "quantile": 0.7},
     {"n_trials": 8}, "study.scheduler.quantile", "less than or equal to 0.5"),
    ({"type": "median"}, {}, "study.scheduler.type", "one of asha, hyperband, pbt, not "
     "'median'"),
    # hostile pass: pydantic's words ("Input tag ... found using 'type' does not match"), the
    # whole input echoed, a third line "Tuple should have at least 1 item after validation"
    ({"type": "asha" + "x" * 3000}, {}, "study.scheduler.type", "'ashaxxxxxx"),
    ({}, {}, "study.scheduler.type", "required key is missing"),
    ("asha", {}, "study.scheduler", "must be a mapping of keys, not 'asha'"),
    ({"type": "pbt", "population": 4, "interval": 5, "max_steps": 50, "perturb": []},
     {"n_trials": 8}, "study.scheduler.perturb", "give at least 1 (got [])"),
])
def test_a_bad_scheduler_is_one_line_naming_its_key(tmp_path, scheduler, extra, key, text):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, study={"scheduler": scheduler, **extra})
    [problem] = e.value.problems
    assert problem.key.startswith(key), problem
    assert text in problem.message and len(problem.message) < 200, problem


def test_each_bad_item_of_a_list_is_one_line_and_no_more(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, study={"n_trials": 8, "scheduler": {
            "type": "pbt", "population": 4, "interval": 5, "max_steps": 50,
            "perturb": [0, -1]}})
    assert [p.key for p in e.value.problems] == ["study.scheduler.perturb.0",
                                                 "study.scheduler.perturb.1"]


def test_a_scheduler_needs_one_objective(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, study={"direction": None, "metric": None,
                              "directions": ["minimize", "maximize"], "metrics": ["a", "b"],
                              "scheduler": {"type": "asha", "min_steps": 1,
                                            "max_steps": 9}})
    assert [p.message for p in e.value.problems] == [
        "schedulers rank trials by one objective: use direction and metric, not directions "
        "and metrics"]


# ---- lineages read from trials ----------------------------------------------------------

DIST = {"x": FloatDistribution(0.0, 1.0)}


def trial(number: int, curve: dict[int, float], state: TrialState = TrialState.RUNNING,
          x: float = 0.5, **attrs: Any) -> optuna.trial.FrozenTrial:
    t = optuna.trial.create_trial(
        state=state, params={"x": x}, distributions=DIST, intermediate_values=curve,
        user_attrs=attrs, value=list(curve.values())[-1] if state is TrialState.COMPLETE
        else None)
    t.number = number
    return t


def paused(number: int, curve: dict[int, float], **attrs: Any) -> optuna.trial.FrozenTrial:
    return trial(number, curve, TrialState.PRUNED, paused_at=max(curve), **attrs)


def test_lineages_are_read_across_attempts():
    ts = [paused(0, {0: 5.0, 2: 4.0}),
          trial(1, {3: 3.0}, retry_of=0, attempt=1, continues=0),
          trial(2, {0: 9.0, 2: 8.0}, TrialState.PRUNED, paused_at=2),
          trial(3, {}, TrialState.WAITING),
          trial(4, {0: 1.0}, TrialState.FAIL)]
    got = history.read(ts)
    assert {o: v.standing for o, v in got.items()} == {
        0: Standing.RUNNING, 2: Standing.PAUSED, 3: Standing.QUEUED, 4: Standing.DONE}
    assert got[0].curve == {0: 5.0, 2: 4.0, 3: 3.0} and got[0].latest.number == 1
    assert got[0].value_at(1) == 4.0 and got[0].value_at(4) is None
    assert got[2].last_step == 2 and got[2].last_value == 8.0


# ---- successive halving -----------------------------------------------------------------


def test_rungs_are_min_steps_times_powers_of_the_factor_below_max_steps():
    assert halving.rungs(2, 18, 3) == (2, 6)
    assert halving.rungs(1, 27, 3) == (1, 3, 9)
    assert halving.rungs(1, 28, 3) == (1, 3, 9, 27)
    assert halving.rungs(5, 6, 2) == (5,)


def test_top_is_the_best_floor_n_over_rf_ties_to_the_earlier_lineage():
    assert halving.top({0: 3.0, 1: 1.0, 2: 2.0}, 1 / 3, minimize=True) == [1]
    assert halving.top({0: 3.0, 1: 1.0, 2: 2.0}, 1 / 3, minimize=False) == [0]
    assert halving.top({0: 3.0, 1: 1.0}, 1 / 3, minimize=True) == []
    assert halving.top({5: 1.0, 4: 1.0, 3: 2.0}, 1 / 3, minimize=True) == [4]
    assert halving.top({i: float(i) for i in range(9)}, 1 / 3, minimize=True) == [0, 1, 2]


def asha() -> Halving:
    return Halving.of(ASHA, minimize=True)


def test_a_trial_at_a_rung_outside_its_top_is_paused_and_inside_goes_on():
    h = asha()
    # three lineages have reached rung 0 (step 2): only the best (1/3 of 3) goes on
    ts = [paused(0, {2: 5.0}), paused(1, {2: 4.0}), trial(2, {0: 9.0, 1: 8.0, 2: 1.0})]
    assert h.on_report(history.read(ts), 2, before=1, step=2) == GoOn(0)
    ts[2] = trial(2, {2: 6.0})
    assert h.on_report(history.read(ts), 2, before=1, step=2) == Pause(0, 2)
    # the first to reach a rung is paused: floor(1/3) = 0 places at the top
    assert h.on_report(history.read([trial(0, {2: 0.1})]), 0, before=1, step=2) == Pause(0, 2)
    # no rung passed, or a rung passed before (a promoted lineage going on): it goes on
    assert h.on_report(history.read(ts), 2, before=2, step=3) == GoOn()
    assert h.on_report(history.read(ts), 2, before=0, step=1) == GoOn()


def test_a_batch_of_reports_past_two_rungs_decides_at_the_higher():
    h = asha()
    ts = [paused(0, {6: 5.0}), paused(1, {6: 4.0}),
          trial(2, {1: 1.0, 2: 1.0, 6: 7.0})]
    assert h.on_report(history.read(ts), 2, before=1, step=6) == Pause(1, 6)


def test_a_lineage_whose_reports_reach_max_steps_past_a_rung_is_not_paused():
    """Item 9 of issue 38: a trainer whose reports came in one batch from below rung 1 (6)
    to its last step (17 of max_steps 18, counted from 0) has trained to the end: outside the
    top, it still goes on to its result, not paused at its last step; one step short of it,
    it is paused."""
    h = asha()
    ts = [paused(0, {6: 5.0}), paused(1, {6: 4.0}), trial(2, {1: 1.0, 6: 7.0, 17: 7.0})]
    assert h.on_report(history.read(ts), 2, before=1, step=17) == GoOn(1)
    ts[2] = trial(2, {1: 1.0, 6: 7.0, 16: 7.0})
    assert h.on_report(history.read(ts), 2, before=1, step=16) == Pause(1, 16)


def test_a_paused_lineage_now_in_the_top_of_its_rung_is_promoted_top_rung_first():
    h = asha()
    ts = [paused(0, {2: 1.0}), paused(1, {2: 2.0}), paused(2, {2: 3.0})]
    got = history.read(ts)
    assert h.promotable(got) == [Promote(0, 0)]  # 1 of 3
    ts += [paused(3, {2: 0.5, 6: 9.0}), paused(4, {2: 0.7, 6: 8.0}),
           paused(5, {2: 0.6, 6: 1.0}), paused(6, {2: 5.0}), paused(7, {2: 6.0})]
    # rung 1 (step 6): 3 there, lineage 5 is its top; rung 0: 8 there, top 2 = 3 and 5 (not
    # paused at rung 0), so 0 is no longer in the top
    assert h.promotable(history.read(ts)) == [Promote(5, 1)]
    # promoted (its continuation queued or running): no longer promotable
    ts.append(trial(8, {}, TrialState.WAITING, retry_of=5, attempt=1, continues=5))
    assert h.promotable(history.read(ts)) == []


def test_once_no_configuration_can_come_a_rung_that_cannot_grow_promotes_its_best():
    """A finite study: lineage 0 is alone at rung 1 (step 6), where floor(1/3) = 0 places
    are at the top; once n_trials is reached (`closed`) and nothing can still reach rung 1,
    its best continues, else the run would end with no lineage trained to max_steps."""
    h = asha()
    ts = [paused(0, {2: 1.0, 6: 5.0}), paused(1, {2: 2.0}), paused(2, {2: 3.0})]
    assert h.promotable(history.read(ts)) == []
    assert h.promotable(history.read(ts), closed=True) == [Promote(0, 1)]
    assert h.final(history.read(ts), 0, 1) and h.final(history.read(ts), 0, 0)
    # a lineage still running below step 6 may reach rung 1: it is not final yet
    running = [*ts, trial(3, {0: 0.5, 1: 0.5})]
    assert h.promotable(history.read(running), closed=True) == []
    # one that has passed it (a promoted lineage on its way to max_steps) does not hold it
    beyond = [*ts, trial(3, {2: 0.1, 6: 0.2, 7: 0.2})]
    assert h.promotable(history.read(beyond), closed=True) == []  # 3 is rung 1's top now
    # a paused lineage in the top of rung 0 goes first and will reach rung 1: only it
    better = [paused(0, {2: 1.0, 6: 5.0}), paused(1, {2: 0.5}), paused(2, {2: 3.0})]
    assert h.promotable(history.read(better), closed=True) == [Promote(1, 0)]
    # two at a final rung, none at the top by floor(2/3): the better one continues
    two = [paused(0, {2: 1.0, 6: 5.0}), paused(1, {2: 2.0, 6: 4.0}), paused(2, {2: 3.0}),
           paused(3, {2: 0.9, 6: 9.0}), *[paused(n, {2: 8.0}) for n in range(4, 7)]]
    assert h.promotable(history.read(two), closed=True) == [Promote(1, 1)]


def test_a_lineage_that_failed_for_good_takes_no_place_at_the_top_of_a_rung():
    """Hostile pass: the best lineage at rung 0 then diverged (NaN: FAIL). It kept the only
    top place of the rung, so no paused lineage was ever promoted, their folders were
    removed, and nothing trained to the end. Its place goes to the best that may continue."""
    h = Halving.of(ASHA, minimize=True)
    ts = [trial(0, {2: 1.0, 3: 0.9}, TrialState.FAIL), paused(1, {2: 2.0}),
          paused(2, {2: 3.0})]
    got = history.read(ts)
    assert h.rung_top(got, 0, 0) == [1] and h.promotable(got) == [Promote(1, 0)]
    # a failed lineage whose trial runs again (queued: a device taken out) may continue
    again = [*ts, trial(3, {}, TrialState.WAITING, retry_of=0, attempt=1, continues=0)]
    assert h.rung_top(history.read(again), 0, 0) == [0]
    # a lineage reporting at the rung ranks against the others, the failed one aside
    assert h.on_report(history.read([*ts, trial(3, {2: 1.5})]), 3, 1, 2) == GoOn(0)


def test_the_steps_a_paused_trainer_made_while_it_stopped_count_at_no_higher_rung():
    """Hostile pass: a trainer that ignores SIGTERM went on to step 23 after its pause at
    rung 0 (step 2); those values put it in rungs 1 (step 6) and 2 (step 18), where it was
    promoted from though it never passed rung 0's cut. A lineage paused at a rung stands at
    that rung; once promoted, its first report is judged at the rungs above it."""
    h = Halving.of(AshaScheduler(type="asha", min_steps=2, max_steps=54,
                                 reduction_factor=3), minimize=True)
    assert h.rungs == (2, 6, 18)
    overran = trial(0, {st: 0.1 for st in range(24)}, TrialState.PRUNED, paused_at=2,
                    rung=0)
    others = [paused(n, {2: 1.0 + n, 6: 1.0 + n}, rung=1) for n in (1, 2, 3)]
    got = history.read([overran, *others])
    assert h.reach(got[0]) == 2 and h.rung_of(got[0]) == 0
    assert 0 not in h.rung_values(got, 0, 1) and 0 not in h.rung_values(got, 0, 2)
    assert h.promotable(got) == [Promote(1, 1), Promote(0, 0)]  # rung 1's best, then rung 0's
    # promoted from rung 0, its continuation queued or started and not reported yet: it
    # still stands at step 2 (where the driver starts judging it from), at no higher rung
    carried = dict(overran.intermediate_values)  # what a resuming attempt starts with
    for state, values in ((TrialState.WAITING, {}), (TrialState.RUNNING, carried)):
        started = history.read(
            [overran, trial(4, values, state, retry_of=0, attempt=1, continues=0), *others])
        assert h.reach(started[0]) == 2 and started[0].rung_cap == 0
        assert 0 not in h.rung_values(started, 0, 1)
    # a trainer that started over reports step 6 again: judged at rung 1, where its value
    # (the one first reported there) is outside the top
    worse = trial(0, {st: 0.1 if st < 3 else 9.0 for st in range(24)}, TrialState.PRUNED,
                  paused_at=2, rung=0)
    again = history.read([worse, trial(4, dict(worse.intermediate_values), retry_of=0,
                                        attempt=1, continues=0), *others])
    assert h.on_report(again, 0, before=2, step=6) == Pause(1, 6)
    # its first report (step 24) is judged at rung 2 (step 18), where it is alone: paused
    going = [overran, trial(4, {24: 0.1}, retry_of=0, attempt=1, continues=0), *others]
    running = history.read(going)
    assert h.reach(running[0]) == 24
    assert h.on_report(running, 0, before=2, step=24) == Pause(2, 24)


def test_maximize_ranks_the_other_way():
    h = Halving.of(ASHA, minimize=False)
    ts = [paused(0, {2: 1.0}), paused(1, {2: 2.0}), paused(2, {2: 3.0})]
    assert h.promotable(history.read(ts)) == [Promote(2, 0)]


def test_hyperband_brackets_follow_their_share_and_compare_within_a_bracket():
    h = Halving.of(HyperbandScheduler(type="hyperband", min_steps=1, max_steps=27,
                                      reduction_factor=3), minimize=True)
    assert h.rungs == (1, 3, 9) and h.brackets == 4
    assert h.rungs_of(2) == (9,) and h.rungs_of(3) == ()
    got: list[optuna.trial.FrozenTrial] = []
    order = []
    for n in range(20):  # shares: ceil(4/4*27)=27, ceil(4/3*9)=12, ceil(4/2*3)=6, 4
        b = h.bracket_for(history.read(got))
        order.append(b)
        got.append(trial(n, {0: 1.0}, TrialState.COMPLETE, bracket=b))
    assert order[:8] == [0, 0, 1, 0, 0, 1, 2, 0]
    assert order.count(0) > order.count(1) > order.count(2) >= order.count(3)
    # a lineage of bracket 1 is at its first rung at step 3, compared with bracket 1 only
    ts = [paused(0, {3: 9.0}, bracket=1), paused(1, {3: 8.0}, bracket=1),
          trial(2, {3: 1.0}, bracket=0), trial(3, {2: 7.0, 3: 10.0}, bracket=1)]
    assert h.on_report(history.read(ts), 3, before=2, step=3) == Pause(1, 3)
    assert h.on_report(history.read(ts), 3, before=0, step=1) == GoOn()  # no rung at 1 in b1


# ---- population-based training ---------------------------------------------------------

PBT = PbtScheduler(type="pbt", population=4, interval=5, max_steps=50, seed=1)
SEARCHED = {"x": FloatParam(type="float", low=0.0, high=1.0)}


def test_the_bottom_of_the_population_at_an_interval_is_replaced_by_a_top_one_perturbed():
    p = Pbt(PBT, minimize=True)
    ts = [trial(0, {5: 1.0}, x=0.2), trial(1, {5: 2.0}, x=0.4), trial(2, {5: 3.0}, x=0.6),
          trial(3, {4: 9.0, 5: 9.0}, x=0.8)]
    got = history.read(ts)
    decision = p.on_report(got, 3, before=4, step=5, searched=SEARCHED, room=True)
    assert isinstance(decision, Replace)
    assert decision.donor == 0 and decision.step == 5
    assert decision.params["x"] in (pytest.approx(0.2 * 0.8), pytest.approx(0.2 * 1.2))
    # the same decision in every driver
    assert p.on_report(got, 3, before=4, step=5, searched=SEARCHED, room=True) == decision
    # not at an interval, not in the bottom, no room left, or past max_steps: it goes on
    assert p.on_report(got, 3, before=5, step=6, searched=SEARCHED, room=True) == GoOn()
    assert p.on_report(got, 1, before=4, step=5, searched=SEARCHED, room=True) == GoOn()
    assert p.on_report(got, 3, before=4, step=5, searched=SEARCHED, room=False) == GoOn()
    ts[3] = trial(3, {9: 9.0, 10: 9.0}, x=0.8)
    assert Pbt(PbtScheduler(type="pbt", population=4, interval=5, max_steps=10),
               True).on_report(history.read(ts), 3, 9, 10, SEARCHED, True) == GoOn()


def test_a_replaced_lineage_is_out_of_the_ranking():
    ts = [trial(0, {5: 1.0}), trial(1, {5: 9.0}), trial(2, {}, TrialState.WAITING,
                                                      exploit_of=0, replaces=1)]
    got = history.read(ts)
    assert got[1].replaced and got[1].standing is Standing.RUNNING  # winding down
    assert got[2].exploit_of == 0
    assert Pbt(PBT, True).on_report(got, 0, 4, 5, SEARCHED, True) == GoOn()  # alone now


def test_a_donor_at_its_last_step_is_never_chosen():
    """max_steps 10: a lineage at step 9 has no step left to train from its state."""
    spec = PbtScheduler(type="pbt", population=4, interval=5, max_steps=10, seed=1)
    ts = [trial(0, {9: 1.0}), trial(1, {5: 2.0}), trial(2, {5: 3.0}), trial(3, {5: 9.0})]
    assert Pbt(spec, True).on_report(history.read(ts), 3, 4, 5, SEARCHED, True) == GoOn()
    ts[0] = trial(0, {8: 1.0})
    decision = Pbt(spec, True).on_report(history.read(ts), 3, 4, 5, SEARCHED, True)
    assert isinstance(decision, Replace) and decision.donor == 0


def test_a_donor_paused_for_a_copy_ranks_and_continues_once_no_exploit_waits_on_it():
    ts = [paused(0, {5: 1.0, 6: 1.0}), trial(1, {5: 2.0}), trial(2, {5: 3.0}),
          trial(3, {5: 9.0}, TrialState.PRUNED),
          trial(4, {}, TrialState.RUNNING, exploit_of=0, replaces=3)]  # not copied yet
    got = history.read(ts)
    assert got[4].awaits_copy and not got[0].awaits_copy
    p = Pbt(PBT, True)
    assert p.continuable(got) == []
    # ranked while paused: lineage 2 is the bottom of 0, 1, 2
    decision = p.on_report(got, 2, 4, 5, SEARCHED, True)
    assert isinstance(decision, Replace) and decision.donor == 0
    ts[4] = trial(4, {}, TrialState.RUNNING, exploit_of=0, replaces=3, exploit_step=6)
    assert not history.read(ts)[4].awaits_copy
    assert p.continuable(history.read(ts)) == [0]
    ts[4] = trial(4, {}, TrialState.WAITING, exploit_of=0, replaces=3, exploit_step=5)
    assert history.read(ts)[4].awaits_copy  # queued (by an earlier sweep): not copied yet
    assert p.continuable(history.read(ts)) == []
    ts[4] = trial(4, {}, TrialState.FAIL, exploit_of=0, replaces=3)  # called off
    assert p.continuable(history.read(ts)) == [0]
    ts.append(trial(5, {}, TrialState.WAITING, retry_of=0, attempt=1, continues=0))
    assert p.continuable(history.read(ts)) == []  # continued: queued


SPACE = {"lr": FloatParam(type="float", low=1e-4, high=1e-2, log=True),
         "n": IntParam(type="int", low=1, high=10),
         "s": FloatParam(type="float", low=0.0, high=1.0, step=0.25),
         "opt": CategoricalParam(type="categorical", choices=["adam", "sgd"])}
START = {"lr": 9e-3, "n": 9, "s": 0.5, "opt": "adam", "fixed": 3}


def test_explore_scales_numbers_within_range_and_keeps_categoricals_without_resampling():
    rng = random.Random(0)
    for _ in range(50):
        out = _explore.explore(START, SPACE, [0.5, 2.0], 0.0, rng)
        assert out["lr"] in (pytest.approx(4.5e-3), 1e-2)  # 1.8e-2 kept in range
        assert out["n"] in (4, 10) and isinstance(out["n"], int)  # 4.5 -> 4, 18 -> 10
        assert out["s"] in (0.25, 1.0)
        assert out["opt"] == "adam" and out["fixed"] == 3
    assert _explore.explore(START, SPACE, [1.0], 0.0, rng) == START


def test_explore_redraws_every_param_from_its_range_with_the_resample_probability():
    """As Jaderberg et al.'s and Ray Tune's PBT: with `resample_probability`, a param is
    redrawn from its range (a log one on a log scale), numbers too; never outside it."""
    rng = random.Random(0)
    outs = [_explore.explore(START, SPACE, [1.0], 0.5, rng) for _ in range(400)]
    lrs = [o["lr"] for o in outs if o["lr"] != START["lr"]]
    assert 150 < len(lrs) < 250 and all(1e-4 <= v <= 1e-2 for v in lrs)
    assert 0.4 < sum(v < 1e-3 for v in lrs) / len(lrs) < 0.6  # log-uniform: half below 1e-3
    assert {o["n"] for o in outs} == set(range(1, 11))
    ints = [_explore.explore(START, {"n": SPACE["n"]}, [1.0], 1.0, rng)["n"]
            for _ in range(4000)]
    assert 700 < ints.count(1) + ints.count(10) < 900  # each of 10 values alike: 800
    assert {o["s"] for o in outs} == {0.0, 0.25, 0.5, 0.75, 1.0}
    assert {o["opt"] for o in outs} == {"adam", "sgd"}
    assert all(o["fixed"] == 3 for o in outs)


def test_of_picks_the_decisions_of_the_study_file():
    assert isinstance(budget.decisions_of(PBT, True), Pbt)
    assert budget.decisions_of(ASHA, True) == Halving((2, 6), 3, True, 1, 18)
    assert NewConfiguration().bracket == 0


# ---- a PBT exploit's checkpoint copy ------------------------------------------------------


def test_an_exploit_starts_from_a_copy_of_its_donors_folder_without_its_links(tmp_path):
    from sweep.schedulers import exploit_copy
    from sweep.trial import lineage

    out = tmp_path / "out"
    out.mkdir()
    donor = lineage.prepare(out, lineage.Lineage(3))
    (donor.checkpoint_dir / "checkpoint-4").mkdir()
    (donor.checkpoint_dir / "checkpoint-4" / "trainer_state.json").write_text("{}")
    (donor.checkpoint_dir / "state.json").write_text('{"next": 5}')
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("no")
    (donor.checkpoint_dir / "link").symlink_to(secret)
    (donor.checkpoint_dir / "file-link").symlink_to(secret / "key")
    start = lineage.prepare(out, lineage.Lineage(7))
    got = exploit_copy.start_from_donor(out, 3, start)
    mine = start.checkpoint_dir
    assert got.resume and got.last_checkpoint == mine / "checkpoint-4"
    assert (mine / "state.json").read_text() == '{"next": 5}'
    assert sorted(p.name for p in mine.iterdir()) == ["checkpoint-4", "state.json"]
    assert (donor.checkpoint_dir / "link").is_symlink()  # the donor's own is untouched


def test_an_exploit_copies_nothing_from_a_donor_folder_that_is_a_link(tmp_path):
    from sweep._core.safefs import UnsafePath
    from sweep.schedulers import exploit_copy
    from sweep.trial import lineage

    out = tmp_path / "out"
    out.mkdir()
    start = lineage.prepare(out, lineage.Lineage(7))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "state.json").write_text("{}")
    (out / "checkpoints" / "3").symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        exploit_copy.start_from_donor(out, 3, start)
    assert list(start.checkpoint_dir.iterdir()) == []
    # a donor with no folder yet (it has written nothing): the exploit starts as it is
    assert exploit_copy.start_from_donor(out, 4, start) == start
