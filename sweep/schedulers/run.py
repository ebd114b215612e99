"""`study.scheduler` carried out: the one place a scheduler's decisions (`halving`, `pbt`) touch the
study and the trials, behind the hooks of `api.TrialScheduler`: how many jobs may start
(`room`), under the budget lock just before an ask (`before_ask`: a promotion is queued, a
bracket chosen, a PBT donor paused for a copy continued), when a trial starts (`on_start`: a PBT
exploit's consistent copy of its donor's state, `exploit_copy.choose`), with each batch of a
trial's results (`on_result`: the explore check of `trainer.logged_params`, `_explore_check`,
then go on, pause (at a rung, or a PBT donor an exploit waits on) or replace; the resume check
of every study is `runner._resume_check`'s), and when a trial's processes are gone (`ended`: the
checkpoint folders of lineages that can never continue removed, `_tidy`).

Every decision is recorded in the study before it is acted on, under the budget lock where two
drivers could take it both: a promotion is its lineage's next attempt queued once
(`Store.requeue`), an exploit a new lineage queued once per replaced lineage (`REPLACES`), a
pause the `PAUSED_AT` attribute set on the running attempt before it is stopped. A donor's
folder is copied whole only under its lineage lock (no attempt of it runs or starts meanwhile),
and the donor continues only once no exploit waits on it (`EXPLOIT_STEP` set on each). A driver
killed in between leaves the study as after the decision, or as before it: a promotion queued
is asked by whichever driver asks next; a paused attempt left RUNNING is reclaimed, and its
lineage continued, as any orphan's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Sequence

from optuna.trial import TrialState

from sweep._core import BRACKET, EXPLOIT_OF, PASSED_RUNG, PAUSED_AT, REPLACES, RUNG
from sweep.schedulers import exploit_copy, history
from sweep.schedulers._exploit_start import ExploitStart, queue_next
from sweep.schedulers._explore_check import ExploreCheck
from sweep.schedulers._tidy import CheckpointTidy
from sweep.schedulers.api import Job, NoScheduler, NotStarted, OnResult, TrialScheduler
from sweep.schedulers.budget import (
    continuable,
    decisions,
    jobs,
    promotable,
    short_of,
    too_few,
    unstarted,
)
from sweep.schedulers.halving import GoOn, Halving, NewConfiguration, Pause, Promote
from sweep.schedulers.history import History, Standing
from sweep.schedulers.pbt import Pbt, Replace
from sweep.spec import Spec
from sweep.study import Asked, LockAbandoned, Store
from sweep.trial import RunningTrial, Start, folders, lineage

NO_RESUME_ARGS = (
    "study.scheduler pauses trials and continues them later: without trainer.resume_args, a "
    "paused trial can only continue if the script resumes from $SWEEP_CHECKPOINT_DIR itself "
    "(else it starts over, and sweep flags it: steps_repeated)")


def paused_at_rung(decision: Pause) -> dict[str, int]:
    """What a pause at a rung stores on the attempt, in the order it is written: `RUNG`, then
    `PAUSED_AT`, which says a pause is recorded (what readers test), so that a driver killed
    between the two writes leaves no pause without its rung."""
    return {RUNG: decision.rung, PAUSED_AT: decision.step}


class Replaced(NotStarted):
    """An attempt not started: it carries on a lineage a PBT exploit replaces (queued by a
    reclaim, or an interruption, before the replacement was seen). It is told PRUNED, paused
    where its lineage stands (`PAUSED_AT` set first), so that an exploit called off later
    gives the lineage back, to go on from its folder."""

    def __str__(self) -> str:
        return f"its lineage, trial {self.origin}, is replaced by a PBT exploit"


class PausedAtRung(NotStarted):
    """An attempt not started: its lineage reached a rung it was never judged at (its last
    attempt was stopped before the check: a driver killed after it decided a pause, a
    signal) and is outside the top of it: it is paused there (`paused_at_rung` set first),
    as its reports would have had it, to be promoted if it comes into the top."""

    def __init__(self, number: int, origin: int, step: int, rung: int, rung_step: int,
                 reduction_factor: int) -> None:
        super().__init__(number, origin)
        self.step, self.rung, self.rung_step = step, rung, rung_step
        self.reduction_factor = reduction_factor

    def __str__(self) -> str:
        return (f"its lineage, trial {self.origin}, paused at step {self.step}: outside the "
                f"top 1/{self.reduction_factor} of rung {self.rung} (step {self.rung_step}), "
                "which its last attempt reached but was stopped before it was judged there")


class Scheduling:
    """The decisions of `spec.study.scheduler` for one driver on `store` (a `TrialScheduler`);
    `say` gives the user one line."""

    follows_results = True  # every step's value is stored and decided on
    waits_on_running = True  # a trial running anywhere may end in a promotion of ours

    def __init__(self, spec: Spec, store: Store, say: Callable[[str], None]) -> None:
        assert spec.study.scheduler is not None
        self.spec, self.store, self.say = spec, store, say
        self.decide: Halving | Pbt = decisions(spec)
        self._last: dict[int, int | None] = {}  # trial -> the last step of its lineage seen
        self.explore = ExploreCheck(spec, store, say, self.decide.spec.interval) \
            if spec.trainer.logged_params and isinstance(self.decide, Pbt) else None
        self.disk = CheckpointTidy(spec, store, self.decide, say)
        self.exploits = ExploitStart(spec, store, say, spec.study.scheduler.max_steps,
                                     self.disk.make_room)
        # said only if the run ends with none trained to the end (a rung that can no longer
        # grow promotes its best: a finite study trains it to max_steps, however small)
        self._too_few = too_few(self.decide, spec.study.n_trials)

    def begin(self) -> None:
        """The run begins: a study file without trainer.resume_args is told what follows."""
        if not self.spec.trainer.resume_args:
            self.say(NO_RESUME_ARGS)

    def lineages(self) -> dict[int, History]:
        return history.read(self.store.study.get_trials(deepcopy=False))

    def _configurations(self, lines: dict[int, History]) -> int:
        return len(lines)

    def room(self, allowed: Callable[[], int] = lambda: 0) -> int:
        """How many jobs may start now (`jobs`: in configurations; `allowed`, the policy's room
        in trials, is not this study's measure)."""
        return jobs(self.decide, self.spec.study.n_trials,
                    self.store.study.get_trials(deepcopy=False), self.spec.output_dir)

    def _promotable(self, lines: dict[int, History], closed: bool) -> list[Promote]:
        """`promotable`: see there."""
        assert isinstance(self.decide, Halving)
        return promotable(self.decide, lines, closed, self.spec.output_dir)

    def last_line(self, line: str, exit_code: int, stopped: bool = False) -> str:
        """The run's last line (`line`, of a run that exits with `exit_code`) in
        configurations: `n_trials` counts them, not attempts; a run not `stopped` (by
        study.timeout, a signal, a give-up) that ends short of them says why (`short_of`)."""
        lines = self.lineages()
        done = sum(v.latest.state is TrialState.COMPLETE for v in lines.values())
        paused = sum(v.standing is Standing.PAUSED for v in lines.values())
        counted = re.sub(r"\d+/\d+ trials finished",
                         f"{len(lines)}/{self.spec.study.n_trials} configurations: {done} "
                         f"trained to the end, {paused} paused", line, count=1)
        trials = self.store.study.get_trials(deepcopy=False)
        running = any(t.state is TrialState.RUNNING for t in trials)
        why = None if stopped or exit_code or running else short_of(
            self.decide, self.spec.study.n_trials, trials) or (
            self._too_few if not done and lines else None)
        return counted + (f"; {why}" if why else "")

    def before_ask(self) -> Job | None:
        """Under the budget lock (the caller holds it), before an ask: with nothing queued,
        the best promotable lineage is queued to continue (Li et al.'s get_job), else a new
        configuration's bracket is chosen (and study.enqueue's next one queued). None: the
        ask takes a queued attempt."""
        waiting = self.store.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return None
        lines = self.lineages()
        if isinstance(self.decide, Pbt):
            for origin in continuable(self.decide, lines, self.spec.output_dir)[:1]:
                if queue_next(self.store, self.spec, lines[origin]):
                    self.say(f"trial {origin} continues: its state was copied for the "
                             "exploits that waited on it")
                return Promote(origin, 0)
            self.store.enqueue_next(self.spec.study.enqueue)
            return NewConfiguration()
        found = self._promotable(
            lines, closed=self._configurations(lines) >= self.spec.study.n_trials)
        if found:
            job = found[0]
            if queue_next(self.store, self.spec, lines[job.origin]):
                self.say(f"trial {job.origin} promoted from rung {job.rung} (step "
                         f"{self.decide.rungs[job.rung]}): queued to continue from its "
                         "checkpoint folder")
            return job
        self.store.enqueue_next(self.spec.study.enqueue)
        return NewConfiguration(self.decide.bracket_for(lines))

    def after_ask(self, asked: Asked, job: Job | None) -> None:
        """A new configuration of a Hyperband study records its bracket."""
        if (isinstance(job, NewConfiguration) and job.bracket
                and asked.attempt == 0 and BRACKET not in asked.trial.user_attrs):
            self.store.note(asked.trial, {BRACKET: job.bracket})

    def on_start(self, asked: Asked, start: Start) -> Start:
        """A trial starts (its lineage's lock held): a PBT exploit whose donor's state is not
        copied yet (its first attempt, or a continuation of one cut before its copy) gets it
        copied into its folder; the last step of its lineage it carries on is noted.
        Replaced: it carries on a lineage an exploit replaces (it does not start)."""
        line = self.lineages().get(asked.origin)
        if line is not None and line.replaced and asked.attempt > 0:
            self.store.note(asked.trial, {PAUSED_AT: line.last_step or 0})
            raise Replaced(asked.number, asked.origin)
        before = None
        if line is not None and line.curve and asked.attempt > 0:  # where its rungs stand
            before = self.decide.reach(line) if isinstance(self.decide, Halving) \
                else line.last_step
            if isinstance(self.decide, Halving):
                self._judge_before_continuing(asked)
        elif (line is not None and line.exploit_step is not None and asked.attempt > 0
              and start.resume):  # an exploit cut after its copy, before its first report,
            before = line.exploit_step  # resumes from the copy: its steps go on from there
            start = dataclasses.replace(start, after=before)
        donor = None if line is None or (asked.attempt > 0 and line.exploit_step is not None) \
            else line.exploit_of
        if donor is not None and line is not None and line.called_off:  # its driver was
            # stopped between calling it off and telling it: the lineage it replaced goes on
            raise exploit_copy.CalledOff(asked.number, donor, None, "it had been called off "
                                    "already (its driver was stopped before it told it)")
        if donor is not None:
            if asked.attempt > 0:  # a cut attempt's folder holds at most a part of a copy
                start = folders.prepare_checkpoint_dir(
                    self.spec.output_dir, dataclasses.replace(asked.lineage, continues=None))
            start, before = self.exploits.copy(asked, donor, start)
        self._last[asked.number] = before
        if self.explore is not None:
            self.explore.started(asked.number, start, donor)
        return start

    def _judge_before_continuing(self, asked: Asked) -> None:
        """A continuation of a lineage under successive halving: the lineage judged at the
        rungs it reached and was not judged at (`Halving.before_continuing`), the decision
        recorded on `asked` first. PausedAtRung: it is outside the top there."""
        assert isinstance(self.decide, Halving)
        decision = self.decide.before_continuing(self.lineages(), asked.origin)
        if isinstance(decision, Pause):
            self.store.note(asked.trial, paused_at_rung(decision))
            raise PausedAtRung(asked.number, asked.origin, decision.step, decision.rung,
                               self.decide.rungs[decision.rung],
                               self.decide.reduction_factor)
        if isinstance(decision, GoOn) and decision.rung is not None:
            self.store.note(asked.trial, {PASSED_RUNG: decision.rung})

    def _awaited(self, run: RunningTrial, lines: dict[int, History], step: int) -> bool:
        """Whether lineage `run.origin` (at `step`) is a donor an exploit waits on whose plain
        folder is copied only once it stops: then it is paused (`PAUSED_AT` set first)."""
        assert isinstance(self.decide, Pbt)
        if not any(v.awaits_copy and v.exploit_of == run.origin for v in lines.values()):
            return False
        choice = exploit_copy.choose(
            exploit_copy.listing(lineage.checkpoint_dir(self.spec.output_dir, run.origin)),
            exploit_copy.Donor(True, False, step), self.decide.spec.max_steps,
            self.exploits.counted)
        if not (isinstance(choice, exploit_copy.Wait) and choice.pause):
            return False
        self.store.note(run.trial, {PAUSED_AT: step})
        self.say(f"trial {run.number} paused at step {step}: an exploit copies its checkpoint "
                 "folder, then it continues")
        return True

    def on_result(self, run: RunningTrial, steps: Sequence[int],
                  decide: bool = True) -> OnResult:
        """New steps stored for `run` (the resume check is `runner._resume_check`'s): with `decide`
        (the trial still runs: not being stopped, its command not exited), the scheduler's
        decision at the last: go on, pause, or be replaced."""
        if not steps:
            return OnResult.GO_ON
        before = self._last.get(run.number)
        step = max(steps)
        self._last[run.number] = step if before is None else max(before, step)
        if self.explore is not None:
            self.explore.on_result(run, before, step)
        if not decide or (before is not None and step <= before):
            return OnResult.GO_ON
        lines = self.lineages()
        if run.origin not in lines:
            return OnResult.GO_ON
        if lines[run.origin].replaced:  # an exploit took its place; a reclaimer queued it on
            return OnResult.REPLACE
        if isinstance(self.decide, Pbt):
            if self._awaited(run, lines, step):
                return OnResult.PAUSE
            return self._pbt(run, lines, before, step)
        decision = self.decide.on_report(lines, run.origin, before, step)
        if isinstance(decision, GoOn) and decision.rung is not None:  # judged there: a
            # continuation after a stop is not judged there again (`_judge_before_continuing`)
            self.store.note(run.trial, {PASSED_RUNG: decision.rung})
        if isinstance(decision, Pause):
            self.store.note(run.trial, paused_at_rung(decision))
            self.say(f"trial {run.number} paused at step {decision.step}: outside the top "
                     f"1/{self.decide.reduction_factor} of rung {decision.rung} (step "
                     f"{self.decide.rungs[decision.rung]}) for now")
            return OnResult.PAUSE
        return OnResult.GO_ON

    def _pbt(self, run: RunningTrial, lines: dict[int, History], before: int | None,
             step: int) -> OnResult:
        assert isinstance(self.decide, Pbt)
        decision = self.decide.on_report(lines, run.origin, before, step, self.spec.searched,
                                         self._room_for_exploit(lines))
        if not isinstance(decision, Replace):
            return OnResult.GO_ON
        with self.store.budget_lock():
            fresh = self.lineages()
            if any(int(v.first.get(REPLACES, -1)) == run.origin
                   for v in fresh.values()):
                return OnResult.REPLACE  # another driver decided it first
            if not self._room_for_exploit(fresh):  # another driver took the last place
                return OnResult.GO_ON
            self.store.study.enqueue_trial(
                decision.params, skip_if_exists=False,
                user_attrs={EXPLOIT_OF: decision.donor,
                            REPLACES: run.origin})
        self.say(f"trial {run.number} is in the bottom of the population at step {step}: "
                 f"replaced by an exploit of trial {decision.donor}")
        return OnResult.REPLACE

    def _room_for_exploit(self, lines: dict[int, History]) -> bool:
        """Whether n_trials leaves a configuration for an exploit: the population's first
        configurations not started yet keep their places."""
        assert isinstance(self.decide, Pbt)
        return (self._configurations(lines) + unstarted(self.decide, self.spec.study.n_trials,
                                                         lines) < self.spec.study.n_trials)

    def ended(self, number: int, abort: Callable[[], bool] = lambda: False) -> None:
        """Trial `number`'s processes are gone: what was kept for it goes, and the checkpoint
        disk is tidied (`tidy`; `abort` true gives up waiting for the budget lock)."""
        if self.explore is not None:
            self.explore.forget(number)
        with contextlib.suppress(LockAbandoned):  # a signal came: another trial's end will
            self.tidy(abort)

    def results_read(self, run: RunningTrial) -> None:
        """`run`'s command exited and all its results were read (it is about to be told): an
        exploit whose explore is not checked yet is checked on what it logged."""
        if self.explore is not None:
            self.explore.results_read(run)

    def tidy(self, abort: Callable[[], bool] = lambda: False) -> None:
        """The checkpoint folders of lineages that can never continue removed
        (`_tidy`; `abort` true gives up waiting for the budget lock)."""
        self.disk.tidy(abort)


def of(spec: Spec, store: Store, say: Callable[[str], None]) -> TrialScheduler:
    """The run's scheduler: `study.scheduler`'s, or `NoScheduler` for a study without one."""
    return NoScheduler() if spec.study.scheduler is None else Scheduling(spec, store, say)

