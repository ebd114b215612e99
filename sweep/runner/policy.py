"""The run's decisions, with no side effects: may another trial start, what follows a verdict,
what a signal means, what is said once, and the exit code.

The driver feeds it counts from storage and verdicts from `outcome`, and carries out what it
says. Everything here is decided from its arguments and its own small state, so it is tested
in microseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from optuna.trial import TrialState

from sweep.spec import Spec
from sweep.study import Counts

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    message: str


@dataclass(frozen=True)
class Followup:
    """What follows a verdict: run the same params again, and/or stop starting trials."""

    retry: bool = False
    give_up: str | None = None


class OnSignal(enum.Enum):
    STOP_ALL = "stop every trial with its grace period"
    KILL_ALL = "kill every trial at once"


@dataclass
class Policy:
    """Budget, `study.timeout`, failure streak, retries and signals of one run."""

    n_trials: int
    max_consecutive_failures: int = 5
    max_retries: int = 0
    retry_oom: bool = False
    deadline: float | None = None  # when `study.timeout` ends, on the driver's clock
    timeout: float | None = None
    grid_size: int | None = None
    streak: int = 0
    signals: int = 0  # the stop signals reacted to (`on_signal`)
    stop_reason: str | None = None
    gave_up: bool = False
    streak_of: list[int] = field(default_factory=list)  # the trials of `streak` (when given)
    received: int = 0  # the stop signals received (`signalled`), reacted to or not
    said_stop: bool = False  # `stop_news` was said
    went_around: bool = False  # the last ask went around a stuck budget lock

    @classmethod
    def of(cls, spec: Spec, grid_size: int | None, now: float) -> Policy:
        study, trainer = spec.study, spec.trainer
        return cls(
            n_trials=study.n_trials,
            max_consecutive_failures=study.max_consecutive_failures,
            max_retries=trainer.max_retries,
            retry_oom=trainer.retry_oom,
            deadline=now + study.timeout if study.timeout else None,
            timeout=study.timeout,
            grid_size=grid_size,
        )

    def stop_starting(self, reason: str) -> bool:
        """No new trials from now on; True if this is the first reason given."""
        if self.stop_reason is not None:
            return False
        self.stop_reason = reason
        return True

    def give_up(self, reason: str) -> None:
        """Stop starting trials, and end the run as failed (exit 1)."""
        self.gave_up = True
        self.stop_starting(reason)

    def check_clock(self, now: float) -> str | None:
        """The reason to stop starting trials if `study.timeout` has just run out."""
        if self.deadline is not None and now >= self.deadline and self.stop_reason is None:
            reason = f"study.timeout of {self.timeout:g} s reached"
            self.stop_starting(reason)
            return reason
        return None

    def room(self, counts: Counts) -> int:
        """How many more trials may start now (0 once stopped, the budget or the grid met)."""
        if self.stop_reason is not None:
            return 0
        left = self.n_trials - counts.finished - counts.running
        if self.grid_size is not None:
            left = min(left, self.grid_size - counts.grid_started)
        return max(0, left)

    def signalled(self) -> None:
        """A stop signal came (in a signal handler: the loop reacts to it, `pending`)."""
        self.received += 1

    @property
    def pending(self) -> bool:
        """A signal came that `on_signal` has not been told of yet."""
        return self.received > self.signals

    def stop_news(self, running: int) -> str | None:
        """The line that says no new trial starts (once, after the first stop reason), with
        how many are still `running`."""
        if self.stop_reason is None or self.said_stop:
            return None
        self.said_stop = True
        return f"{self.stop_reason}: no new trials" + (
            f"; waiting for {running}" if running else "")

    def around_lock(self, locked: bool) -> bool:
        """An ask held the budget lock (`locked`), or went around it: whether to say so (the
        first of a streak without it)."""
        say = not locked and not self.went_around
        self.went_around = not locked
        return say

    def on_signal(self) -> OnSignal:
        """Ctrl-C or SIGTERM: the first stops trials gently, any further one kills them."""
        self.signals += 1
        self.stop_starting("interrupted")
        return OnSignal.STOP_ALL if self.signals == 1 else OnSignal.KILL_ALL

    def after(
        self, state: TrialState, attempt: int, oom: bool = False, interrupted: bool = False,
        fail_reason: str | None = None, see: str = "", device_fault: bool = False,
        number: int | None = None, study_fix: bool = False,
    ) -> Followup:
        """What follows a trial told `state` (COMPLETE, PRUNED or FAIL); `attempt` is how
        many retries after a real failure its lineage has had (`lineage.Lineage.retries`);
        `see` names where the user should look if the run gives up. An interrupted trial is
        carried on (`continues`), and is no failure: the streak stays as it was.
        `device_fault`: it failed on a device taken out of the pool as sick: its params run
        again elsewhere, and it is not counted toward `max_consecutive_failures`. `number`:
        the trial's, so that `forgive` can take it out of the streak later. `study_fix`: its
        reason names a fix of the study file (every trial would fail the same way): no retry,
        and no new trial starts."""
        if state is TrialState.FAIL and study_fix and not interrupted:
            reason = f"trial {number} failed and the study file must change: {fail_reason}"
            self.give_up(reason)
            return Followup(give_up=reason)
        if state is not TrialState.FAIL:
            self.streak = 0
            self.streak_of.clear()
            return Followup()
        if interrupted:
            return Followup()
        if device_fault:
            return Followup(retry=True)
        retry = self.retries(state, attempt, oom, interrupted)
        self.streak += 1
        if number is not None:
            self.streak_of.append(number)
        if self.streak < self.max_consecutive_failures:
            return Followup(retry=retry)
        reason = (f"stopped after {self.max_consecutive_failures} failed trials in a row "
                  f"(last: {fail_reason})" + (f"; see {see}" if see else ""))
        self.give_up(reason)
        return Followup(retry=retry, give_up=reason)

    def forgive(self, numbers: set[int]) -> None:
        """These trials failed on a device found sick since: those still in the current
        streak of failures no longer count toward `max_consecutive_failures`."""
        kept = [n for n in self.streak_of if n not in numbers]
        self.streak -= len(self.streak_of) - len(kept)
        self.streak_of = kept

    def retries(
        self, state: TrialState, attempt: int, oom: bool = False, interrupted: bool = False,
        study_fix: bool = False,
    ) -> bool:
        """Whether a trial told `state` after `attempt` retries of its lineage is retried (as
        `after` says), decided before it is told: its retry is queued first. An interrupted
        trial is not retried but carried on (`continues`); nor is one whose reason names a fix
        of the study file."""
        return state is TrialState.FAIL and not interrupted and not study_fix \
            and attempt < self.max_retries and (self.retry_oom or not oom)

    def continues(self, state: TrialState, interrupted: bool) -> bool:
        """Whether a trial told `state` is carried on by a new attempt of its lineage (the
        same params, from its checkpoint): it failed only because the run was interrupted.
        Decided before it is told, as `retries`; no retry is spent."""
        return state is TrialState.FAIL and interrupted

    def exit_code(self) -> int:
        if self.signals:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.gave_up else EXIT_OK

    def result(self, counts: Counts) -> RunResult:
        """The exit code, and the run's last line."""
        text = f"{counts.finished}/{self.n_trials} trials finished"
        if counts.running:
            text += f", {counts.running} running in other drivers"
        code = self.exit_code()
        if code == EXIT_INTERRUPTED:
            text = f"interrupted; {text}"
        elif code == EXIT_FAILED:
            text = f"{self.stop_reason}; {text}"
        return RunResult(code, text)
