"""Whether each continuation resumed (`ResumeCheck`): an attempt that carries its lineage on must
report first a step after the one its lineage had reached; one that does not started over, is
flagged on its trial, and the run says once how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweep._core import EXPLOIT_STEP, FAIL_REASON, RESUMED_AT, RETRY_OF, STEPS_REPEATED
from sweep.schedulers import history
from sweep.spec import Spec
from sweep.study import Asked, Store
from sweep.trial import RunningTrial, Start, Stop, lineage


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
        # the study file sets study.scheduler: sweep may remove lineages' checkpoint folders
        self.scheduled = spec.study.scheduler is not None
        # trial -> (the step its first must pass, its start, the first step its lineage (or,
        # an exploit, its donor's) reported: where it starts over)
        self._expect: dict[int, tuple[int, Start, int]] = {}
        self._said = False

    def started(self, asked: Asked, start: Start) -> None:
        """`asked` starts from `start`: what its first reported step must come after."""
        attrs = asked.trial.user_attrs
        if not (EXPLOIT_STEP in attrs or asked.lineage.resumes):
            return
        trials = self.store.study.get_trials(deepcopy=False)
        line = history.read(trials)[asked.origin]
        fresh = _first(trials, asked.origin if line.exploit_of is None else line.exploit_of,
                       asked.number)
        if EXPLOIT_STEP in attrs:  # it has just copied its donor's state (`on_start`)
            self._expect[asked.number] = (int(attrs[EXPLOIT_STEP]), start,
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
        self.store.note(run.trial, {RESUMED_AT: first,
                                    STEPS_REPEATED: repeated})
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
                    "started over" if self.scheduled else
                    "its checkpoint folder was gone (removed by hand?) before it continued, "
                    "so it started over")
        if resumed and older:
            return ("it resumed from a state older than the step its lineage reached; have "
                    "the script save its state more often, or when it is stopped (SIGTERM: "
                    "sweep.protocol.should_stop())")
        if not resumed:
            keep = (", and keep it (study.scheduler.keep_checkpoints) while its lineage may "
                    "continue") if self.scheduled else ""
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
                    or t.user_attrs.get(FAIL_REASON) == Stop.INTERRUPTED.value)
    return False


def _first(trials: Sequence[FrozenTrial], origin: int, number: int) -> int:
    """The first step lineage `origin`'s attempts other than `number` reported."""
    return min((step for t in trials if t.number != number
                and int(t.user_attrs.get(RETRY_OF, t.number)) == origin
                for step in t.intermediate_values), default=0)


def _reached(trials: Sequence[FrozenTrial], origin: int, number: int) -> int | None:
    """The last step lineage `origin`'s attempts other than `number` reported (None: none)."""
    steps = [step for t in trials if t.number != number
             and int(t.user_attrs.get(RETRY_OF, t.number)) == origin
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
