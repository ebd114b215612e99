"""The driver's loop with fake processes and a fake clock: budget, retries, failure streaks,
pruning, grid exhaustion, timeouts, signals and leftovers, each in milliseconds."""

from __future__ import annotations

import time
from typing import Any

import pytest
from optuna.trial import TrialState

from sweep._core import names
from sweep.gpus.monitor import NoReader
from sweep.gpus.pool import Pool, fake_devices
from sweep.runner.driver import Driver
from sweep.testing.fakes import FakeSpawn, Script, lease
from sweep.testing.harness import Sweep, capture_messages
from sweep.trial.lineage import Lineage
from sweep.trial.process import GUARD_MARGIN
from sweep.trial.running import MOVES, Phase, PhaseError, RunningTrial, Stop


def ok(params: dict[str, Any]) -> Script:
    return Script(runs=1.0, result={"score": params["x"]})


def test_the_budget_is_met_exactly_with_every_device_busy(tmp_path):
    s = Sweep(tmp_path, ok, gpus=2, study={"n_trials": 5})
    assert s.run() == 0
    assert s.states() == ["COMPLETE"] * 5
    assert s.spawn.most_at_once() == 2
    assert s.clock.t == pytest.approx(3.0)  # 2 + 2 + 1 trials of 1 s, no gap between them
    assert [t.value for t in s.trials] == [t.params["x"] for t in s.trials]


def test_a_stubborn_trainer_in_its_grace_period_wakes_the_loop_a_few_times(tmp_path):
    """Defect 2 of issue 8: the loop span on select(0) while a stopped trial wound down."""
    s = Sweep(tmp_path, lambda p: Script(runs=1000, ignores_term=True), gpus=1,
              study={"n_trials": 1, "max_consecutive_failures": 1, "heartbeat_interval": 30},
              trainer={"timeout": 1.0, "grace_period": 20.0})
    assert s.run() == 1
    [trial] = s.trials
    assert trial.user_attrs[names.FAIL_REASON] == "timeout after 1 s"
    assert s.clock.t == pytest.approx(21.0)
    assert s.spawn.processes[0].signals == ["TERM"]  # the guard escalates, not the driver
    # reports polled at 0.5 s, the timeout at 1 s, then one wait through the grace period
    assert s.clock.waits == 3


def test_a_failed_trial_is_retried_with_its_params_then_the_budget_continues(tmp_path):
    failed: set[float] = set()

    def once(params: dict[str, Any]) -> Script:
        if not failed:
            failed.add(params["x"])
            return Script(code=3, result=None, stderr="ValueError: boom\n")
        return ok(params)

    s = Sweep(tmp_path, once, gpus=1, study={"n_trials": 2}, trainer={"max_retries": 1})
    assert s.run() == 0
    first, retry, third = s.trials
    assert first.state.name == "FAIL"
    assert first.user_attrs[names.FAIL_REASON] == "exit code 3: ValueError: boom"
    assert retry.params == first.params and retry.state.name == "COMPLETE"
    assert retry.user_attrs[names.RETRY_OF] == 0 and retry.user_attrs[names.ATTEMPT] == 1
    assert third.state.name == "COMPLETE" and third.user_attrs[names.ATTEMPT] == 0


def test_out_of_memory_is_not_retried_and_a_failure_streak_stops_the_run(tmp_path):
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
    s = Sweep(tmp_path, lambda p: Script(code=1, result=None, stderr=oom), gpus=1,
              study={"n_trials": 10, "max_consecutive_failures": 3},
              trainer={"max_retries": 2})
    assert s.run() == 1
    assert s.states() == ["FAIL"] * 3
    assert all(t.user_attrs[names.FAIL_REASON].startswith("out of memory") for t in s.trials)
    assert not any(names.RETRY_OF in t.user_attrs for t in s.trials)
    assert "stopped after 3 failed trials in a row" in s.driver.policy.stop_reason


