"""Following a running trial between its start and its judging: its intermediate values, to
the pruner, the scheduler and storage, and to the check that a continuation resumed
(`_resume_check`); its output and devices, for `trainer.hang_after`; and the one note that a
pruner or a scheduler will get no values from this study's trials.

The decisions are `hang`'s, the pruner's and the scheduler's; this module reads and acts. A
stop it decides is a `Stop` given to the trial (`RunningTrial.stop`), never a signal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from optuna.trial import TrialState

from sweep._core import REPORTS_UNREAD
from sweep.gpus import Monitor
from sweep.runner._events import Events
from sweep.runner._resume_check import ResumeCheck
from sweep.schedulers import TrialScheduler
from sweep.spec import Spec
from sweep.study import Store, Taken
from sweep.trial import HURRIED_DRAIN, MAX_DRAIN, Phase, RunningTrial, Stop, hang, stacks


class Follower:
    """The following of one run's trials: `scheduler` decides on their results, `resume`
    checks that continuations resumed."""

    def __init__(self, spec: Spec, store: Store, monitor: Monitor | None,
                 now: Callable[[], float], events: Events, scheduler: TrialScheduler,
                 resume: ResumeCheck) -> None:
        self.spec, self.store, self.monitor, self.now = spec, store, monitor, now
        self.events = events  # what the user is told goes there
        self.scheduler, self.resume = scheduler, resume
        self.prunes = spec.study.pruner.type != "none"
        self.dump_stacks = stacks.dump  # (processes, path, why) -> text; a fake in tests
        self.python_pids = stacks.python_pids
        self._first_end = True  # no trial of this run reported, or completed, yet

    def reports(self, run: RunningTrial, now: float, exited: bool) -> None:
        """New intermediate values, a bounded batch a pass: each to the pruner while the trial
        runs; only the batch's latest is stored once it is being stopped or its command exited
        (the rest are read in the next passes, between which other trials and signals are
        served). A bad line stops the trial."""
        assert run.reports is not None
        if exited:
            run.drain_pass(now)
        fresh = run.reports.read()
        running = run.phase is Phase.RUNNING and not exited
        prune = self.prunes and running
        every = prune or self.scheduler.follows_results  # each step's value decided on
        stored = []
        for step, value in fresh if every else fresh[-1:]:
            try:
                if self.store.report(run.trial, step, value):
                    run.last_report = (step, value)
                    stored.append(step)
            except Taken:  # this driver was taken for dead (frozen): the trial is not ours
                run.stop(Stop.TAKEN, now)
                return
        try:  # what is noted on the trial from its values (`Store.note`) finds it Taken too
            self.resume.on_reports(run, [step for step, _ in fresh])
            if exited and run.cut_drain(now):
                self._unread(run)
            if fresh and prune and self.store.should_prune(run.trial):
                run.stop(Stop.PRUNED, now)
            stop = self.scheduler.on_result(run, stored, decide=running).stop  # after exit too
            if stop is not None:
                run.stop(stop, now)
            if exited and not run.reports_pending:  # the last read, before it is told
                self.scheduler.results_read(run)
        except Taken:
            run.stop(Stop.TAKEN, now)
            return
        if run.reports.error is not None:
            run.stop(Stop.BAD_REPORT, now)

    def _unread(self, run: RunningTrial) -> None:
        """`run`'s drain was cut with values left unread: noted on the trial
        (`REPORTS_UNREAD`) and said once for it."""
        last = "its first value" if run.last_report is None else f"step {run.last_report[0]}"
        why = ("the run was interrupted: read for "
               f"{HURRIED_DRAIN:g} s at most after it exited" if run.hurried else
               f"read in {MAX_DRAIN} passes at most after it exited")
        text = f"values after {last} were left unread ({why})"
        with contextlib.suppress(Taken):
            self.store.note(run.trial, {REPORTS_UNREAD: text})
        self.events.message(f"trial {run.number}: its trainer's {text}")

    def look_for_hang(self, run: RunningTrial, now: float) -> None:
        """`trainer.hang_after`: a trial silent that long with idle GPUs has the stacks of its
        Python processes dumped into stack.txt, then is stopped (FAIL `hung: ...`)."""
        watch, trainer = run.watch, self.spec.trainer
        if watch is None or trainer.hang_after is None or not watch.due(now):
            return
        last = watch.look(now)
        samples = self.monitor.samples_of(run.number) if self.monitor is not None else []
        found = hang.judge(last, samples, now, trainer.hang_after, trainer.hang_gpu_util)
        if found is None:
            return
        path = run.process.plan.paths.dir / stacks.STACK_NAME
        pids = run.process.tree_pids() - {run.process.pid}  # the guard is sweep's own
        self.dump_stacks(self.python_pids(pids), path, found.reason())
        run.detail = f"{found.reason()}; stacks in {path}"
        run.stop(Stop.HUNG, self.now())

    def ended(self, run: RunningTrial, state: TrialState) -> None:
        """A pruner that will never prune: say so once, when the first trial that reported
        or completed is one that completed without reporting a value."""
        self.resume.forget(run.number)
        if not self._first_end:
            return
        if run.last_report is not None or state is TrialState.PRUNED:
            self._first_end = False
            return
        if state is not TrialState.COMPLETE:  # it may have failed before its first report
            return
        self._first_end = False
        if not (self.prunes or self.scheduler.follows_results) or run.reports is None:
            return
        where = ("trainer.report" if self.spec.trainer.report is not None else
                 "$SWEEP_REPORT_FILE (sweep.protocol.report)")
        who = (f"the {self.spec.study.pruner.type} pruner cannot prune" if self.prunes else
               "study.scheduler cannot pause or promote")
        self.events.message(
            f"trial {run.number} ended without reporting an intermediate value to {where}: "
            f"{who} this study; set "
            "trainer.report to read them from the script's output or TensorBoard logs")
