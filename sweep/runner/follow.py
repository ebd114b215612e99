"""Following a running trial between its start and its judging: its intermediate values, to
the pruner, the scheduler and storage; whether a continuation resumed (`ResumeCheck`); its
output and devices, for `trainer.hang_after`; and the one note that a pruner or a scheduler
will get no values from this study's trials.

The decisions are `hang`'s, the pruner's and the scheduler's; this module reads and acts. A
stop it decides is a `Stop` given to the trial (`RunningTrial.stop`), never a signal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweep.gpus.monitor import Monitor
from sweep.runner import scheduling
from sweep.runner.events import Events
from sweep.spec.schema import Spec
from sweep.study import lineages
from sweep.study.store import Asked, Store, Taken
from sweep.trial import hang, lineage, stacks
from sweep.trial.lineage import Start
from sweep.trial.running import HURRIED_DRAIN, MAX_DRAIN, Phase, RunningTrial, Stop

REPORTS_UNREAD = "reports_unread"  # a trial attribute: what of its values was left unread


class ResumeCheck:
    """Whether each continuation resumed: an attempt that carries its lineage on (after a
    pause, an interruption, a dead driver, a failure; a PBT exploit from its donor's folder)
    must report first a step after the one its lineage had reached. One that reports that
    step or an earlier one first started over, whatever its checkpoint folder held (a folder
    removed, or never written, is a start over too): its trial is flagged (`RESUMED_AT`,
    `STEPS_REPEATED`), and the run says once how to fix it. Counted steps are not judged:
    they go on from the lineage's last step whatever the trainer did."""

    def __init__(self, spec: Spec, store: Store, say: Callable[[str], None]) -> None:
        self.spec, self.store, self.say = spec, store, say
        # trial -> (the step its first must pass, its start, the first step its lineage (or,
        # an exploit, its donor's) reported: where it starts over)
        self._expect: dict[int, tuple[int, Start, int]] = {}
        self._said = False

    def started(self, asked: Asked, start: Start) -> None:
        """`asked` starts from `start`: what its first reported step must come after."""
        attrs = asked.trial.user_attrs
        if not (lineages.EXPLOIT_STEP in attrs or asked.lineage.resumes):
            return
        trials = self.store.study.get_trials(deepcopy=False)
        line = lineages.read(trials)[asked.origin]
        fresh = _first(trials, asked.origin if line.exploit_of is None else line.exploit_of,
                       asked.number)
        if lineages.EXPLOIT_STEP in attrs:  # it has just copied its donor's state (`on_start`)
            self._expect[asked.number] = (int(attrs[lineages.EXPLOIT_STEP]), start,
                                          fresh)
            return
        reached = _reached(trials, asked.origin, asked.number)
        if reached is None:  # an exploit cut after its copy, before its first report
            if line.exploit_step is not None:
                self._expect[asked.number] = (line.exploit_step, start, fresh)
            return
        if _gentle(trials, asked.lineage.continues):
            self._expect[asked.number] = (_saved_step(start, reached), start, fresh)
        else:  # after a crash or a kill -9 a script resumes from its last save: only a start
            # over (its lineage's first step again) is flagged
            self._expect[asked.number] = (fresh, start, fresh)

    def on_reports(self, run: RunningTrial, steps: Sequence[int]) -> None:
        """The first steps `run` reported: flagged if the first is not after the one its
        lineage had reached."""
        if not steps or run.number not in self._expect:
            return
        expect, start, fresh = self._expect.pop(run.number)
        if steps[0] > expect or (run.reports is not None and run.reports.counted):
            return
        first, repeated = steps[0], expect - steps[0] + 1
        self.store.note(run.trial, {lineages.RESUMED_AT: first,
                                    lineages.STEPS_REPEATED: repeated})
        if self._said:
            return
        self._said = True
        self.say(f"trial {run.number} continues lineage {run.origin} but reported step {first} "
                 f"first, not a step after {expect}: {repeated} steps repeated; "
                 + self._fix(start, first > fresh))

    def forget(self, number: int) -> None:
        self._expect.pop(number, None)

    def _fix(self, start: Start, older: bool) -> str:
        """Why it started over (or, `older`, went back to a step after its lineage's first),
        and what to do."""
        resumed = start.resume
        if start.gone:
            return ("its checkpoint folder was gone (removed by sweep under "
                    "study.scheduler.max_checkpoint_gb, or by hand) before it continued, so it "
                    "started over" if self.spec.study.scheduler is not None else
                    "its checkpoint folder was gone (removed by hand?) before it continued, "
                    "so it started over")
        if resumed and older:
            return ("it resumed from a state older than the step its lineage reached; have "
                    "the script save its state more often, or when it is stopped (SIGTERM: "
                    "sweep.protocol.should_stop())")
        if not resumed:
            keep = (", and keep it (study.scheduler.keep_checkpoints) while its lineage may "
                    "continue") if self.spec.study.scheduler is not None else ""
            return ("its checkpoint folder held nothing (never written, or removed) to "
                    "resume from; have the script save its state in $SWEEP_CHECKPOINT_DIR"
                    + keep)
        if self.spec.trainer.resume_args:
            return ("the script did not resume from what trainer.resume_args names "
                    f"({' '.join(self.spec.trainer.resume_args)}); have it load its state "
                    "from there")
        return ("it did not resume from its checkpoint; have the script load its state from "
                "$SWEEP_CHECKPOINT_DIR, or pass it with trainer.resume_args (e.g. "
                "[--resume_from_checkpoint, \"{last_checkpoint}\"])")


def _gentle(trials: Sequence[FrozenTrial], continued: int | None) -> bool:
    """Whether attempt `continued` ended gently, with the time to save its state: paused
    (PRUNED), or stopped by a signal (`interrupted`)."""
    for t in trials:
        if t.number == continued:
            return (t.state is TrialState.PRUNED
                    or t.user_attrs.get("fail_reason") == Stop.INTERRUPTED.value)
    return False


def _first(trials: Sequence[FrozenTrial], origin: int, number: int) -> int:
    """The first step lineage `origin`'s attempts other than `number` reported."""
    return min((step for t in trials if t.number != number
                and int(t.user_attrs.get(lineage.RETRY_OF, t.number)) == origin
                for step in t.intermediate_values), default=0)


def _reached(trials: Sequence[FrozenTrial], origin: int, number: int) -> int | None:
    """The last step lineage `origin`'s attempts other than `number` reported (None: none)."""
    steps = [step for t in trials if t.number != number
             and int(t.user_attrs.get(lineage.RETRY_OF, t.number)) == origin
             for step in t.intermediate_values]
    return max(steps, default=None)


def _saved_step(start: Start, reached: int) -> int:
    """The step a resumed attempt's first report must come after: that of its newest HF
    `checkpoint-N` folder (N steps done), which may be older than the step its lineage had
    reported; else the step the lineage had reached (a script that keeps its own state)."""
    if start.last_checkpoint is not None:
        found = lineage.HF_CHECKPOINT.match(start.last_checkpoint.name)
        if found:
            return int(found.group(1))
    return reached


class Follower:
    """The following of one run's trials (`scheduling` is set once the run made it)."""

    def __init__(self, spec: Spec, store: Store, monitor: Monitor | None,
                 now: Callable[[], float], events: Events) -> None:
        self.spec, self.store, self.monitor, self.now = spec, store, monitor, now
        self.events = events  # what the user is told goes there
        self.scheduling: scheduling.Scheduling | None = None
        self.resume = ResumeCheck(spec, store, lambda text: events.message(text))
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
        every = prune or self.scheduling is not None  # a scheduler reads every step's value
        stored = []
        for step, value in fresh if every else fresh[-1:]:
            try:
                if self.store.report(run.trial, step, value):
                    run.last_report = (step, value)
                    stored.append(step)
            except Taken:  # this driver was taken for dead (frozen): the trial is not ours
                run.stop(Stop.TAKEN, now)
                return
        self.resume.on_reports(run, [step for step, _ in fresh])
        if exited and run.cut_drain(now):
            self._unread(run)
        if fresh and prune and self.store.should_prune(run.trial):
            run.stop(Stop.PRUNED, now)
        if self.scheduling is not None:  # also on values read after exit
            decided = self.scheduling.on_reports(run, stored, decide=running)
            if decided is not None:
                run.stop(decided, now)
            if exited and not run.reports_pending:  # the last read, before it is told
                self.scheduling.reports_read(run)
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
        if not (self.prunes or self.scheduling is not None) or run.reports is None:
            return
        where = ("trainer.report" if self.spec.trainer.report is not None else
                 "$SWEEP_REPORT_FILE (sweep.protocol.report)")
        who = (f"the {self.spec.study.pruner.type} pruner cannot prune" if self.prunes else
               "study.scheduler cannot pause or promote")
        self.events.message(
            f"trial {run.number} ended without reporting an intermediate value to {where}: "
            f"{who} this study; set "
            "trainer.report to read them from the script's output or TensorBoard logs")