def test_a_failure_streak_lets_the_trials_running_beside_it_finish_and_starts_no_more(
        tmp_path):
    """The rule `test_driver`'s end-to-end test can only bound (3 to 4 trials, as real
    processes end in either order): on two devices, the streak of 3 is reached by a trial
    that ran beside a fourth; that one is told too, and nothing starts after."""
    crash = Script(runs=1.0, code=1, result=None, stderr="ValueError: boom\n")
    s = Sweep(tmp_path, lambda p: crash, gpus=2,
              study={"n_trials": 10, "max_consecutive_failures": 3})
    assert s.run() == 1
    assert s.states() == ["FAIL"] * 4
    assert [p.started for p in s.spawn.processes] == [0.0, 0.0, 1.0, 1.0]
    assert s.driver.policy.stop_reason == (
        "stopped after 3 failed trials in a row (last: exit code 1: ValueError: boom); see "
        f"{s.spawn.processes[2].plan.paths.stderr}")


def test_out_of_memory_in_stderr_does_not_overrule_a_clean_exit_with_a_result(tmp_path):
    """Defect 3 of issue 8: a trainer that caught OOM and retried was told FAIL."""
    caught = "CUDA out of memory; retrying with batch size 16\n"
    s = Sweep(tmp_path, lambda p: Script(stderr=caught, result={"score": 0.2}), gpus=1,
              study={"n_trials": 1})
    assert s.run() == 0
    [trial] = s.trials
    assert trial.state.name == "COMPLETE" and trial.value == 0.2


def test_a_detached_child_neither_delays_the_verdict_nor_frees_the_device_early(tmp_path):
    """Defect 4 of issue 8: a child left behind kept the trial RUNNING and its GPU leased."""
    s = Sweep(tmp_path, lambda p: Script(runs=0.1, leftover=60.0, result={"score": 1.0}),
              gpus=1, study={"n_trials": 2}, trainer={"grace_period": 3.0, "timeout": 2.0})
    told_at: dict[int, float] = {}
    events = s.driver.events
    events.finished = lambda done: told_at.setdefault(done.number, s.clock.t)  # type: ignore
    assert s.run() == 0
    assert s.states() == ["COMPLETE", "COMPLETE"]  # the valid result is kept
    assert told_at[0] == pytest.approx(0.1)  # judged when the command exited
    first, second = s.spawn.processes
    assert first.ended_at == pytest.approx(3.1)  # the guard's grace for the leftover
    assert second.started >= first.ended_at  # the device was leased again only then


