"""The loop of one sweep: ask -> lease -> launch -> follow -> judge and tell -> release.

The loop only decides when to look, and judges. `policy` says what may happen, `store` speaks
to Optuna, `trials` holds one record of each trial asked and is its one way out (given back,
told, counted), `starter` prepares and spawns a trial (its `RunningTrial`), `follow` reads what
it reports, `scheduler` decides on its results (`sweep.schedulers`), `devices` acts on what the
trials and NVML say of the devices (`pool` holds them), `reclaim` ends and continues dead
drivers' trials. Every trial asked is told, whatever happens: a crash, a timeout, pruning,
Ctrl-C, a driver error. Each collaborator is given what it needs when it is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from sweep import schedulers
from sweep._core import GPU_MEM_PEAK_MB
from sweep.gpus import Lease, Monitor, Pool
from sweep.launch import make as launchers
from sweep.launch import provenance
from sweep.runner._devices import DeviceCare
from sweep.runner._events import Events, Finished, Running, Started, View
from sweep.runner._follow import Follower
from sweep.runner._reclaim import Reclaimer
from sweep.runner._resume_check import ResumeCheck
from sweep.runner._trials import Owned, Trials
from sweep.runner.clock import WallClock, signals_to
from sweep.runner.policy import OnSignal, Policy, RunResult
from sweep.runner.starter import POLL_SECONDS, Starter
from sweep.schedulers import CalledOff, NotStarted
from sweep.spec import Spec, searchspace
from sweep.study import (
    LOCK_PATIENCE,
    LockAbandoned,
    Store,
    Taken,
    savings,
    storage_lost_errors,
)
from sweep.trial import (
    LineageBusy,
    Phase,
    RunningTrial,
    Stop,
    folders,
    process,
    stop_all,
    where_to_look,
)


class Driver:
    """Runs `spec` on `pool` until the budget, the timeout, a signal or too many failures.
    `monitor` samples the devices (its clock should be `clock`'s, and a sick device should
    wake it), `events` is told what happens, `spawn` starts a trial's processes, `clock` is
    the run's (a `WallClock` by default; closed when the run ends), `record` what every
    trial's env.json shares (None: none is written)."""

    def __init__(
        self, spec: Spec, store: Store, pool: Pool, monitor: Monitor | None = None,
        events: Events | None = None, spawn: process.Spawn = process.TrialProcess,
        clock: Any = None, record: provenance.RunRecord | None = None,
    ) -> None:
        self.spec, self.store, self.pool, self.record = spec, store, pool, record
        self.events = events or Events()
        self.spawn = spawn
        self.clock = clock or WallClock()
        self.policy = Policy.of(spec, searchspace.grid_size(spec.study.sampler, spec.searched),
                                self.clock.now())
        self.trials = Trials(spec, store, pool, self.clock.now, self._say)
        self.devices = DeviceCare(spec, pool, store, self.policy, self.events, monitor)
        self.scheduler = schedulers.of(spec, store, self._say)
        self.follow = Follower(spec, store, monitor, self.clock.now, self.events,
                               self.scheduler, ResumeCheck(spec, store, self._say))
        self.reclaim = Reclaimer(spec, store, self.events, self.trials)
        self.starter: Starter  # made when the run starts, with its launcher
        self._unplaced: list[RunningTrial] = []  # started this pass: where, not yet noted

    @property
    def monitor(self) -> Monitor | None:
        return self.devices.monitor

    @property
    def own(self) -> Path:
        """This driver's folder in output_dir."""
        return folders.driver_dir(self.spec.output_dir, self.store.owner.host,
                                  self.store.owner.pid)

    def _say(self, text: str) -> None:
        """One line to the user (through `events` as it is when said)."""
        self.events.message(text)

    def run(self) -> RunResult:
        """Run to the end. Always tells every trial it asked; restores signal handlers; ends
        what the launcher holds (warm's fork server); closes the clock."""
        with contextlib.closing(self.clock):
            folders.prepare_output_dir(self.spec.output_dir, self.own, source=self.spec.source)
            older = folders.older_trial_folders(self.spec.output_dir)
            if older:  # said once here, not one refused folder a run
                self._say(folders.older_note(self.spec.output_dir, older))
            launcher = launchers.make(self.spec, self.store.owner.host, self.own, self._say,
                                      self._stopping, self.spawn)
            self.starter = Starter(self.spec, launcher, self.own, self.clock.now,
                                   self.clock.wake, self.record, self.store.note,
                                   self.scheduler, self.follow.resume, say=self._say)
            with contextlib.closing(launcher):
                return self._run()

    def _run(self) -> RunResult:
        self.starter.launcher.prepare()
        self.devices.begin()
        self.scheduler.begin()
        with signals_to(self._on_signal), self.trials.heartbeat, (
            self.monitor or contextlib.nullcontext()
        ):
            try:
                self._loop()
            except storage_lost_errors() as e:  # said once, by the run's last line
                self.store.lose(e)
                raise
            finally:
                self._abandon()
        result = self.policy.result(self.store.counts())
        self._say_savings()
        return dataclasses.replace(result, message=self.scheduler.last_line(
            result.message, result.exit_code, stopped=self.policy.stop_reason is not None))

    def _say_savings(self) -> None:
        """One of the run's closing lines, where a scheduler or pruner stopped trials early:
        device-hours spent, steps trained and pauses, against training every configuration
        to the end (`savings`, as `sweep report` counts them)."""
        trials = self.store.study.get_trials(deepcopy=False)
        sched = self.spec.study.scheduler
        if sched is None and not any(t.state is TrialState.PRUNED for t in trials):
            return
        found = savings.of_study(trials, None if sched is None else sched.max_steps)
        if found is not None:
            self._say(found.line())

    def _loop(self) -> None:
        while True:
            now = self.clock.now()
            self._react(now)
            self._start_trials()
            if self._stopping():  # a signal came while starting: react to it first
                continue
            if not self.trials.running() and not self._waiting():
                if not self.trials.tally.adjusted:
                    return
                self.trials.tally.forget()  # others' trials may have failed since: look again
                continue
            self.events.tick(self.view())
            self.clock.wait(self._next_wakeup(now))
            self._supervise(self.clock.now())

    def _waiting(self) -> bool:
        """Nothing runs, but the run is not over: a trial whose owner is unknown may become
        ours to reclaim, or other sweeps of this host hold the devices the budget needs."""
        if self.policy.stop_reason:
            return False
        return self.reclaim.waits or bool(self.trials.parked()) or (
            self.devices.blocked and self._room() > 0) or (
            self.scheduler.waits_on_running and self.trials.tally.get().running > 0)

    def _room(self) -> int:
        """How many trials may start now: the scheduler's word on the policy's room (a
        scheduler counts promotions, and configurations while n_trials allows); the policy's
        alone once it stopped starting trials."""
        def allowed() -> int:
            return self.policy.room(self.trials.tally.get())
        return allowed() if self.policy.stop_reason is not None else self.scheduler.room(allowed)

    def _stopping(self) -> bool:
        """A signal came that the loop has not reacted to yet."""
        return self.policy.pending

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.policy.signalled()
        self.clock.wake()

    def _react(self, now: float) -> None:
        """Signals, `study.timeout`, and the periodic look at storage (orphans, budget)."""
        while self.policy.pending:
            kill = self.policy.on_signal() is OnSignal.KILL_ALL
            for run in self.trials.running():
                run.hurry()  # a flooded backlog of values cannot hold the run's end
                run.kill(now) if kill else run.stop(Stop.INTERRUPTED, now)
        self.policy.check_clock(now)
        if self.reclaim.look(now):  # the study was read: the budget is read again too
            self.trials.tally.forget()
        self.reclaim.follow(now)
        news = self.policy.stop_news(len(self.trials.running()))
        if news is not None:
            self._say(news)

    def _next_wakeup(self, now: float) -> float:
        times = [self.reclaim.next_wakeup(now)]
        if self.devices.blocked or self.trials.parked():  # others hold the devices, or a
            times.append(now + POLL_SECONDS)  # lineage: look again
        if self.policy.deadline is not None and self.policy.stop_reason is None:
            times.append(self.policy.deadline)
        for run in self.trials.running():
            due = run.next_wakeup(now, POLL_SECONDS)
            times.append(math.inf if due is None else due)
        return max(0.0, min(times) - now)

    # ---- starting -----------------------------------------------------------------------

    def _start_trials(self) -> None:
        """Start trials while the budget has room and the pool gives devices; a refusal that
        ends the run gives up. Parked trials are tried first."""
        if self.policy.stop_reason is not None:  # a signal, the timeout, a give-up
            self._drop_parked()
        for owned in self.trials.parked():
            if self._stopping():
                break
            if owned.lease is None:  # it gave its devices back: the next free ones
                owned.lease = self.devices.acquire()
                if owned.lease is None:
                    continue
                owned.lease.bind(owned.number)
            self._launch(owned, again=True)
        while self._room() > 0 and not self._stopping():
            got = self.devices.acquire()
            if got is None:
                break
            try:
                self._start_one(got)
            finally:
                if got.trial is None:  # not asked after all (a signal, the budget spent)
                    self.trials.give_back(got)
        self.devices.say_out()
        self._note_places()

    def _note_places(self) -> None:
        """Where the trials started this pass run (`Store.placed`), once every free device has
        its trial: off the hand-off (its tell notes what this did not). Taken: stopped."""
        runs, self._unplaced = self._unplaced, []
        for run in runs:
            try:
                self.store.placed(run.trial, run.device, run.attempt, run.devices)
            except Taken:  # another driver told it meanwhile (took this one for dead)
                run.stop(Stop.TAKEN, self.clock.now())

    def view(self) -> View:
        """The run now, for a progress display (the counts as last read: the loop has just
        read them to decide on starting, so this reads no storage)."""
        counts, now = self.trials.tally.get(), self.clock.now()
        return View(
            self.spec.study.name, self.spec.study.n_trials, counts.finished,
            tuple(Running(r.number, r.device, r.params, now - r.began)
                  for r in self.trials.running()),
            tuple(d.index for d in self.pool.devices), frozenset(self.pool.quarantined),
            self.store.best)

    def _start_one(self, lease: Lease) -> None:
        """Ask a trial for `lease`'s devices, bind the lease to it, and start it. Returns
        without asking (the lease unbound) on a signal or once the budget is spent."""
        spec, device, tally = self.spec, lease.device, self.trials.tally
        self.starter.launcher.get_ready()  # before asking: a signal may end the wait
        if self._stopping():
            return
        try:
            with self.store.budget_lock(abort=self._stopping) as locked:
                # other drivers of the study may have spent the budget
                tally.forget()
                if self._room() <= 0 or self._stopping():
                    return
                job = self.scheduler.before_ask()  # None: what is queued, else study.enqueue
                queued = tally.get().waiting > 0 or (  # one at a time, else the sampler
                    job is None and self.store.enqueue_next(spec.study.enqueue))
                asked = self.store.ask(
                    spec.searched, device, lambda n: str(folders.trial_dir(spec.output_dir, n)),
                    lease.devices)
                self.scheduler.after_ask(asked, job)
        except LockAbandoned:
            return
        tally.add(running=1, waiting=-1 if queued else 0)
        if self.policy.around_lock(locked):
            self._say(f"the study's budget lock has been held for over {LOCK_PATIENCE:.0f} s "
                      "with no new trial (a stopped or frozen driver?): starting trials "
                      "without it for a while, so n_trials may be passed by one")
        lease.bind(asked.number)
        self._launch(self.trials.own(asked, lease))

    def _launch(self, owned: Owned, again: bool = False) -> None:
        """Start `owned` on its lease (bound to it). One whose lineage's folder another process
        still holds, or a PBT exploit whose donor has no state to copy yet, stays parked,
        beating, and is tried again each pass (`again`): on its lease
        (`LineageBusy.keeps_device`), or, its devices given back to the pool meanwhile, on the
        devices free then, before any other trial starts. Where it runs is noted once the
        pass has started every trial it can (`_note_places`)."""
        asked, lease = owned.asked, owned.lease
        assert lease is not None
        try:
            if owned.port is None and len(lease.devices) > 1:
                owned.port = self.pool.hold_port(lease, self.store.owner.host)
            if again:  # on other devices, maybe, than it was asked on: recorded before
                self.store.moved(asked.trial, lease.device, lease.devices)  # anything runs
            run = self.starter.start(asked, lease, owned.port)
        except LineageBusy as e:
            self.trials.park(owned, e.keeps_device)
            if not again:
                self.events.message(f"trial {asked.number} waits to start: {e}")
            return
        except Taken:  # another driver told it meanwhile (took this one for dead): nothing
            self.trials.finish(owned, TrialState.FAIL, Stop.TAKEN.value)  # of it runs
            self.events.message(f"trial {asked.number} was already told by another driver")
            return
        except CalledOff as e:  # a PBT exploit whose donor trained to the end first
            self.trials.finish(owned, TrialState.FAIL, f"exploit called off: {e}")
            self.events.message(f"trial {asked.number} is called off: {e}")
            return
        except NotStarted as e:  # its lineage gave way to an exploit meanwhile,
            # or is paused at a rung its last attempt reached unjudged
            self.trials.finish(owned, TrialState.PRUNED)
            self.events.message(f"trial {asked.number} does not start: {e}")
            return
        except folders.TrialFileError as e:  # a full, read-only or removed output_dir
            # nothing ran: its continuation runs in the next run, once the folder is fixed
            # (no retry spent; a promotion is not lost)
            self.trials.again(asked, "could not be prepared")
            self.trials.finish(owned, TrialState.FAIL, f"could not prepare the trial: {e.why}")
            self.policy.give_up(f"trial {asked.number} could not be prepared: {e.why}")
            return
        except BaseException as e:
            with contextlib.suppress(Exception):  # nothing of it runs: its place is kept
                self.trials.again(asked, "could not be started")
            self.trials.finish(owned, TrialState.FAIL, f"could not start the trial: {e}")
            raise
        owned.started(run)
        self.devices.started(asked.number, lease.devices)
        line = run.lineage
        if line.continues is not None:
            self.events.message(
                f"trial {asked.number} continues trial {line.continues} (attempt {line.attempt} "
                f"of trial {line.origin}) " + ("from its checkpoint folder" if run.resumed
                                               else "from scratch"))
        self.events.started(Started(asked.number, lease.device, run.params,
                                    run.process.started, lease.devices))
        self._unplaced.append(run)  # where it runs is noted once the pass has started all

    # ---- following ----------------------------------------------------------------------

    def _supervise(self, now: float) -> None:
        if self._stopping():  # a signal that reached the trainers too (a Slurm job step's):
            self._react(now)  # their trials were interrupted, whichever ends first
        again = self.devices.take_sick(now, self.trials.running())
        if again:
            self.trials.tally.add(waiting=again)
        for run in self.trials.running():
            run.tick(now)
            exited = run.process.command_exited  # before the read: it sees all it wrote
            if run.phase is Phase.RUNNING and not exited:
                self.follow.look_for_hang(run, now)
            if run.follows_reports and (exited or run.phase is Phase.RUNNING):
                self.follow.reports(run, now, exited)
            if exited and not run.judged and not run.reports_pending:
                self._judge(run, now)
            if run.process.ended and run.judged:
                self._end(run, now)

    def _judge(self, run: RunningTrial, now: float) -> None:
        """The command exited (and its intermediate values were read): judge the trial and
        tell it; its device stays leased."""
        trainer = self.spec.trainer
        verdict = run.verdict(self.spec.study.objective_metrics, trainer.timeout,
                              trainer.result.patterns if trainer.result else [],
                              trainer.result.stream if trainer.result else "stdout")
        usage = self.devices.usage(run)
        fault, again = self.devices.judged(run, verdict.state, verdict.cuda_error, now,
                                           self.trials.running())
        if again:
            self.trials.tally.add(waiting=again)
        # A retry is queued before the tell (once: `Store.requeue`), so a kill between the two
        # leaves it queued; a reclaimer that tells the trial FAIL meanwhile queues no second.
        # A trial told by another driver (TAKEN) is that driver's to queue again.
        # An interrupted trial's continuation is queued the same way (no retry spent).
        line = run.lineage
        interrupted = run.stop_reason is Stop.INTERRUPTED
        queued = False
        if run.stop_reason is not Stop.TAKEN:  # a device fault is no failure of the trial
            queued = self.trials.carry_on(run.params, run.number, line, not fault and (
                self.policy.retries(verdict.state, line.retries, verdict.oom, interrupted,
                                    verdict.study_fix)),
                fault or self.policy.continues(verdict.state, interrupted),
                "failed on a GPU taken out of the pool" if fault else "interrupted")
        # TOLD only once told: a driver error before it tells it FAIL (`_abandon`)
        told, exhausted = self.trials.finish(self.trials.record(run.number), verdict.state,
                                             verdict=verdict, usage=usage)
        self.follow.ended(run, verdict.state)
        run.oom = verdict.oom
        if self.devices.learns and verdict.state is not TrialState.FAIL:
            self.devices.learn(usage.get(GPU_MEM_PEAK_MB))
        if not told:
            self.events.message(f"trial {run.number} was already told by another driver")
        if exhausted:
            self.policy.stop_starting("the sampler has searched its whole space")
        self.events.finished(Finished(run.number, verdict.state, verdict.values, run.device,
                                      now - run.began, verdict.fail_reason,
                                      run.devices))
        if not told:  # the other driver counted it, and queued its params again
            return
        see = where_to_look(run.process.plan.paths, run.stop_reason)
        self.policy.after(verdict.state, line.retries, verdict.oom, interrupted,
                          verdict.fail_reason, see=str(see), device_fault=fault,
                          number=run.number, study_fix=verdict.study_fix)
        if queued:
            self.trials.tally.add(waiting=1)

    def _end(self, run: RunningTrial, now: float) -> None:
        """The trial's processes are gone: free its devices once none holds memory on them."""
        if not self.devices.cleared(run, now):
            return
        run.process.close()
        self.trials.end(self.trials.record(run.number), oom=run.oom)
        self.scheduler.ended(run.number, self._stopping)  # its lineage may never continue now

    # ---- the end ------------------------------------------------------------------------

    def _drop_parked(self) -> None:
        """Parked trials never started: continued as interrupted ones, told FAIL
        `interrupted`, their devices given back."""
        for owned in self.trials.parked():
            with contextlib.suppress(Exception):  # storage gone: reclaimed later
                self.trials.again(owned.asked, "interrupted")
            self.trials.finish(owned, TrialState.FAIL, Stop.INTERRUPTED)

    def _abandon(self) -> None:
        """On the way out with trials still running (a driver error): stop and tell them,
        and the parked ones (`_drop_parked`); every device goes back."""
        self._drop_parked()
        runs = self.trials.running()
        stop_all(runs, Stop.DRIVER_ERROR, self.spec.trainer.stop_grace, self.clock.now())
        for run in runs:
            owned = self.trials.record(run.number)
            if run.judged:
                self.trials.end(owned)
                continue
            if run.stop_reason is Stop.INTERRUPTED:  # queued first, as in `_judge`
                with contextlib.suppress(Exception):  # storage gone: reclaimed later
                    self.trials.carry_on(run.params, run.number, run.lineage, False, True)
            self.trials.finish(owned, TrialState.FAIL, run.stop_reason or Stop.DRIVER_ERROR)

