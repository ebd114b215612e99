"""The checkpoint disk of a scheduler's study: which lineages can never continue (finished,
replaced, paused below the cut of a full rung), which of their folders go (`keep_checkpoints`,
`max_checkpoint_gb`), decided on lineages read from stored trials; the study-file keys."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState
from test_schedulers import ASHA, PBT, load, paused, trial

from sweep._core.errors import ConfigError
from sweep.schedulers import _retention, history
from sweep.schedulers._retention import Removal
from sweep.schedulers.halving import Halving
from sweep.schedulers.pbt import Pbt

H = Halving.of(ASHA, minimize=True)  # rungs at steps 2 and 6, reduction factor 3


def test_the_keys_load_next_to_the_scheduler_and_a_bad_one_is_one_line(tmp_path):
    spec = load(tmp_path, study={"scheduler": {"type": "asha", "min_steps": 2,
                                               "max_steps": 18}})
    assert spec.study.scheduler is not None
    assert (spec.study.scheduler.keep_checkpoints, spec.study.scheduler.max_checkpoint_gb) == (
        1, None)
    spec = load(tmp_path, study={"n_trials": 4, "scheduler": {
        "type": "pbt", "population": 4, "interval": 5, "max_steps": 50,
        "keep_checkpoints": "all", "max_checkpoint_gb": 2.5}})
    assert spec.study.scheduler is not None
    assert (spec.study.scheduler.keep_checkpoints, spec.study.scheduler.max_checkpoint_gb) == (
        "all", 2.5)
    for bad, text in (({"keep_checkpoints": "best"}, "or all; not 'best'"),
                      ({"keep_checkpoints": -1}, "greater than or equal to 0"),
                      ({"max_checkpoint_gb": 0}, "greater than 0")):
        with pytest.raises(ConfigError) as e:
            load(tmp_path, study={"scheduler": {"type": "asha", "min_steps": 2,
                                                "max_steps": 18, **bad}})
        [problem] = e.value.problems
        assert problem.key == f"study.scheduler.{next(iter(bad))}"
        assert text in problem.message


def test_below_the_cut_of_a_full_rung_a_paused_lineage_can_never_continue():
    ts = [paused(0, {2: 1.0}), paused(1, {2: 2.0}), paused(2, {2: 3.0})]
    # three configurations, all at rung 0: its top third (lineage 0) is promotable, the rest
    # can never continue
    assert _retention.never_continue(history.read(ts), H, n_trials=3) == {1, 2}
    # a fourth configuration may still come, or is still below the rung: the rung is not full
    assert _retention.never_continue(history.read(ts), H, n_trials=4) == set()
    running = [*ts, trial(3, {0: 9.0, 1: 9.0})]
    assert _retention.never_continue(history.read(running), H, n_trials=4) == set()
    # ... nor one that failed before the rung: a device taken out as sick runs its failed
    # trials again (and a failed lineage's folder is what its user debugs)
    failed = [*ts, trial(3, {0: 9.0, 1: 9.0}, TrialState.FAIL)]
    assert _retention.never_continue(history.read(failed), H, n_trials=4) == set()


def test_a_later_rung_is_full_once_every_lineage_of_the_bracket_reached_it_or_is_out():
    rung0 = {0: 1.0, 1: 5.0, 2: 6.0, 3: 2.0, 4: 7.0, 5: 3.0, 6: 8.0, 7: 9.0, 8: 10.0}
    ts = [paused(o, {2: v}) for o, v in rung0.items() if o not in (0, 3, 5)]
    # the top three of rung 0 went on to rung 1 (step 6): 0 trained to the end, 3 and 5
    # paused there; 3 is the top of rung 1 (promotable), 5 is out
    ts += [trial(0, {2: 1.0, 6: 0.9, 17: 0.8}, TrialState.COMPLETE),
           paused(3, {2: 2.0, 6: 0.5}), paused(5, {2: 3.0, 6: 4.0})]
    got = history.read(ts)
    assert _retention.never_continue(got, H, n_trials=9) == {0, 1, 2, 4, 5, 6, 7, 8}
    # while 5 still runs below rung 1, rung 1 is not full: 3 and 5's fates are open
    ts[-1] = trial(5, {2: 3.0, 4: 3.0})
    assert _retention.never_continue(history.read(ts), H, n_trials=9) == {
        0, 1, 2, 4, 6, 7, 8}


def test_hyperband_brackets_fill_on_their_own():
    from sweep.spec.scheduler import HyperbandScheduler
    hb = Halving.of(HyperbandScheduler(type="hyperband", min_steps=2, max_steps=18,
                                       reduction_factor=3), minimize=True)
    ts = [paused(0, {2: 1.0}), paused(1, {2: 2.0}), paused(2, {2: 3.0}),
          trial(3, {5: 1.0}, bracket=1)]  # bracket 1 (first rung at 6) still runs
    assert _retention.never_continue(history.read(ts), hb, n_trials=4) == {1, 2}


def test_a_replaced_or_finished_lineage_can_never_continue_but_a_donor_waits_for_its_copy():
    pbt = Pbt(PBT, minimize=True)
    ts = [trial(0, {5: 1.0}, TrialState.COMPLETE), trial(1, {5: 9.0}, TrialState.PRUNED),
          trial(2, {}, TrialState.WAITING, exploit_of=0, exploit_step=5, replaces=1),
          trial(3, {5: 2.0})]
    # 1 is replaced and 0 finished, but the exploit has not copied 0's folder yet, and it may
    # be called off (1 then goes on): 1's folder goes only while over a bound (first then:
    # the copy needs room), never under one
    got = history.read(ts)
    assert _retention.never_continue(got, pbt, n_trials=4) == frozenset()
    assert _retention.spared(got) == {1}
    sizes = {0: 100, 1: 100, 2: 0, 3: 100}
    assert _retention.plan(got, frozenset(), sizes, 1, None, True, frozenset({1})).remove == ()
    assert _retention.plan(got, frozenset(), sizes, 1, 1.0, True,
                          frozenset({1})) == _retention.Removal((), 300, False)
    assert _retention.plan(got, frozenset(), sizes, 1, 250e-9, True,
                          frozenset({1})) == _retention.Removal((1,), 200, False)
    ts[2] = trial(2, {}, exploit_of=0, exploit_step=5, replaces=1)  # copied, no report yet
    assert _retention.never_continue(history.read(ts), pbt, n_trials=4) == {1}
    ts[2] = trial(2, {6: 1.5}, exploit_of=0, exploit_step=5, replaces=1)  # it reported
    assert _retention.never_continue(history.read(ts), pbt, n_trials=4) == {0, 1}
    # a replaced lineage still winding down may yet write in its folder
    ts[1] = trial(1, {5: 9.0})
    assert _retention.never_continue(history.read(ts), pbt, n_trials=4) == {0}


def test_a_called_off_exploits_folder_can_never_continue():
    """A PBT exploit called off (its donor trained to the end before a state of it could be
    copied) is told FAIL and never runs: its folder, made for the copy, goes (a busy machine
    left `checkpoints/4` and `checkpoints/5` behind at the run's end, empty, under
    max_checkpoint_gb). A lineage that failed by itself keeps its folder."""
    pbt = Pbt(PBT, minimize=True)
    ts = [trial(0, {20: 1.0}, TrialState.COMPLETE), trial(1, {5: 9.0}, TrialState.PRUNED),
          trial(2, {}, TrialState.FAIL, exploit_of=0, replaces=1, called_off=True),
          trial(3, {5: 2.0}, TrialState.FAIL), trial(4, {20: 3.0}, TrialState.COMPLETE,
                                                    retry_of=1, attempt=1, continues=1)]
    assert _retention.never_continue(history.read(ts), pbt, n_trials=4) == {0, 1, 2}


FINISHED = [trial(0, {17: 1.0}, TrialState.COMPLETE), trial(1, {17: 2.0}, TrialState.COMPLETE),
            trial(2, {17: 3.0}, TrialState.COMPLETE), paused(3, {2: 9.0}), trial(4, {3: 5.0})]
DEAD = frozenset({0, 1, 2, 3})
SIZES = {0: 100, 1: 100, 2: 100, 3: 100, 4: 500}


def test_every_dead_folder_goes_but_the_best_finished_ones_keep_checkpoints_keeps():
    lines = history.read(FINISHED)
    assert _retention.plan(lines, DEAD, SIZES, 1, None, True) == Removal((1, 2, 3), 600, False)
    assert _retention.plan(lines, DEAD, SIZES, 2, None, True) == Removal((2, 3), 700, False)
    assert _retention.plan(lines, DEAD, SIZES, 0, None, True) == Removal((0, 1, 2, 3), 500, False)
    assert _retention.plan(lines, DEAD, SIZES, "all", None, True) == Removal((), 900, False)
    assert _retention.plan(lines, DEAD, SIZES, 1, None, False) == Removal((0, 1, 3), 600, False)
    # a folder not there (removed before) is not chosen again
    there = {o: b for o, b in SIZES.items() if o != 3}
    assert _retention.plan(lines, DEAD, there, 1, None, True) == Removal((1, 2), 600, False)


def test_over_the_bound_kept_folders_go_worst_first_never_the_best_nor_a_live_one():
    lines = history.read(FINISHED)
    # all kept, 700 bytes allowed: the paused one first, then the worst finished
    assert _retention.plan(lines, DEAD, SIZES, "all", 700e-9, True) == Removal((3, 2), 700, False)
    # 550 bytes: 1 goes too, and still over: 0 (the best) and 4 (running) stay
    assert _retention.plan(lines, DEAD, SIZES, 2, 550e-9, True) == Removal((2, 3, 1), 600, True)
    assert _retention.plan(lines, DEAD, SIZES, "all", 1e-9, True) == Removal((3, 2, 1), 600, True)
    # within the bound: nothing more than keep_checkpoints says
    assert _retention.plan(lines, DEAD, SIZES, "all", 1.0, True) == Removal((), 900, False)


def test_a_copy_about_to_be_made_counts_as_held_and_room_is_made_for_it_first():
    """An exploit's copy of its donor's state (`incoming` bytes) is counted before it is
    made: the folders that may go go first, so that the copy does not take the disk over the
    bound; the copy itself is never removed, and is still counted when nothing can go."""
    lines = history.read(FINISHED)
    # 900 bytes held, a bound of 1000: room for 100 more, not for 200
    assert _retention.plan(lines, DEAD, SIZES, "all", 1000e-9, True,
                          incoming=100) == Removal((), 1000, False)
    assert _retention.plan(lines, DEAD, SIZES, "all", 1000e-9, True,
                          incoming=200) == Removal((3,), 1000, False)
    assert _retention.plan(lines, DEAD, SIZES, "all", 1000e-9, True,
                          incoming=350) == Removal((3, 2, 1), 950, False)
    # only the best finished and a live lineage left: over, and said
    assert _retention.plan(lines, DEAD, SIZES, "all", 1e-9, True,
                          incoming=50) == Removal((3, 2, 1), 650, True)
    # the lineage an exploit replaces goes first when the copy needs the room
    pbt = Pbt(PBT, minimize=True)
    ts = [trial(0, {5: 1.0}), trial(1, {5: 9.0}, TrialState.PRUNED),
          trial(2, {}, exploit_of=0, replaces=1), trial(3, {5: 2.0})]
    got = history.read(ts)
    sizes = {0: 100, 1: 100, 2: 0, 3: 100}
    assert _retention.never_continue(got, pbt, n_trials=4) == frozenset()
    assert _retention.plan(got, frozenset(), sizes, 1, 350e-9, True,
                          _retention.spared(got)) == Removal((), 300, False)
    assert _retention.plan(got, frozenset(), sizes, 1, 350e-9, True, _retention.spared(got),
                          incoming=100) == Removal((1,), 300, False)