def test_pruned_trials_are_stopped_and_told_pruned_with_their_last_value(tmp_path):
    def reporting(params: dict[str, Any]) -> Script:
        bad = params["x"] > 0.5
        steps = [(0.2 * (i + 1), i, (10.0 if bad else 1.0) + i) for i in range(5)]
        return Script(runs=1.2, reports=steps, result={"score": steps[-1][2]})

    s = Sweep(tmp_path, reporting, gpus=1,
              study={"n_trials": 4, "enqueue": [{"x": 0.1}, {"x": 0.2}, {"x": 0.9}, {"x": 0.8}],
                     "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 0}})
    assert s.run() == 0
    assert s.states() == ["COMPLETE", "COMPLETE", "PRUNED", "PRUNED"]
    for t in s.trials[2:]:
        assert t.value == 10.0 and t.intermediate_values == {0: 10.0}
    assert all(p.signals == ["TERM"] for p in s.spawn.processes[2:])
    # the pruned ones ended at their first report, 0.2 s in, instead of running 1.2 s
    spans = [t for p in s.spawn.processes for t in (p.started, p.ended_at)]
    assert spans == pytest.approx([0.0, 1.2, 1.2, 2.4, 2.4, 2.6, 2.6, 2.8])


def test_a_grid_ends_when_every_point_was_started(tmp_path):
    s = Sweep(tmp_path, ok, gpus=2,
              study={"n_trials": 10, "sampler": {"type": "grid"}},
              params={"x": {"type": "categorical", "choices": [0.1, 0.2, 0.3]}})
    assert s.run() == 0
    assert sorted(t.params["x"] for t in s.trials) == [0.1, 0.2, 0.3]


def test_study_timeout_starts_nothing_after_it_and_lets_running_trials_finish(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(runs=0.8), gpus=2,
              study={"n_trials": 100, "timeout": 1.0})
    said = capture_messages(s)
    assert s.run() == 0
    assert s.states() == ["COMPLETE"] * 4  # two at 0, two at 0.8
    assert [p.started for p in s.spawn.processes] == pytest.approx([0.0, 0.0, 0.8, 0.8])
    assert s.driver.policy.stop_reason == "study.timeout of 1 s reached"
    assert said == ["study.timeout of 1 s reached: no new trials; waiting for 2"]


def test_a_trial_timeout_counts_from_its_start_not_from_a_wait_before_it(tmp_path):
    """A start can wait (the fork server's imports, at the first trial): that wait is not
    the trial's, so it does not count against `trainer.timeout`."""
    s = Sweep(tmp_path, lambda p: Script(runs=3.0, result={"score": p["x"]}), gpus=1,
              study={"n_trials": 2}, trainer={"timeout": 5.0})
    spawn = s.driver.spawn

    def slow(*args: Any, **kwargs: Any) -> Any:
        s.clock.t += 10.0  # as long as the loop is held before the trainer starts
        return spawn(*args, **kwargs)

    s.driver.spawn = slow
    assert s.run() == 0
    assert s.states() == ["COMPLETE", "COMPLETE"]


def test_first_signal_stops_every_trial_gently_and_a_second_kills(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(runs=100, ignores_term=True), gpus=2,
              study={"n_trials": 4}, trainer={"grace_period": 30.0})
    s.clock.at(1.0, lambda: s.driver._on_signal(2, None))
    s.clock.at(2.0, lambda: s.driver._on_signal(2, None))
    assert s.run() == 130
    # each interrupted trial's continuation is queued for the next run (no retry spent)
    assert s.states() == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert {t.user_attrs[names.FAIL_REASON] for t in s.trials[:2]} == {"interrupted"}
    assert sorted((t.user_attrs[names.CONTINUES], t.user_attrs[names.RETRIES])
                  for t in s.trials[2:]) == [(0, 0), (1, 0)]
    assert all(p.signals == ["TERM", "KILL"] for p in s.spawn.processes)
    assert s.clock.t == pytest.approx(2.0)


def test_a_driver_error_tells_every_trial_it_asked(tmp_path):
    calls = []

    def breaks_on_third(params: dict[str, Any]) -> Script:
        calls.append(params)
        if len(calls) == 3:
            raise OSError("no more processes")
        return Script(runs=5)

    s = Sweep(tmp_path, breaks_on_third, gpus=3, study={"n_trials": 4})
    with pytest.raises(OSError, match="no more processes"):
        s.run()
    states = {t.number: (t.state.name, t.user_attrs.get(names.FAIL_REASON)) for t in s.trials}
    assert states[2] == ("FAIL", "could not start the trial: no more processes")
    assert states[0] == states[1] == ("FAIL", "driver error")
    assert all(p.signals == ["TERM"] and p.ended for p in s.spawn.processes)


class LeftoverReader(NoReader):
    """NVML that shows the first trial's process on device 0 until `until`."""

    def __init__(self, spawn: FakeSpawn, until: float) -> None:
        self.spawn, self.until = spawn, until

    def compute_processes(self, index: int) -> dict[int, float | None]:
        first = self.spawn.processes[0]
        return {first.pid: 1.0} if index == 0 and first.clock.t < self.until else {}


@pytest.mark.parametrize(("stuck_for", "quarantined"), [(0.5, False), (5.0, True)])
def test_a_gpu_held_after_a_trial_is_cleaned_without_stalling_the_loop(
    tmp_path, monkeypatch, stuck_for, quarantined
):
    """Defect 5 of issue 8: cleaning a GPU slept a second inside the loop."""
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("the loop slept"))
    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=2, study={"n_trials": 3},
              reader=NoReader())
    s.driver.monitor.reader = LeftoverReader(s.spawn, 1.0 + stuck_for)  # type: ignore[union-attr]
    assert s.run() == 0
    _, second, third = s.spawn.processes
    assert second.started == 0.0 and third.started == pytest.approx(1.0)
    assert s.trials[2].user_attrs[names.GPU] == 1  # device 0 was still being cleaned
    assert (0 in s.pool.quarantined) is quarantined
    assert s.clock.t == pytest.approx(2.0)  # the third trial ran on device 1 meanwhile


