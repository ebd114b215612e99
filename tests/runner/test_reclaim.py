"""Issue 32: a reclaim gives a dead driver's processes their `trainer.stop_grace`, and no two
processes ever write one lineage's folder (its lock, held by each attempt's guard). The rules
on fake processes and the fake clock; the lock's seam on a real guard."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from conftest import wait_until, with_orphan
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep._core import names
from sweep.protocol import TRIAL_DIR_ENV
from sweep.runner._reclaim import Next, decide
from sweep.testing.fakes import FakeClock, Script
from sweep.testing.harness import Sweep, capture_messages
from sweep.trial import lineage_lock, process
from sweep.trial.launch_plan import LaunchPlan, TrialPaths


def ok(params: dict[str, Any]) -> Script:
    return Script(runs=1.0, result={"score": params["x"]})


@pytest.mark.parametrize(("alive", "locked", "now", "kill_at", "killed", "step"), [
    (False, False, 0.0, None, False, Next.TELL),  # nothing left: told at once, as before
    (False, False, 0.0, 10.0, False, Next.TELL),  # ended within its grace
    (True, False, 9.9, 10.0, False, Next.WAIT),  # in its grace
    (True, False, 10.0, 10.0, False, Next.KILL),  # its grace is over
    (True, False, 11.0, 10.0, True, Next.WAIT),  # SIGKILLed: wait for it to go
    (False, True, 50.0, None, False, Next.WAIT),  # its lineage's lock is held (elsewhere)
    (False, True, 50.0, 10.0, True, Next.WAIT),  # gone here, but a holder of the lock lives
])
def test_the_reclaim_of_one_orphan(alive, locked, now, kill_at, killed, step):
    assert decide(alive, locked, now, kill_at, killed) is step


class Leftover:
    """A dead driver's process on the fake clock: ends `ends_after` s after SIGTERM (never,
    if None), at once on SIGKILL."""

    def __init__(self, clock: FakeClock, pid: int, ends_after: float | None = None,
                 ends_at: float | None = None) -> None:
        self.clock, self.pid, self.ends_after, self.ends_at = clock, pid, ends_after, ends_at

    @property
    def alive(self) -> bool:
        return self.ends_at is None or self.clock.t < self.ends_at

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.ends_at = min(self.ends_at or self.clock.t, self.clock.t)
        elif self.ends_after is not None and self.ends_at is None:
            self.ends_at = self.clock.t + self.ends_after


def told(s: Sweep) -> list[tuple[str, Any, Any]]:
    return [(t.state.name, t.user_attrs.get(names.FAIL_REASON), t.user_attrs.get(names.RETRY_OF))
            for t in s.trials]


def test_a_dead_drivers_unguarded_trainer_gets_sigterm_its_grace_then_sigkill(tmp_path):
    """Its guard was killed too: the reclaimer TERMs what is left, waits `stop_grace` (the
    loop going on), then KILLs it; the trial is told and continued only once it is gone."""
    s, sent = with_orphan(tmp_path, lambda clock: [Leftover(clock, 7, ends_after=None)],
                          trainer={"grace_period": 10.0})
    said = capture_messages(s)
    assert s.run() == 0
    assert sent == [(0.0, "SIGTERM", [7]), (10.0, "SIGKILL", [7])]
    assert [p.started for p in s.spawn.processes] == [10.5]  # once it was seen gone
    assert told(s) == [("FAIL", f"driver died (pid {os.getpid()} on test-host)", None),
                       ("COMPLETE", None, 0)]
    assert said[0] == (f"trial 0: driver died (pid {os.getpid()} on test-host); its processes "
                       "get trainer.stop_grace (10 s) to end, then it is told FAIL and continued")


def test_a_trainer_whose_guard_lives_gets_no_second_sigterm_and_ends_in_its_grace(tmp_path):
    """The dead driver's guard TERMed its trainer when the driver died (its control pipe
    closed): the reclaimer sends nothing, and waits for them; the trainer saves for 3 s."""
    s, sent = with_orphan(tmp_path, lambda clock: [Leftover(clock, 7, ends_at=3.0),
                                                   Leftover(clock, 8, ends_at=3.0)],
                          guard=7, trainer={"grace_period": 10.0})
    assert s.run() == 0
    assert sent == []
    assert [p.started for p in s.spawn.processes] == [3.0]
    assert told(s)[1] == ("COMPLETE", None, 0)


def test_a_guarded_tree_that_outlives_grace_and_margin_is_killed(tmp_path):
    s, sent = with_orphan(tmp_path, lambda clock: [Leftover(clock, 7), Leftover(clock, 8)],
                          guard=7, trainer={"grace_period": 4.0})
    assert s.run() == 0
    assert sent == [(6.0, "SIGKILL", [7, 8])]  # grace + the guard's margin (2 s)
    assert [p.started for p in s.spawn.processes] == [6.5]


def test_an_orphan_whose_lineage_lock_is_held_is_continued_once_it_is_free(tmp_path):
    """No process of it on this host (a warm fork, or a frozen driver's trainer on another host
    sharing the file system) but its lineage's lock is held: nothing is killed, the trial is
    told and continued once the lock is free."""
    s, sent = with_orphan(tmp_path, locked_until=7.0)
    said = capture_messages(s)
    assert s.run() == 0
    assert sent == []
    assert [p.started for p in s.spawn.processes] == [7.0]
    lock = s.spec.output_dir / "checkpoints" / ".0.lock"
    assert said[0].endswith(f"its lineage's checkpoint folder is still in use ({lock} is "
                            "held), then it is told FAIL and continued")


def queued_continuation(s: Sweep, **attrs: Any) -> Path:
    """Trial 0 FAIL (interrupted) and its continuation queued; its checkpoint folder holds
    `step.txt`. Returns the folder."""
    dist = {"x": FloatDistribution(0.0, 1.0)}
    s.store.study.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, params={"x": 0.5}, distributions=dist,
        user_attrs={names.ATTEMPT: 0, names.FAIL_REASON: "interrupted"}))
    s.store.study.enqueue_trial({"x": 0.5}, user_attrs={
        names.RETRY_OF: 0, names.ATTEMPT: 1, names.CONTINUES: 0, names.RETRIES: 0, **attrs})
    folder = s.spec.output_dir / "checkpoints" / "0"
    folder.mkdir(parents=True)
    (folder / "step.txt").write_text("41\n")
    (s.spec.output_dir / "checkpoints" / ".0.sweep").write_text("0\n")
    return folder


def test_an_orphan_whose_driver_beats_again_while_its_lock_is_held_is_not_told(tmp_path):
    """A driver frozen past reclaim_after, its trainer still writing the lineage's folder:
    it thaws before the lock frees, so its trial is left to it (told FAIL at the lock's
    release, its result would be thrown away and trained again)."""
    import psutil

    from sweep.study._optuna_compat import trial_id

    s, sent = with_orphan(tmp_path, locked_until=7.0)
    said = capture_messages(s)
    key = trial_id(s.trials[0])
    back = {"host": "test-host", "pid": os.getpid(), "started": psutil.Process().create_time(),
            "gpu": 0, "dir": str(s.spec.output_dir / "trials" / "0")}
    s.clock.at(3.0, lambda: s.store.storage.set_trial_user_attr(key, names.OWNER, back))
    assert s.run() == 0
    assert sent == [] and s.spawn.processes == []  # the budget is its driver's to spend
    assert [(t.state.name, t.user_attrs.get(names.FAIL_REASON)) for t in s.trials] == [
        ("RUNNING", None)]
    assert "trial 0: its driver is back (or it was told): not reclaimed" in said


def test_an_orphan_is_told_though_this_drivers_own_continuation_holds_its_lineage_lock(
        tmp_path):
    """Its dead driver queued its continuation before it could tell it; this driver runs
    that continuation, whose guard holds the lineage's lock: the lock says nothing of the
    orphan any more, which is told at once, not once its continuation ends."""
    s, sent = with_orphan(tmp_path, locked_until=1e9, n_trials=2)
    s.store.study.enqueue_trial({"x": 0.5}, user_attrs={
        names.RETRY_OF: 0, names.ATTEMPT: 1, names.CONTINUES: 0, names.RETRIES: 0})
    s.spawn.script = lambda p: Script(runs=5.0)
    seen: list[str] = []
    s.clock.at(1.0, lambda: seen.append(s.trials[0].state.name))
    assert s.run() == 0
    assert seen == ["FAIL"] and sent == []
    assert [t.state.name for t in s.trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert s.trials[0].user_attrs[names.FAIL_REASON].startswith("driver died")


def test_a_continuation_whose_lineage_is_locked_waits_untouched_then_starts(tmp_path):
    """The lineage's folder is held by another process (an earlier attempt's guard still
    ending): the asked attempt is parked, untouched (a clean retry would empty the folder),
    its device free for other trials meanwhile, and starts once the lock is free."""
    s = Sweep(tmp_path, ok, gpus=1, study={"n_trials": 1}, trainer={"retry_from": "clean"})
    folder = queued_continuation(s, retries=1, clean=True)
    held = lineage_lock.take(s.spec.output_dir, 0)
    assert held is not None
    seen: list[bool] = []
    s.clock.at(2.0, lambda: seen.append((folder / "step.txt").exists()))
    s.clock.at(4.0, lambda: os.close(held))
    said = capture_messages(s)
    assert s.run() == 0
    assert seen == [True]  # not emptied while another process held it
    assert [p.started for p in s.spawn.processes] == [4.0]
    assert not (folder / "step.txt").exists()  # then emptied: a clean retry
    assert told(s) == [("FAIL", "interrupted", None), ("COMPLETE", None, 0)]
    lock = s.spec.output_dir / "checkpoints" / ".0.lock"
    assert said[0] == (f"trial 1 waits to start: its lineage's checkpoint folder is still in "
                       f"use (the lock {lock} is held: an earlier attempt's processes are still "
                       "ending)")


def test_a_parked_attempt_gives_its_device_back_and_starts_on_the_next_one_free(tmp_path):
    """Review of issue 31: an attempt waiting for its lineage's lock (held by another process,
    for as long as that process lives) held the device it was asked on, idle. It gives it
    back: trial 2 runs there meanwhile; the attempt starts, once the lock is free, on the
    first device free, and its owner record names that device, not the one it was asked on."""
    s = Sweep(tmp_path, lambda p: Script(runs=10.0, result={"score": p["x"]}), gpus=2,
              study={"n_trials": 2})
    queued_continuation(s)
    held = lineage_lock.take(s.spec.output_dir, 0)
    assert held is not None
    s.clock.at(2.0, lambda: os.close(held))
    assert s.run() == 0
    started = [(p.plan.paths.dir.name, p.started, p.plan.env["CUDA_VISIBLE_DEVICES"])
               for p in s.spawn.processes]
    assert started == [("2", 0.0, "0"), ("1", 2.0, "1")]  # GPU 0, given back, took trial 2
    parked = s.trials[1]
    assert parked.user_attrs[names.OWNER]["gpu"] == parked.user_attrs[names.GPU] == 1


def test_a_continuation_runs_its_lineages_params_only_not_one_added_since(tmp_path):
    """Hostile pass of issue 31: a param added to the file between runs was sampled for a
    lineage carried on, so it continued its checkpoint with a configuration it never had. It
    runs its lineage's params only; a new trial samples the new one."""
    seen: list[dict[str, Any]] = []

    def script(params: dict[str, Any]) -> Script:
        seen.append(dict(params))
        return Script(runs=1.0, result={"score": params["x"]})

    s = Sweep(tmp_path, script, gpus=1, study={"n_trials": 2},
              params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                      "y": {"type": "float", "low": 0.0, "high": 0.1}})
    queued_continuation(s)
    assert s.run() == 0
    assert seen[0] == {"x": 0.5}  # the continuation of lineage 0, started without y
    assert s.trials[1].params == {"x": 0.5}
    assert set(seen[1]) == {"x", "y"} and set(s.trials[2].params) == {"x", "y"}


