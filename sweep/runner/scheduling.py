"""`study.scheduler` carried out: the one place a scheduler's decisions (`schedulers`) touch the
study and the trials. The driver calls it at four points: how many jobs may start (`room`),
under the budget lock just before an ask (`before_ask`: a promotion is queued, a bracket
chosen), when a trial starts (`on_start`: a PBT exploit's checkpoint copied; what its first
step must come after), and with each batch of a trial's reports (`on_reports`: the resume
check, then go on, pause or replace).

Every decision is recorded in the study before it is acted on, under the budget lock where two
drivers could take it both: a promotion is its lineage's next attempt queued once
(`Store.requeue`), an exploit a new lineage queued once per replaced lineage (`REPLACES`), a
pause the `PAUSED_AT` attribute set on the running attempt before it is stopped. A driver
killed in between leaves the study as after the decision, or as before it: a promotion queued
is asked by whichever driver asks next; a paused attempt left RUNNING is reclaimed, and its
lineage continued, as any orphan's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from optuna.trial import TrialState

from sweep.runner.policy import RunResult
from sweep.runner.schedulers import (
    GoOn,
    Halving,
    NewConfiguration,
    Pause,
    Pbt,
    Promote,
    Replace,
)
from sweep.spec.schema import Spec
from sweep.study import lineages
from sweep.study.lineages import LineageView, Standing
from sweep.study.store import Asked, Store
from sweep.trial import exploit, lineage
from sweep.trial.lineage import Lineage, Start
from sweep.trial.running import RunningTrial, Stop

NO_RESUME_ARGS = (
    "study.scheduler pauses trials and continues them later: without trainer.resume_args, a "
    "paused trial can only continue if the script resumes from $SWEEP_CHECKPOINT_DIR itself "
    "(else it starts over, and sweep flags it: steps_repeated)")


class Scheduling:
    """The decisions of `spec.study.scheduler` for one driver on `store`; `say` gives the user
    one line."""

    def __init__(self, spec: Spec, store: Store, say: Callable[[str], None]) -> None:
        assert spec.study.scheduler is not None
        self.spec, self.store, self.say = spec, store, say
        self.minimize = spec.study.objective_directions[0] == "minimize"
        self.decide: Halving | Pbt = (
            Pbt(spec.study.scheduler, self.minimize)
            if spec.study.scheduler.type == "pbt"
            else Halving.of(spec.study.scheduler, self.minimize))
        self._last: dict[int, int | None] = {}  # trial -> the last step of its lineage seen
        self._expect: dict[int, int] = {}  # trial -> the step its first report must pass
        self._flagged = False
        if not spec.trainer.resume_args:
            say(NO_RESUME_ARGS)

    def lineages(self) -> dict[int, LineageView]:
        return lineages.read(self.store.study.get_trials(deepcopy=False))

    def _configurations(self, lines: dict[int, LineageView]) -> int:
        return len(lines)

    def room(self) -> int:
        """How many jobs may start now: queued attempts, promotable lineages, and new
        configurations while `n_trials` (configurations, not attempts) allows."""
        lines = self.lineages()
        queued = sum(1 for t in self.store.study.get_trials(
            deepcopy=False, states=(TrialState.WAITING,)))
        n = self.spec.study.n_trials
        if isinstance(self.decide, Pbt):
            first = sum(1 for v in lines.values() if v.exploit_of is None)
            return queued + max(0, min(n, self.decide.spec.population) - first)
        new = max(0, n - self._configurations(lines))
        return queued + len(self.decide.promotable(lines, closed=new == 0)) + new

    def result(self, result: RunResult) -> RunResult:
        """The run's last line in configurations: `n_trials` counts them, not attempts."""
        lines = self.lineages()
        done = sum(v.latest.state is TrialState.COMPLETE for v in lines.values())
        paused = sum(v.standing is Standing.PAUSED for v in lines.values())
        counted = re.sub(r"\d+/\d+ trials finished",
                         f"{len(lines)}/{self.spec.study.n_trials} configurations: {done} "
                         f"trained to the end, {paused} paused", result.message, count=1)
        return dataclasses.replace(result, message=counted)

    def before_ask(self) -> Promote | NewConfiguration | None:
        """Under the budget lock (the caller holds it), before an ask: with nothing queued,
        the best promotable lineage is queued to continue (Li et al.'s get_job), else a new
        configuration's bracket is chosen (and study.enqueue's next one queued). None: the
        ask takes a queued attempt."""
        waiting = self.store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return None
        lines = self.lineages()
        if isinstance(self.decide, Pbt):
            self._enqueue_next()
            return NewConfiguration()
        found = self.decide.promotable(
            lines, closed=self._configurations(lines) >= self.spec.study.n_trials)
        if found:
            job = found[0]
            latest = lines[job.origin].latest
            line = Lineage.of(latest.user_attrs, latest.number)
            searched = {k: v for k, v in lines[job.origin].params.items()
                        if k in self.spec.searched}
            if self.store.requeue_held(searched, line.origin, line.attempt + 1,
                                       line.next_attrs(latest.number, retry=False)):
                self.say(f"trial {job.origin} promoted from rung {job.rung} (step "
                         f"{self.decide.rungs[job.rung]}): queued to continue from its "
                         "checkpoint folder")
            return job
        self._enqueue_next()
        return NewConfiguration(self.decide.bracket_for(lines))

    def _enqueue_next(self) -> None:
        """`study.enqueue`'s next configuration not in the study yet, queued for the ask: a
        scheduler's study queues them one at a time (Optuna asks queued trials first, so
        all of them queued at once would start before any promotion)."""
        trials = self.store.study.get_trials(deepcopy=False)
        seen = [{**t.system_attrs.get("fixed_params", {}), **t.params} for t in trials]
        for params in self.spec.study.enqueue:
            if not any(all(p.get(k) == v for k, v in params.items()) for p in seen):
                self.store.study.enqueue_trial(params, skip_if_exists=False)
                return

    def after_ask(self, asked: Asked, job: Promote | NewConfiguration | None) -> None:
        """A new configuration of a Hyperband study records its bracket."""
        if (isinstance(job, NewConfiguration) and job.bracket
                and asked.attempt == 0 and lineages.BRACKET not in asked.trial.user_attrs):
            self.store.note(asked.trial, {lineages.BRACKET: job.bracket})

    def on_start(self, asked: Asked, start: Start) -> Start:
        """A trial starts: a PBT exploit's first attempt gets its donor's checkpoint folder
        copied into its own; what its first reported step must come after is noted."""
        attrs = asked.trial.user_attrs
        line = self.lineages().get(asked.origin)
        before = None
        if line is not None and line.curve and asked.attempt > 0:
            before = line.last_step
        donor = attrs.get(lineages.EXPLOIT_OF)
        if donor is not None and asked.attempt == 0:
            start = exploit.start_from_donor(self.spec.output_dir, int(donor), start)
            before = int(attrs.get(lineages.EXPLOIT_STEP, 0))
            self.say(f"trial {asked.number} exploits trial {donor} at step {before}: its "
                     "checkpoint folder copied, params perturbed "
                     f"({_shown(asked.params, self.spec.searched)})")
        self._last[asked.number] = before
        if before is not None and (start.resume or donor is not None):
            self._expect[asked.number] = _saved_step(start, before)
        return start

    def on_reports(self, run: RunningTrial, steps: Sequence[int],
                   decide: bool = True) -> Stop | None:
        """New steps stored for `run`: the resume check on its first, then, with `decide`
        (the trial still runs: not being stopped, its command not exited), the scheduler's
        decision at the last (a Stop to give the trial, or None: it goes on)."""
        if not steps:
            return None
        expect = self._expect.pop(run.number, None)
        if expect is not None and steps[0] <= expect:
            self._flag(run, steps[0], expect)
        before = self._last.get(run.number)
        step = max(steps)
        self._last[run.number] = step if before is None else max(before, step)
        if not decide or (before is not None and step <= before):
            return None
        lines = self.lineages()
        if run.origin not in lines:
            return None
        if lines[run.origin].replaced:  # an exploit took its place; a reclaimer queued it on
            return Stop.REPLACED
        if isinstance(self.decide, Pbt):
            return self._pbt(run, lines, before, step)
        decision = self.decide.on_report(lines, run.origin, before, step)
        if isinstance(decision, Pause):
            self.store.note(run.trial, {lineages.PAUSED_AT: decision.step,
                                        lineages.RUNG: decision.rung})
            self.say(f"trial {run.number} paused at step {decision.step}: outside the top "
                     f"1/{self.decide.reduction_factor} of rung {decision.rung} (step "
                     f"{self.decide.rungs[decision.rung]}) for now")
            return Stop.PAUSED
        return None

    def _pbt(self, run: RunningTrial, lines: dict[int, LineageView], before: int | None,
             step: int) -> Stop | None:
        assert isinstance(self.decide, Pbt)
        room = self._configurations(lines) < self.spec.study.n_trials
        decision = self.decide.on_report(lines, run.origin, before, step, self.spec.searched,
                                         room)
        if isinstance(decision, GoOn) or not isinstance(decision, Replace):
            return None
        with self.store.budget_lock():
            fresh = self.lineages()
            if any(int(v.first.get(lineages.REPLACES, -1)) == run.origin
                   for v in fresh.values()):
                return Stop.REPLACED  # another driver decided it first
            self.store.study.enqueue_trial(
                decision.params, skip_if_exists=False,
                user_attrs={lineages.EXPLOIT_OF: decision.donor,
                            lineages.EXPLOIT_STEP: decision.step,
                            lineages.REPLACES: run.origin})
        self.say(f"trial {run.number} is in the bottom of the population at step {step}: "
                 f"replaced by an exploit of trial {decision.donor}")
        return Stop.REPLACED

    def _flag(self, run: RunningTrial, first: int, expect: int) -> None:
        repeated = expect - first + 1
        self.store.note(run.trial, {lineages.RESUMED_AT: first,
                                    lineages.STEPS_REPEATED: repeated})
        if self._flagged:
            return
        self._flagged = True
        self.say(f"trial {run.number} continues lineage {run.origin} but reported step {first} "
                 f"first, not a step after {expect}: {repeated} steps repeated (it did not "
                 "resume from its checkpoint); have the script load its state from "
                 "$SWEEP_CHECKPOINT_DIR, or pass it with trainer.resume_args (e.g. "
                 "[--resume_from_checkpoint, \"{last_checkpoint}\"])")


def _saved_step(start: Start, reached: int) -> int:
    """The step a resumed attempt's first report must come after: that of its newest HF
    `checkpoint-N` folder (N steps done), which may be older than the step its lineage had
    reported; else the step the lineage had reached (a script that keeps its own state)."""
    if start.last_checkpoint is not None:
        found = lineage.HF_CHECKPOINT.match(start.last_checkpoint.name)
        if found:
            return int(found.group(1))
    return reached


def _shown(params: dict[str, Any], searched: Any) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items() if k in searched)


def of(spec: Spec, store: Store, say: Callable[[str], None]) -> Scheduling | None:
    """The run's scheduling, or None for a study without `study.scheduler`."""
    return None if spec.study.scheduler is None else Scheduling(spec, store, say)