def test_energy_is_not_given_to_a_trial_that_shared_its_device_midway(tmp_path):
    """Defect 6 of issue 8: sharing was looked at only when the trial ended."""
    pool = Pool(fake_devices("1"), capacity=2)
    first = lease(pool, 1)
    second = lease(pool, 2)
    pool.release(second)
    assert second.shared
    pool.release(first)
    assert first.shared  # alone at its start and its end, shared between
    third = lease(pool, 3)
    pool.release(third)
    assert not third.shared


class StubProcess:
    """Only what `RunningTrial`'s phase moves look at."""

    def __init__(self) -> None:
        self.command_exited = self.ended = False
        self.signals: list[str] = []
        self.seen_pids = {1}

    def stop(self) -> None:
        self.signals.append("TERM")

    def kill(self) -> None:
        self.signals.append("KILL")


def running_trial() -> RunningTrial:
    pool = Pool(fake_devices("1"))
    return RunningTrial(None, 7, {}, Lineage(7), lease(pool, 7), StubProcess(),  # type: ignore[arg-type]
                        grace=3.0)


def test_a_trial_moves_through_its_phases_in_one_order():
    run = running_trial()
    assert run.phase is Phase.RUNNING and run.follows_reports is False  # no reports file
    run.stop(Stop.PRUNED, now=1.0)
    run.stop(Stop.TIMEOUT, now=2.0)  # the first reason is kept, the guard told once
    assert (run.phase, run.stop_reason) == (Phase.STOPPING, Stop.PRUNED)
    assert run.process.signals == ["TERM"]  # type: ignore[attr-defined]
    assert run.next_wakeup(2.0) == 1.0 + 3.0 + GUARD_MARGIN  # the guard's deadline
    run.process.command_exited = True  # type: ignore[misc]
    run.judged_now(now=2.5)
    assert run.phase is Phase.TOLD and run.judged
    run.stop(Stop.INTERRUPTED, now=3.0)  # told: a stop changes nothing
    assert (run.phase, run.stop_reason) == (Phase.TOLD, Stop.PRUNED)
    run.process.ended = True  # type: ignore[misc]
    assert run.clear_device(set(), now=3.0) is True
    assert run.phase is Phase.ENDED and run.next_wakeup(3.0) is None


def test_a_running_trial_told_without_a_stop_goes_straight_to_told():
    run = running_trial()
    run.judged_now(now=1.0)
    assert (run.phase, run.stop_reason) == (Phase.TOLD, None)
    assert run.next_wakeup(1.0) == 1.0 + 3.0 + GUARD_MARGIN  # its leftovers get the grace


@pytest.mark.parametrize("first", ["told", "ended"])
def test_an_impossible_move_raises(first):
    """A trial is told once; a trial whose tree ended was told first."""
    run = running_trial()
    if first == "ended":
        with pytest.raises(PhaseError, match="trial 7: running -> ended"):
            run.clear_device(set(), now=1.0)
        return
    run.judged_now(now=1.0)
    with pytest.raises(PhaseError, match="trial 7: told -> told"):
        run.judged_now(now=2.0)
    assert set(MOVES) == set(Phase) and MOVES[Phase.ENDED] == frozenset()


def test_a_give_up_points_at_the_log_the_trainer_wrote(tmp_path):
    """A trainer that wrote nothing to stderr is read in its stdout.log (the hostile pass was
    sent to an empty stderr.log)."""
    from sweep.trial.folders import TrialPaths
    from sweep.trial.running import where_to_look

    paths = TrialPaths.of(tmp_path, 0)
    paths.dir.mkdir(parents=True)
    paths.stderr.write_text("")
    paths.stdout.write_text("epoch 1\n")
    assert where_to_look(paths) == paths.stdout
    paths.stderr.write_text("Traceback ...\n")
    assert where_to_look(paths) == paths.stderr
    # a hung trial: its stacks (the hostile pass was sent to an empty stdout.log)
    assert where_to_look(paths, Stop.HUNG) == paths.dir / "stack.txt"
    assert where_to_look(paths, Stop.TIMEOUT) == paths.stderr