def test_a_continuation_of_an_attempt_cut_while_it_sampled_samples_what_it_lacks(tmp_path):
    """Review: a driver killed between sampling x and y left an attempt with x only; its
    continuation (queued with x) was then sampled x only, so y was never sampled, though
    every trial before it had y. A param the study had before the lineage began is
    sampled; only one the file added after it (no trial up to its first had it) is not."""
    seen: list[dict[str, Any]] = []

    def script(params: dict[str, Any]) -> Script:
        seen.append(dict(params))
        return Script(runs=1.0, result={"score": params["x"]})

    both = {"x": FloatDistribution(0.0, 1.0), "y": FloatDistribution(0.0, 0.1)}
    s = Sweep(tmp_path, script, gpus=1, study={"n_trials": 2},
              params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                      "y": {"type": "float", "low": 0.0, "high": 0.1}})
    s.store.study.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE, value=0.3, params={"x": 0.3, "y": 0.05},
        distributions=both))
    s.store.study.add_trial(optuna.trial.create_trial(  # cut after x, by a dead driver
        state=TrialState.FAIL, params={"x": 0.5},
        distributions={"x": both["x"]}, user_attrs={names.FAIL_REASON: "driver died"}))
    s.store.study.enqueue_trial({"x": 0.5}, user_attrs={
        names.RETRY_OF: 1, names.ATTEMPT: 1, names.CONTINUES: 1, names.RETRIES: 0})
    assert s.run() == 0
    assert seen[0]["x"] == 0.5 and set(seen[0]) == {"x", "y"}


