"""The run's decisions on their own: budget, grid, timeout, signals, retries, streaks."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from sweep.runner.policy import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, OnSignal, Policy
from sweep.study.counts import Counts

FAIL = TrialState.FAIL


@pytest.mark.parametrize(("counts", "grid", "room"), [
    (Counts(0, 0), None, 5),
    (Counts(3, 1), None, 1),
    (Counts(4, 1), None, 0),
    (Counts(6, 0), None, 0),  # other drivers overshot: never negative
    (Counts(0, 1, grid_started=2), 3, 1),
    (Counts(0, 0, grid_started=3), 3, 0),
])
def test_room_counts_every_driver_and_the_grid(counts, grid, room):
    assert Policy(n_trials=5, grid_size=grid).room(counts) == room


def test_study_timeout_stops_starting_once_and_says_why():
    p = Policy(n_trials=5, deadline=10.0, timeout=10.0)
    assert p.check_clock(9.9) is None and p.room(Counts(0, 0)) == 5
    assert p.check_clock(10.0) == "study.timeout of 10 s reached"
    assert p.check_clock(11.0) is None  # said once
    assert p.room(Counts(0, 0)) == 0 and p.exit_code() == EXIT_OK


def test_first_signal_stops_gently_the_next_ones_kill():
    p = Policy(n_trials=5)
    assert p.on_signal() is OnSignal.STOP_ALL
    assert p.on_signal() is OnSignal.KILL_ALL
    assert p.on_signal() is OnSignal.KILL_ALL
    assert p.stop_reason == "interrupted" and p.exit_code() == EXIT_INTERRUPTED
    assert p.result(Counts(2, 0)).message == "interrupted; 2/5 trials finished"


def test_retries_follow_max_retries_and_out_of_memory_only_with_retry_oom():
    p = Policy(n_trials=9, max_retries=1, max_consecutive_failures=99)
    assert p.after(FAIL, attempt=0).retry
    assert not p.after(FAIL, attempt=1).retry
    assert not p.after(FAIL, attempt=0, oom=True).retry
    assert Policy(n_trials=9, max_retries=1, retry_oom=True).after(FAIL, 0, oom=True).retry
    assert not p.after(FAIL, attempt=0, interrupted=True).retry


def test_a_streak_of_failures_gives_up_and_a_success_resets_it():
    p = Policy(n_trials=9, max_consecutive_failures=2)
    assert p.after(FAIL, 0).give_up is None
    assert p.after(TrialState.PRUNED, 0).give_up is None  # a pruned trial is no failure
    assert p.after(FAIL, 0).give_up is None
    assert p.after(FAIL, 0, interrupted=True).give_up is None  # Ctrl-C is not the trainer's
    follow = p.after(FAIL, 0, fail_reason="exit code 3: boom", see="/t/3/stderr.log")
    assert follow.give_up == ("stopped after 2 failed trials in a row (last: exit code 3: boom); "
                              "see /t/3/stderr.log")
    assert p.exit_code() == EXIT_FAILED and p.room(Counts(0, 0)) == 0
    assert p.result(Counts(3, 1)).message == f"{follow.give_up}; 3/9 trials finished, " \
                                             "1 running in other drivers"