def test_a_driver_killed_at_the_tell_of_a_failed_trial_leaves_its_retry_queued_once(tmp_path):
    """Hostile pass: the retry of a failed trial was queued after its FAIL was told, so a
    driver killed between the two lost the point. It is queued first: killed at the tell, the
    retry is there, and a reclaimer that then tells the trial FAIL queues no second one."""
    from sweep.study.ownership import Orphan

    s = Sweep(tmp_path, lambda p: Script(code=3, result=None, stderr="boom\n"), gpus=1,
              study={"n_trials": 1}, trainer={"max_retries": 1})

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit(9)

    s.store.tell_verdict = killed  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        s.run()

    def retries() -> list[Any]:
        return [t for t in s.trials if t.user_attrs.get(names.RETRY_OF) == 0]

    [retry] = retries()
    assert retry.state.name == "WAITING" and retry.user_attrs[names.ATTEMPT] == 1
    first = s.trials[0]
    if first.state.name == "RUNNING":  # as a kill -9 leaves it
        assert s.store.fail_orphan(Orphan(first, "driver died", None))
    assert s.trials[0].state.name == "FAIL" and len(retries()) == 1


# ---- intermediate values of a trial that stops, and of one that wrote many (issue 32) ---


def test_a_report_written_while_the_trial_is_being_stopped_is_kept(tmp_path):
    """Issue 32: the last report a trainer writes as it saves on SIGTERM (here: at 2.0 s,
    stopped by its timeout at 1.5 s, killed after its 3 s grace) was in reports.jsonl but not
    stored: every continued trial had a one-step hole in its curve."""
    s = Sweep(tmp_path, lambda p: Script(runs=10.0, ignores_term=True, result=None,
                                         reports=[(1.0, 1, 0.5), (2.0, 2, 0.25)]),
              gpus=1, study={"n_trials": 1, "max_consecutive_failures": 1},
              trainer={"timeout": 1.5, "grace_period": 3.0})
    s.run()
    trial = s.trials[0]
    assert trial.user_attrs[names.FAIL_REASON].startswith("timeout")
    assert trial.intermediate_values == {1: 0.5, 2: 0.25}