def test_a_parked_attempt_at_a_stop_is_told_interrupted_and_continued(tmp_path):
    s = Sweep(tmp_path, ok, gpus=1, study={"n_trials": 1})
    queued_continuation(s)
    held = lineage_lock.take(s.spec.output_dir, 0)
    s.clock.at(2.0, lambda: s.driver._on_signal(signal.SIGINT, None))
    try:
        assert s.run() == 130
    finally:
        os.close(held)  # type: ignore[arg-type]
    assert s.spawn.processes == []
    assert told(s) == [("FAIL", "interrupted", None), ("FAIL", "interrupted", 0),
                       ("WAITING", None, 0)]
    assert s.trials[2].user_attrs[names.CONTINUES] == 1


def test_a_parked_attempt_is_not_started_after_a_stop_while_another_trial_ends(tmp_path):
    """Ctrl-C while a trainer beside it sits in its grace period: the lock freed meanwhile
    does not start the parked attempt (the run is ending): it is told interrupted and
    continued, as at the run's end."""
    s = Sweep(tmp_path, lambda p: Script(runs=20.0, ignores_term=True), gpus=2,
              study={"n_trials": 3}, trainer={"grace_period": 10.0})
    queued_continuation(s)
    held = lineage_lock.take(s.spec.output_dir, 0)
    s.clock.at(2.0, lambda: s.driver._on_signal(signal.SIGINT, None))
    s.clock.at(4.0, lambda: os.close(held))  # type: ignore[arg-type]
    assert s.run() == 130
    # the trials beside it only: the parked one gave its device back, a new trial took it
    assert [(p.plan.paths.dir.name, p.started) for p in s.spawn.processes] == [
        ("2", 0.0), ("3", 0.0)]
    assert [t.state.name for t in s.trials] == ["FAIL"] * 4 + ["WAITING"] * 3
    assert s.trials[1].user_attrs[names.FAIL_REASON] == "interrupted"
    assert sorted(t.user_attrs[names.CONTINUES] for t in s.trials[4:]) == [1, 2, 3]


