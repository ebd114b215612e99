"""`study.scheduler` carried out: the one place a scheduler's decisions (`schedulers`) touch the
study and the trials. The driver calls it at five points: how many jobs may start (`room`),
under the budget lock just before an ask (`before_ask`: a promotion is queued, a bracket
chosen, a PBT donor paused for a copy continued), when a trial starts (`on_start`: a PBT
exploit's consistent copy of its donor's state, `exploit.choose`), with each batch of a trial's
reports (`on_reports`: the explore check of `trainer.logged_params`, then go on, pause (at a
rung, or a PBT donor an exploit waits on) or replace; the resume check of every study is
`follow.ResumeCheck`'s), and when a
trial's processes are gone (`ended`: the checkpoint folders of lineages that can never
continue removed, under the budget lock, as `retention` decides).

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
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweep._core.safefs import UnsafePath
from sweep.runner import explored, retention
from sweep.runner.policy import RunResult
from sweep.runner.schedule_budget import (
    continuable,
    decisions,
    jobs,
    promotable,
    short_of,
    too_few,
    unstarted,
)
from sweep.runner.schedulers import (
    GoOn,
    Halving,
    NewConfiguration,
    Pause,
    Pbt,
    Promote,
    Replace,
)
from sweep.runner.starter import LineageBusy
from sweep.spec.schema import Spec
from sweep.study import lineages
from sweep.study.budget import LockAbandoned
from sweep.study.lineages import LineageView, Standing
from sweep.study.store import Asked, Store
from sweep.trial import (
    checkpoint_disk,
    exploit,
    folders,
    intermediate,
    launch_plan,
    lineage,
    lineage_lock,
)
from sweep.trial.lineage import Lineage, Start
from sweep.trial.running import RunningTrial, Stop

NO_RESUME_ARGS = (
    "study.scheduler pauses trials and continues them later: without trainer.resume_args, a "
    "paused trial can only continue if the script resumes from $SWEEP_CHECKPOINT_DIR itself "
    "(else it starts over, and sweep flags it: steps_repeated)")


class DonorRunning(LineageBusy):
    """A PBT exploit not started yet: its donor runs, with no complete state to copy (`pause`:
    it is paused at its next report; else its next `checkpoint-N` is awaited). It keeps its
    device (`keeps_device`) where the donor runs in the study: the wait is short (the donor
    is paused for it, or saves a first checkpoint), and a trial started there meanwhile would
    hold it while the donor, the population's best, waits for a device to continue. A donor
    folder held by another process (a straggler, a frozen driver's trainer) is a wait of
    unknown length: the device goes back."""

    def __init__(self, number: int, donor: int, pause: bool, path: Path,
                 keeps_device: bool = True) -> None:
        super().__init__(donor, path)
        self.number, self.donor, self.pause = number, donor, pause
        self.keeps_device = keeps_device

    def __str__(self) -> str:
        if not self.keeps_device:
            return (f"its donor trial {self.donor}'s checkpoint folder is in use by another "
                    f"process (the lock {self.path} is held): the copy waits until it is free")
        wait = ("it is paused at its next report, its folder copied, and it continues"
                if self.pause else "it saves a complete checkpoint-N")
        return f"its donor trial {self.donor} is running: the copy waits until {wait}"


class NotStarted(Exception):
    """An attempt not started that carries its lineage on: it is told PRUNED, paused
    (`PAUSED_AT` set first), and its lineage goes on only if it is promoted or given back."""

    def __init__(self, number: int, origin: int) -> None:
        super().__init__(number, origin)
        self.number, self.origin = number, origin


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
    signal) and is outside the top of it: it is paused there (`PAUSED_AT`, `RUNG` set first),
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
    """The decisions of `spec.study.scheduler` for one driver on `store`; `say` gives the user
    one line."""

    def __init__(self, spec: Spec, store: Store, say: Callable[[str], None]) -> None:
        assert spec.study.scheduler is not None
        self.spec, self.store, self.say = spec, store, say
        self.minimize = spec.study.objective_directions[0] == "minimize"
        self.decide: Halving | Pbt = decisions(spec)
        self._last: dict[int, int | None] = {}  # trial -> the last step of its lineage seen
        self._said_over = False
        # trainer.logged_params, in a pbt study: each trial's readers, its latest values and
        # its notes by boundary; the exploits whose explore is not checked yet (their donor)
        self._starts: dict[int, Start] = {}
        self._readers: dict[int, dict[str, intermediate.IntermediateValues]] = {}
        self._logged: dict[int, dict[str, float]] = {}
        self._notes: dict[int, dict[str, dict[str, float]]] = {}
        self._explores: dict[int, int] = {}
        # an exploit's first logged values (its run, the step they came by): what it is judged
        # on if it ends before it passes a boundary its donor noted too
        self._first: dict[int, tuple[RunningTrial, int, dict[str, float]]] = {}
        self._said_restored = False
        # sweep counts the reported steps: a HF checkpoint-N's N is the trainer's, not one
        self._counted = spec.trainer.report is not None and spec.trainer.report.counts_steps
        self._refused: set[int] = set()  # folders sweep would not remove: said once each
        self._refused_trash: set[str] = set()  # retired folders it would not purge, likewise
        if not spec.trainer.resume_args:
            say(NO_RESUME_ARGS)
        # said only if the run ends with none trained to the end (a rung that can no longer
        # grow promotes its best: a finite study trains it to max_steps, however small)
        self._too_few = too_few(self.decide, spec.study.n_trials)

    def lineages(self) -> dict[int, LineageView]:
        return lineages.read(self.store.study.get_trials(deepcopy=False))

    def _configurations(self, lines: dict[int, LineageView]) -> int:
        return len(lines)

    def room(self) -> int:
        """How many jobs may start now (`jobs`)."""
        return jobs(self.decide, self.spec.study.n_trials,
                    self.store.study.get_trials(deepcopy=False), self.spec.output_dir)

    def _promotable(self, lines: dict[int, LineageView], closed: bool) -> list[Promote]:
        """`promotable`: see there."""
        assert isinstance(self.decide, Halving)
        return promotable(self.decide, lines, closed, self.spec.output_dir)

    def result(self, result: RunResult, stopped: bool = False) -> RunResult:
        """The run's last line in configurations: `n_trials` counts them, not attempts; a run
        not `stopped` (by study.timeout, a signal, a give-up) that ends short of them says
        why (`short_of`)."""
        lines = self.lineages()
        done = sum(v.latest.state is TrialState.COMPLETE for v in lines.values())
        paused = sum(v.standing is Standing.PAUSED for v in lines.values())
        counted = re.sub(r"\d+/\d+ trials finished",
                         f"{len(lines)}/{self.spec.study.n_trials} configurations: {done} "
                         f"trained to the end, {paused} paused", result.message, count=1)
        trials = self.store.study.get_trials(deepcopy=False)
        running = any(t.state is TrialState.RUNNING for t in trials)
        why = None if stopped or result.exit_code or running else short_of(
            self.decide, self.spec.study.n_trials, trials) or (
            self._too_few if not done and lines else None)
        return dataclasses.replace(result, message=counted + (f"; {why}" if why else ""))

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
            for origin in continuable(self.decide, lines, self.spec.output_dir)[:1]:
                if self._queue_next(lines[origin]):
                    self.say(f"trial {origin} continues: its state was copied for the "
                             "exploits that waited on it")
                return Promote(origin, 0)
            self.store.enqueue_next(self.spec.study.enqueue)
            return NewConfiguration()
        found = self._promotable(
            lines, closed=self._configurations(lines) >= self.spec.study.n_trials)
        if found:
            job = found[0]
            if self._queue_next(lines[job.origin]):
                self.say(f"trial {job.origin} promoted from rung {job.rung} (step "
                         f"{self.decide.rungs[job.rung]}): queued to continue from its "
                         "checkpoint folder")
            return job
        self.store.enqueue_next(self.spec.study.enqueue)
        return NewConfiguration(self.decide.bracket_for(lines))

    def _queue_next(self, view: LineageView) -> bool:
        """Queue the next attempt of a paused lineage (the caller holds the budget lock); True
        if this call queued it."""
        latest = view.latest
        line = Lineage.of(latest.user_attrs, latest.number)
        searched = {k: v for k, v in view.params.items() if k in self.spec.searched}
        return self.store.requeue_held(searched, line.origin, line.attempt + 1,
                                       line.next_attrs(latest.number, retry=False))

    def after_ask(self, asked: Asked, job: Promote | NewConfiguration | None) -> None:
        """A new configuration of a Hyperband study records its bracket."""
        if (isinstance(job, NewConfiguration) and job.bracket
                and asked.attempt == 0 and lineages.BRACKET not in asked.trial.user_attrs):
            self.store.note(asked.trial, {lineages.BRACKET: job.bracket})

    def on_start(self, asked: Asked, start: Start) -> Start:
        """A trial starts (its lineage's lock held): a PBT exploit whose donor's state is not
        copied yet (its first attempt, or a continuation of one cut before its copy) gets it
        copied into its folder; the last step of its lineage it carries on is noted.
        Replaced: it carries on a lineage an exploit replaces (it does not start)."""
        line = self.lineages().get(asked.origin)
        if line is not None and line.replaced and asked.attempt > 0:
            self.store.note(asked.trial, {lineages.PAUSED_AT: line.last_step or 0})
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
            raise exploit.CalledOff(asked.number, donor, None, "it had been called off "
                                    "already (its driver was stopped before it told it)")
        if donor is not None:
            if asked.attempt > 0:  # a cut attempt's folder holds at most a part of a copy
                start = folders.prepare_checkpoint_dir(
                    self.spec.output_dir, dataclasses.replace(asked.lineage, continues=None))
            start, before = self._copy_donor(asked, donor, start)
        self._last[asked.number] = before
        self._starts[asked.number] = start
        if donor is not None and self.spec.trainer.logged_params:
            self._explores[asked.number] = donor
        return start

    def _judge_before_continuing(self, asked: Asked) -> None:
        """A continuation of a lineage under successive halving: the lineage judged at the
        rungs it reached and was not judged at (`Halving.before_continuing`), the decision
        recorded on `asked` first. PausedAtRung: it is outside the top there."""
        assert isinstance(self.decide, Halving)
        decision = self.decide.before_continuing(self.lineages(), asked.origin)
        if isinstance(decision, Pause):
            self.store.note(asked.trial, {lineages.PAUSED_AT: decision.step,
                                          lineages.RUNG: decision.rung})
            raise PausedAtRung(asked.number, asked.origin, decision.step, decision.rung,
                               self.decide.rungs[decision.rung],
                               self.decide.reduction_factor)
        if isinstance(decision, GoOn) and decision.rung is not None:
            self.store.note(asked.trial, {lineages.PASSED_RUNG: decision.rung})

    def _copy_donor(self, asked: Asked, donor: int, start: Start) -> tuple[Start, int]:
        """An exploit's first attempt: a consistent state of lineage `donor` copied into its
        folder (`exploit.choose`), under the donor's lineage lock where it is free (no attempt
        of the donor runs or starts during the copy), and the step copied recorded
        (`EXPLOIT_STEP`). DonorRunning (the exploit waits, parked) or exploit.CalledOff."""
        assert isinstance(self.decide, Pbt)
        out = self.spec.output_dir
        lock = lineage_lock.lock_path(out, donor)
        try:
            fd = lineage_lock.take(out, donor)
        except lineage_lock.Unsupported:
            fd = -1  # no lock on this file system: the study's states alone say it runs
        except OSError as e:
            raise self._call_off(asked, donor, f"its donor trial {donor}'s lock: {e}") from None
        try:
            line = self.lineages().get(donor)
            runs = line is not None and line.standing is Standing.RUNNING
            found = exploit.Donor(
                fd is None or runs, line is not None and line.latest.state is TrialState.COMPLETE,
                None if line is None else line.last_step)
            choice = exploit.choose(exploit.listing(lineage.checkpoint_dir(out, donor)), found,
                                    self.decide.spec.max_steps, self._counted)
            if isinstance(choice, exploit.Wait):
                raise DonorRunning(asked.number, donor, choice.pause, lock, keeps_device=runs)
            if isinstance(choice, exploit.NoStepsLeft):
                raise self._call_off(asked, donor)
            if not isinstance(choice, exploit.Nothing):
                try:
                    start = exploit.start_from_donor(out, donor, start, choice)
                except exploit.Torn:  # rotated while copied: the next pass takes the newest
                    raise DonorRunning(asked.number, donor, False, lock) from None
                except OSError as e:  # a full disk: the lineage it replaces goes on
                    raise self._call_off(asked, donor, f"its donor trial {donor}'s state "
                                         f"could not be copied: {e}") from None
            self.store.note(asked.trial, {lineages.EXPLOIT_STEP: choice.step})
            if start.resume:  # counted steps go on from the state copied
                start = dataclasses.replace(start, after=choice.step)
        finally:
            if fd is not None and fd >= 0:
                os.close(fd)
        what = (f"its {choice.name} copied" if isinstance(choice, exploit.CopyCheckpoint)
                else "its checkpoint folder copied" if isinstance(choice, exploit.CopyFolder)
                else "its checkpoint folder is empty, nothing copied")
        self.say(f"trial {asked.number} exploits trial {donor} at step {choice.step}: {what}, "
                 f"params perturbed ({_shown(asked.params, self.spec.searched)})")
        return start, choice.step

    def _call_off(self, asked: Asked, donor: int,
                  why: str | None = None) -> exploit.CalledOff:
        """An exploit whose donor has no state with a step left: recorded as called off, and
        the lineage it was to replace queued to go on from its own folder (under the budget
        lock, once), before the driver tells it FAIL."""
        own = self.lineages().get(asked.origin)  # a continuation carries no REPLACES itself
        replaces = (own.first if own is not None else asked.trial.user_attrs).get(
            lineages.REPLACES)
        with self.store.budget_lock():  # its continuation queued first: a kill between the
            # two leaves it queued (idempotent), never the lineage neither replaced nor queued
            line = self.lineages().get(int(replaces)) if replaces is not None else None
            if line is not None and line.latest.state is TrialState.RUNNING:
                try:  # still stopping: told PRUNED paused, it is continued (`continuable`)
                    storage, latest = self.store.storage, line.latest
                    storage.set_trial_user_attr(
                        storage.get_trial_id_from_study_id_trial_number(
                            self.store.study_id, latest.number),
                        lineages.PAUSED_AT, line.last_step or 0)
                except optuna.exceptions.UpdateFinishedTrialError:
                    line = self.lineages().get(line.origin)
            if line is not None and line.latest.state is TrialState.PRUNED:
                self._queue_next(line)
            self.store.note(asked.trial, {lineages.CALLED_OFF: True})
        return exploit.CalledOff(asked.number, donor, None if line is None else line.origin,
                                 why)

    def _awaited(self, run: RunningTrial, lines: dict[int, LineageView], step: int) -> bool:
        """Whether lineage `run.origin` (at `step`) is a donor an exploit waits on whose plain
        folder is copied only once it stops: then it is paused (`PAUSED_AT` set first)."""
        assert isinstance(self.decide, Pbt)
        if not any(v.awaits_copy and v.exploit_of == run.origin for v in lines.values()):
            return False
        choice = exploit.choose(
            exploit.listing(lineage.checkpoint_dir(self.spec.output_dir, run.origin)),
            exploit.Donor(True, False, step), self.decide.spec.max_steps, self._counted)
        if not (isinstance(choice, exploit.Wait) and choice.pause):
            return False
        self.store.note(run.trial, {lineages.PAUSED_AT: step})
        self.say(f"trial {run.number} paused at step {step}: an exploit copies its checkpoint "
                 "folder, then it continues")
        return True

    def on_reports(self, run: RunningTrial, steps: Sequence[int],
                   decide: bool = True) -> Stop | None:
        """New steps stored for `run` (the resume check is `follow.ResumeCheck`'s): with
        `decide` (the trial still runs: not being stopped, its command not exited), the
        scheduler's decision at the last (a Stop to give the trial, or None: it goes on)."""
        if not steps:
            return None
        before = self._last.get(run.number)
        step = max(steps)
        self._last[run.number] = step if before is None else max(before, step)
        if self.spec.trainer.logged_params and isinstance(self.decide, Pbt):
            self._follow_params(run, before, step)
        if not decide or (before is not None and step <= before):
            return None
        lines = self.lineages()
        if run.origin not in lines:
            return None
        if lines[run.origin].replaced:  # an exploit took its place; a reclaimer queued it on
            return Stop.REPLACED
        if isinstance(self.decide, Pbt):
            if self._awaited(run, lines, step):
                return Stop.PAUSED
            return self._pbt(run, lines, before, step)
        decision = self.decide.on_report(lines, run.origin, before, step)
        if isinstance(decision, GoOn) and decision.rung is not None:  # judged there: a
            # continuation after a stop is not judged there again (`_judge_before_continuing`)
            self.store.note(run.trial, {lineages.PASSED_RUNG: decision.rung})
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
        decision = self.decide.on_report(lines, run.origin, before, step, self.spec.searched,
                                         self._room_for_exploit(lines))
        if not isinstance(decision, Replace):
            return None
        with self.store.budget_lock():
            fresh = self.lineages()
            if any(int(v.first.get(lineages.REPLACES, -1)) == run.origin
                   for v in fresh.values()):
                return Stop.REPLACED  # another driver decided it first
            if not self._room_for_exploit(fresh):  # another driver took the last place
                return None
            self.store.study.enqueue_trial(
                decision.params, skip_if_exists=False,
                user_attrs={lineages.EXPLOIT_OF: decision.donor,
                            lineages.REPLACES: run.origin})
        self.say(f"trial {run.number} is in the bottom of the population at step {step}: "
                 f"replaced by an exploit of trial {decision.donor}")
        return Stop.REPLACED

    def _room_for_exploit(self, lines: dict[int, LineageView]) -> bool:
        """Whether n_trials leaves a configuration for an exploit: the population's first
        configurations not started yet keep their places."""
        assert isinstance(self.decide, Pbt)
        return (self._configurations(lines) + unstarted(self.decide, self.spec.study.n_trials,
                                                         lines) < self.spec.study.n_trials)

    def _follow_params(self, run: RunningTrial, before: int | None, step: int) -> None:
        """`trainer.logged_params`: the values the script logged so far read; an exploit's
        explore checked once it has logged them all (at `step`, against its donor's notes);
        at an `interval` boundary, the latest noted on the trial (what an exploit of it is
        compared with)."""
        readers = self._readers.get(run.number)
        if readers is None:
            plan, start = run.process.plan, self._starts.get(run.number)
            places = {**launch_plan.spec_places(self.spec), "trial_dir": str(plan.paths.dir),
                      "trial_number": str(run.number),
                      **(lineage.places(start) if start is not None else {})}
            readers = self._readers[run.number] = {
                name: intermediate.reader_for(section, plan.paths, name, places, plan.cwd)
                for name, section in self.spec.trainer.logged_params.items()}
        latest = self._logged.setdefault(run.number, {})
        for name, reader in readers.items():
            fresh = reader.read_rest(1 << 20)
            if fresh:
                latest[name] = fresh[-1][1]
        if run.number in self._explores and len(latest) == len(readers):
            self._first.setdefault(run.number, (run, step, dict(latest)))
        assert isinstance(self.decide, Pbt)
        at = explored.boundary(before, step, self.decide.spec.interval)
        if at is not None and latest:
            notes = self._notes.setdefault(run.number, {})
            for name, value in latest.items():
                notes.setdefault(name, {})[str(at)] = value
            self.store.note(run.trial, {lineages.LOGGED: notes})
        if run.number in self._first and run.number in self._explores:
            self._check_explore(run.number, final=False)

    def _check_explore(self, number: int, final: bool) -> None:
        """Exploit `number` has logged its params: flag the ones it runs with at its donor's
        value (`explored.restored`), compared at the same step, so that a schedule (a decayed
        or stepped learning rate) cannot hide it: at the first boundary both noted
        (`LOGGED`), once there is one for each; `final` (its processes are gone) with none,
        its first logged values against the donor's at the last boundary before them."""
        run, first_step, first = self._first[number]
        donor = self._explores[number]
        trials = self.store.study.get_trials(deepcopy=False)
        line = lineages.read(trials).get(donor)
        if line is None:
            return
        donor_notes: dict[str, dict[str, float]] = {}
        for t in trials:
            if int(t.user_attrs.get(lineage.RETRY_OF, t.number)) == donor:
                for name, notes in dict(t.user_attrs.get(lineages.LOGGED, {})).items():
                    donor_notes.setdefault(name, {}).update(notes)
        own = self._notes.get(number, {})
        pairs: dict[str, tuple[float, float | None]] = {}  # name -> (its value, the donor's)
        for name, value in first.items():
            theirs = donor_notes.get(name, {})
            common = sorted(int(b) for b in own.get(name, {}) if b in theirs)
            if common:
                pairs[name] = (own[name][str(common[0])], theirs[str(common[0])])
            elif final:
                pairs[name] = (value, explored.at_or_before(theirs, first_step))
            else:
                return  # judged once its donor noted a boundary it noted (or it ends)
        del self._explores[number]
        found = {}
        for name, (value, reference) in pairs.items():
            given, theirs_given = run.params.get(name), line.params.get(name)
            if not isinstance(given, (int, float)) or not isinstance(theirs_given,
                                                                     (int, float)):
                continue
            if explored.restored(value, reference, float(given), float(theirs_given)):
                found[name] = value
        if not found:
            return
        self.store.note(run.trial, {lineages.RESTORED_PARAMS: found})
        if self._said_restored:
            return
        self._said_restored = True
        shown = ", ".join(f"{k}={run.params[k]:g} but logged {v:g}" for k, v in found.items())
        self.say(f"trial {run.number} exploits trial {donor} with perturbed params ({shown}, "
                 "as its donor ran): it restored its donor's value from the checkpoint (an "
                 "optimizer's state holds its learning rate); have the script set the params "
                 "it is given after it loads the checkpoint (e.g. each optimizer param "
                 "group's lr, and a scheduler's base_lrs)")

    def reports_read(self, run: RunningTrial) -> None:
        """`run`'s command exited and all its reports were read (it is about to be told): an
        exploit whose explore is not checked yet is checked on what it logged
        (`_check_explore`, `final`)."""
        if run.number in self._first and run.number in self._explores:
            self._check_explore(run.number, final=True)

    def ended(self, number: int, abort: Callable[[], bool] = lambda: False) -> None:
        """Trial `number`'s processes are gone: what was kept for it goes, and the checkpoint
        disk is tidied (`tidy`; `abort` true gives up waiting for the budget lock)."""
        for kept in (self._starts, self._readers, self._logged, self._notes, self._explores,
                     self._first):
            kept.pop(number, None)
        with contextlib.suppress(LockAbandoned):  # a signal came: another trial's end will
            self.tidy(abort)

    def tidy(self, abort: Callable[[], bool] = lambda: False) -> None:
        """Remove the checkpoint folders of lineages that can never continue, as `retention`
        decides: measured before the budget lock, decided and taken out of their place
        (`checkpoint_disk.retire`, a rename) under it, where every promotion and exploit is
        decided, and their contents removed after it (`checkpoint_disk.purge`), so a large
        folder never holds the lock; over `max_checkpoint_gb` with nothing left to remove,
        say so once."""
        sched = self.spec.study.scheduler
        assert sched is not None
        if sched.keep_checkpoints == "all" and sched.max_checkpoint_gb is None:
            return
        out = self.spec.output_dir
        sizes = self._measure(self.lineages(), sched.max_checkpoint_gb is not None)
        retired = []
        with self.store.budget_lock(abort) as held:
            if not held:  # another driver holds it too long: decide another time
                return
            lines = self.lineages()
            dead = retention.never_continue(lines, self.decide, self.spec.study.n_trials)
            chosen = retention.plan(lines, dead, sizes, sched.keep_checkpoints,
                                    sched.max_checkpoint_gb, self.minimize,
                                    retention.spared(lines))
            for origin in chosen.remove:
                if origin in self._refused:
                    continue
                try:
                    if checkpoint_disk.retire(out, origin) is None:
                        continue  # a straggler of it still ends: another time
                except UnsafePath as e:
                    self._refused.add(origin)
                    self.say(f"the checkpoint folder of trial {origin} is kept: {e}")
                    continue
                retired.append(origin)
        self._purge()
        if retired:
            freed = sum(sizes[o] for o in retired)
            self.say(f"checkpoint folders removed ({_bytes(freed)}) of trials "
                     f"{', '.join(map(str, retired))}: they can never continue")
        if chosen.over and not self._said_over:
            self._said_over = True
            self.say(f"the checkpoint folders in {out / lineage.CHECKPOINTS} hold "
                     f"{_bytes(chosen.held)}, over study.scheduler."
                     f"max_checkpoint_gb ({sched.max_checkpoint_gb:g}), and what is left "
                     "belongs to lineages that may still continue (or the best finished one): "
                     "sweep removes none of those; raise the bound, or free disk elsewhere")

    def _measure(self, lines: dict[int, LineageView], bounded: bool) -> dict[int, int]:
        """The bytes in the folders `retention.plan` weighs, as they are now (another driver
        or the user may have removed some): every lineage's under a bound, else those that
        can never continue."""
        wanted = lines if bounded else retention.never_continue(
            lines, self.decide, self.spec.study.n_trials)
        return checkpoint_disk.sizes(self.spec.output_dir, sorted(wanted))

    def _purge(self) -> None:
        """The retired folders' contents removed (`checkpoint_disk.purge`); each refused is
        said once."""
        for e in checkpoint_disk.purge(self.spec.output_dir)[1]:
            if e.path not in self._refused_trash:
                self._refused_trash.add(e.path)
                self.say(f"a retired checkpoint folder is kept: {e}")


def _bytes(n: float) -> str:
    """`n` bytes in decimal units, as max_checkpoint_gb counts them: 812 B, 3.4 MB, 1.20 GB
    (rounded to 3 digits first: 999,999 B is 1 MB)."""
    rounded = float(f"{n:.3g}")
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if rounded >= size:
            return f"{n / size:.3g} {unit}" if unit != "GB" else f"{n / size:.2f} GB"
    return f"{n:.0f} B"


def _shown(params: dict[str, Any], searched: Any) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items() if k in searched)


def of(spec: Spec, store: Store, say: Callable[[str], None]) -> Scheduling | None:
    """The run's scheduling, or None for a study without `study.scheduler`."""
    return None if spec.study.scheduler is None else Scheduling(spec, store, say)