def test_a_backlog_of_reports_is_read_a_batch_a_pass_and_the_trial_told_after_it(
        tmp_path, monkeypatch):
    """Issue 32: 1M report lines made a trial be told 110 s after its exit and kept SIGINT
    waiting: the reading after the exit is bounded per pass like the reading before it (the
    loop serves signals and other trials between passes), and the trial is told once all
    are read."""
    from sweep.trial import intermediate

    lines = [(1.0, i, float(i)) for i in range(1, 251)]  # 250 lines as it exits
    s = Sweep(tmp_path, lambda p: Script(runs=1.0, reports=lines), gpus=1,
              study={"n_trials": 1, "heartbeat_interval": 30})
    reads: list[int] = []
    make = intermediate.reader_for

    def counting(*args: Any, **kw: Any) -> Any:
        reader = make(*args, **kw)
        for name in ("read", "read_rest"):
            setattr(reader, name, counted(getattr(reader, name)))
        return reader

    def counted(inner: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            got = inner(*a, **k)
            reads.append(len(got))
            return got
        return call

    monkeypatch.setattr(intermediate, "reader_for", counting)
    assert s.run() == 0
    [trial] = s.trials
    assert trial.state.name == "COMPLETE" and max(trial.intermediate_values) == 250
    assert sum(reads) == 250 and max(reads) <= intermediate.BATCH
    assert s.clock.t == pytest.approx(1.0)  # passes one after the other, not a heartbeat apart


def test_a_failure_that_names_a_study_file_fix_is_not_retried_and_stops_the_run(tmp_path):
    """Issue 32: `result.stdout` where the trainer prints its metric on stderr failed every
    trial the same way, and was retried: 5 full trials ran with n_trials: 1."""
    s = Sweep(tmp_path, lambda p: Script(result=None, stderr="score: 0.5\n"), gpus=1,
              study={"n_trials": 2},
              trainer={"max_retries": 3,
                       "result": {"stdout": r"score: (?P<score>[-+.0-9eE]+|nan|inf)"}})
    said = capture_messages(s)
    assert s.run() == 1
    [trial] = s.trials
    reason = trial.user_attrs[names.FAIL_REASON]
    assert reason.endswith("they match in stderr.log: set trainer.result.stderr instead")
    assert s.driver.policy.stop_reason == (
        f"trial 0 failed and the study file must change: {reason}")
    assert said == [f"trial 0 failed and the study file must change: {reason}: no new "
                    "trials"]  # not "waiting for 0" (hostile pass)


def test_an_interrupted_trials_continuation_runs_before_the_rest_of_study_enqueue(tmp_path):
    """`study.enqueue` is queued one at a time as trials are asked: a continuation queued by
    an interruption runs before the entries not started yet, so the budget never ends with a
    lineage left waiting (Optuna asks the oldest queued trial first)."""
    enqueue = [{"x": v} for v in (0.1, 0.2, 0.3, 0.4, 0.5)]
    s = Sweep(tmp_path, lambda p: Script(runs=10), gpus=2,
              study={"n_trials": 4, "enqueue": enqueue})
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    assert s.states() == ["FAIL", "FAIL", "WAITING", "WAITING"]  # the two continuations
    again = Driver(s.spec, s.store, s.pool, None, spawn=s.spawn, clock=s.clock)
    assert again.run().exit_code == 0
    assert [(t.state.name, t.params["x"]) for t in s.trials[2:]] == [
        ("COMPLETE", 0.1), ("COMPLETE", 0.2), ("COMPLETE", 0.3), ("COMPLETE", 0.4)]


def test_durations_in_the_live_lines_are_on_the_drivers_clock_not_the_wall_clock(
        tmp_path, monkeypatch):
    """Item 12 of issue 38: "COMPLETE ... in -3539.7 s" after the wall clock was stepped back
    an hour; a trial's duration and its elapsed time are now the driver's (monotonic) clock's."""
    s = Sweep(tmp_path, lambda p: Script(runs=2.5, result={"score": p["x"]}), gpus=1,
              study={"n_trials": 1})
    finished: list[Any] = []
    views: list[Any] = []
    s.driver.events.finished = finished.append  # type: ignore[method-assign,assignment]
    s.driver.events.tick = views.append  # type: ignore[method-assign,assignment]
    stepped = time.time() - 3600.0  # the wall clock, stepped back an hour, then frozen
    monkeypatch.setattr(time, "time", lambda: stepped)
    assert s.run() == 0
    [done] = finished
    assert done.seconds == 2.5
    elapsed = [r.elapsed for view in views for r in view.running]
    assert elapsed and elapsed == sorted(elapsed) and 0.0 <= elapsed[0] <= elapsed[-1] <= 2.5


def test_a_note_on_a_trial_another_driver_told_stops_it_and_the_run_goes_on(tmp_path):
    """A driver taken for dead (its heartbeats late on a busy machine) notes something on
    its trial from the values it read (the resume check, the scheduler) after another driver
    told it: the trial is stopped as one told by another driver, and the run goes on to its
    budget. The note raised Optuna's UpdateFinishedTrialError, and the driver crashed (a whole
    suite caught it in the flooded-drivers test)."""
    s = Sweep(tmp_path, lambda p: Script(runs=3.0, reports=[(0.2, 0, 0.5), (2.0, 1, 0.4)]),
              gpus=1, study={"n_trials": 1})
    noted: list[int] = []

    def taken_then_noted(run: RunningTrial, steps: list[int]) -> None:
        if steps and not noted:  # as a reclaimer that took this driver for dead would
            noted.append(run.number)
            s.store.storage.set_trial_state_values(run.trial._trial_id, TrialState.FAIL)
            s.store.note(run.trial, {names.RESUMED_AT: steps[0]})

    s.driver.follow.resume.on_reports = taken_then_noted  # type: ignore[method-assign]
    said = capture_messages(s)
    assert s.run() == 0
    assert noted == [0]
    assert s.states() == ["FAIL", "COMPLETE"]  # taken, then the budget's trial
    assert names.RESUMED_AT not in s.trials[0].user_attrs
    assert s.spawn.processes[0].signals == ["TERM"]  # stopped, not left running
    assert "trial 0 was already told by another driver" in said


def test_a_trial_another_driver_told_before_it_started_is_let_go(tmp_path, monkeypatch):
    """Told by another driver between its ask and its start (a note on it as it starts finds
    it finished): nothing of it runs, its devices go back, and the run goes on."""
    from sweep.runner.starter import Starter
    from sweep.study import Taken

    s = Sweep(tmp_path, ok, gpus=1, study={"n_trials": 1})
    inner = Starter.start
    taken: list[int] = []

    def start(self: Starter, asked: Any, lease: Any, port: Any) -> RunningTrial:
        if not taken:
            taken.append(asked.number)
            s.store.storage.set_trial_state_values(asked.trial._trial_id, TrialState.FAIL)
            raise Taken(asked.number)
        return inner(self, asked, lease, port)

    monkeypatch.setattr(Starter, "start", start)
    said = capture_messages(s)
    assert s.run() == 0
    assert taken == [0] and s.states() == ["FAIL", "COMPLETE"]
    assert len(s.spawn.processes) == 1  # the budget's trial only
    assert "trial 0 was already told by another driver" in said


def test_where_a_trial_runs_is_written_once_after_its_spawn_not_at_its_tell(tmp_path,
                                                                             monkeypatch):
    """Issue 41: the documented columns of where a trial runs (`gpu`, `host`, `attempt`) are
    written as its trainer starts (once spawned), off the device's hand-off; the tell, a
    second of the fake clock later, writes only what the end brought. Each is written once."""
    import optuna

    s = Sweep(tmp_path, ok, gpus=1, study={"n_trials": 2})
    writes: list[tuple[int, str, int, float]] = []  # (trial, key, processes spawned, time)
    inner = optuna.Trial.set_user_attr

    def set_user_attr(self: optuna.Trial, key: str, value: Any) -> None:
        writes.append((self.number, key, len(s.spawn.processes), s.clock.t))
        inner(self, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", set_user_attr)
    assert s.run() == 0
    for number in (0, 1):
        mine = {key: (spawned, t) for n, key, spawned, t in writes if n == number}
        assert len(mine) == len([w for w in writes if w[0] == number])  # each key once
        for key in (names.GPU, names.HOST, names.ATTEMPT):  # spawned, at its start
            assert mine[key] == (number + 1, pytest.approx(float(number))), (number, key)
        assert mine[names.EXIT_CODE][1] == pytest.approx(number + 1.0)  # at its end
    assert [(t.user_attrs[names.GPU], t.user_attrs[names.HOST], t.user_attrs[names.ATTEMPT])
            for t in s.trials] == [(0, s.store.owner.host, 0)] * 2


def test_devices_free_together_get_their_trials_before_any_is_noted(tmp_path, monkeypatch):
    """Where each trial runs is noted once the pass has started a trial on every free device:
    the notes of the first do not delay the spawn of the next."""
    from sweep.study import Store

    s = Sweep(tmp_path, ok, gpus=3, study={"n_trials": 3})
    seen: list[tuple[int, int]] = []  # (trial, processes spawned when its place was noted)
    inner = Store.placed

    def placed(self: Store, trial: Any, *args: Any) -> None:
        seen.append((trial.number, len(s.spawn.processes)))
        inner(self, trial, *args)

    monkeypatch.setattr(Store, "placed", placed)
    assert s.run() == 0
    assert seen == [(0, 3), (1, 3), (2, 3)]
    assert sorted(t.user_attrs[names.GPU] for t in s.trials) == [0, 1, 2]


def test_a_trial_told_by_another_driver_as_it_started_is_stopped_and_the_run_goes_on(
        tmp_path, monkeypatch):
    """Told by another driver between its spawn and the note of where it runs: it is
    stopped as one told by another driver (not left running), and the run goes on."""
    from sweep.study import Store

    s = Sweep(tmp_path, lambda p: Script(runs=3.0, result={"score": p["x"]}), gpus=1,
              study={"n_trials": 1})
    inner = Store.placed
    taken: list[int] = []

    def placed(self: Store, trial: Any, *args: Any) -> None:
        if not taken:
            taken.append(trial.number)
            self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        inner(self, trial, *args)

    monkeypatch.setattr(Store, "placed", placed)
    said = capture_messages(s)
    assert s.run() == 0
    assert taken == [0] and s.states() == ["FAIL", "COMPLETE"]
    assert s.spawn.processes[0].signals == ["TERM"]
    assert "trial 0 was already told by another driver" in said