def test_the_guard_holds_the_lineage_lock_for_its_tree_and_a_kill_9_frees_it(tmp_path):
    """The seam: the lock handed to a real guard is held while its tree lives (the driver's
    copy closed), not by the command, and is gone with the guard, even by SIGKILL."""
    paths = TrialPaths(tmp_path / "trial")
    paths.dir.mkdir()
    plan = LaunchPlan([sys.executable, "-c", "import time; time.sleep(60)"],
                      {TRIAL_DIR_ENV: str(paths.dir)}, paths, paths.result)
    fd = lineage_lock.take(tmp_path, 3)
    assert fd is not None
    proc = process.TrialProcess(plan, 1.0, hold=(fd,))
    os.close(fd)
    try:
        assert lineage_lock.busy(tmp_path, 3)
        assert lineage_lock.take(tmp_path, 3) is None
        assert wait_until(lambda: len(process.leftovers(paths.dir)) == 2, 10)
        found = process.leftovers(paths.dir)
        guards = [p.pid for p in found if process.is_guard(p)]
        assert guards == [proc.pid]
        command = next(p for p in found if p.pid != proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not lineage_lock.busy(tmp_path, 3), 10)
        assert wait_until(lambda: not command.is_running()
                          or command.status() == psutil.STATUS_ZOMBIE, 10)
    finally:
        proc.force_kill()
        proc.wait(5)
        proc.close()
    assert (tmp_path / "checkpoints" / ".3.lock").is_file()  # never removed


def test_a_file_system_that_cannot_lock_is_said_once_and_its_trials_start_unlocked(
        tmp_path, monkeypatch):
    """`flock` failing with ENOLCK (an NFS mount without its lock daemon) does not stop the
    run: said once, and each attempt starts without the lock."""
    import errno
    import types

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lineage_lock, "fcntl", types.SimpleNamespace(
        flock=no_locks, LOCK_EX=lineage_lock.fcntl.LOCK_EX, LOCK_NB=lineage_lock.fcntl.LOCK_NB))
    s = Sweep(tmp_path, ok, gpus=1, study={"n_trials": 2})
    said = capture_messages(s)
    assert s.run() == 0
    assert s.states() == ["COMPLETE", "COMPLETE"]
    lock = s.spec.output_dir / "checkpoints" / ".0.lock"
    assert said == [f"cannot lock {lock}: No locks available: two attempts of one lineage are "
                    "not kept from running at once on this file system (mount it with locking)"]
    assert not lineage_lock.busy(s.spec.output_dir, 0)
