"""What the driver knows of one running trial, and the one transition function of its phase.

`RunningTrial` carries a trial from its start until its processes are gone: its process, its
lineage and lease, its intermediate values, its deadlines, and its phase (RUNNING -> STOPPING ->
TOLD -> ENDED, checked against `MOVES`; before it, the driver's record of the trial is PARKED);
it decides from an injected clock when to stop the trial. `stop_all` stops many at once on the
way out."""

from __future__ import annotations

import enum
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.gpus import Lease
from sweep.trial.folders import TrialPaths, written_before
from sweep.trial.hang import OutputWatch
from sweep.trial.intermediate import IntermediateValues
from sweep.trial.lineage import Lineage
from sweep.trial.outcome import FAIL, Outcome, judge_files
from sweep.trial.process import GUARD_MARGIN, Process, kill_pids
from sweep.trial.stacks import STACK_NAME


class Stop(str, enum.Enum):
    """Why the driver stopped a trial (the first reason wins)."""

    PRUNED = "pruned"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    DRIVER_ERROR = "driver error"
    BAD_REPORT = "bad report"
    TAKEN = "told by another driver"  # which took this one for dead (it was frozen)
    HUNG = "hung"  # silent with idle GPUs for trainer.hang_after (`RunningTrial.detail` says)
    DEVICE_OUT = "its GPU was taken out of the pool"  # as sick (`RunningTrial.detail` says)
    PAUSED = "paused"  # at a rung, by study.scheduler: told PRUNED, may be promoted later
    REPLACED = "replaced"  # by a PBT exploit of another lineage: told PRUNED


class Phase(enum.Enum):
    """Where a trial is in its life, as the driver has seen it (`RunningTrial`'s phase, and
    PARKED before it: the driver's record of a trial asked, not started)."""

    PARKED = "parked"  # asked, not started: no process yet (it may wait for its lineage)
    RUNNING = "running"  # its command runs (or exited, not judged yet); reports are followed
    STOPPING = "stopping"  # a `Stop` reason was given: the guard escalates TERM -> KILL
    TOLD = "told"  # the command exited, the trial was judged and told; leftovers get the grace
    ENDED = "ended"  # its whole tree is gone; its devices are cleared, then released

    @property
    def told(self) -> bool:
        return self in (Phase.TOLD, Phase.ENDED)


# The moves `RunningTrial._move` allows: a trial is told once, after which no stop counts.
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.PARKED: frozenset({Phase.RUNNING}),  # the record's: or told unstarted, and gone
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.TOLD}),
    Phase.STOPPING: frozenset({Phase.TOLD}),
    Phase.TOLD: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}


MAX_DRAIN = 20_000  # passes (of at most a batch each) that read a trial's values after its exit
HURRIED_DRAIN = 2.0  # seconds those passes may last once the run is interrupted (`hurry`)


class PhaseError(RuntimeError):
    """A move `MOVES` does not allow: a defect in the driver, never the user's."""


@dataclass
class RunningTrial:
    """What the driver knows of one trial from its start until its processes are gone.

    Its life is `phase`, changed by `_move` only (see `MOVES`): RUNNING -> (STOPPING: a
    `Stop` reason, the guard escalates) -> TOLD (the command exited: judged and told) ->
    ENDED (the tree is gone; the device may be leased again once no process holds it).
    The deadlines (`deadline`, the guard's, `cleanup_at`) say when `tick` acts next.
    """

    trial: Any  # optuna.Trial: reports and pruning go through it
    number: int
    params: dict[str, Any]
    lineage: Lineage  # where it stands in its lineage (origin, attempt, what it continues)
    lease: Lease  # its devices, released by the driver once it ended
    process: Process
    grace: float
    deadline: float | None = None  # trainer.timeout, on the driver's clock
    reports: IntermediateValues | None = None  # its intermediate values (one objective)
    watch: OutputWatch | None = None  # its output, for trainer.hang_after (None: off)
    result_before: os.stat_result | None = None  # the result file found before it started
    phase: Phase = Phase.RUNNING
    stop_reason: Stop | None = None  # set with the move to STOPPING, kept after
    detail: str | None = None  # the fail_reason of a HUNG or DEVICE_OUT stop
    last_report: tuple[int, float] | None = None
    oom: bool = False  # judged out of memory: its devices are released as such
    resumed: bool = False  # it carries its lineage on from what its checkpoint folder held
    drained: int = 0  # passes that read its values after its command exited
    hurried: bool = False  # the run is interrupted: its drain lasts HURRIED_DRAIN s at most
    drain_until: float | None = None  # when its hurried drain ends (set at its first pass)
    unread: bool = False  # its drain was cut: values its trainer wrote were left unread
    cleanup_at: float | None = None  # when to look again at a device its processes still held
    began: float = 0.0  # when it started, on the driver's clock: its durations (not the wall's)
    _force_at: float | None = field(default=None, repr=False)

    @property
    def device(self) -> int:
        """Its first device (the one its trial's `gpu` attribute names)."""
        return self.lease.device

    @property
    def devices(self) -> tuple[int, ...]:
        return self.lease.devices

    @property
    def attempt(self) -> int:
        return self.lineage.attempt

    @property
    def origin(self) -> int:
        return self.lineage.origin

    def _move(self, to: Phase) -> None:
        """The one place `phase` changes; a move `MOVES` does not allow raises PhaseError."""
        if to not in MOVES[self.phase]:
            raise PhaseError(f"trial {self.number}: {self.phase.value} -> {to.value}")
        self.phase = to

    @property
    def judged(self) -> bool:
        """The trial was told (its command exited, or the driver gave up on it)."""
        return self.phase.told

    def stop(self, reason: Stop, now: float) -> None:
        """Stop the trial (SIGTERM, grace, SIGKILL in its guard); the first reason is kept.
        Once told, the leftovers already have their grace: nothing changes."""
        if self.phase is not Phase.RUNNING:
            return
        self._move(Phase.STOPPING)
        self.stop_reason = reason
        if self._force_at is None and not self.process.ended:
            self.process.stop()
            self._force_at = now + self.grace + GUARD_MARGIN

    def kill(self, now: float) -> None:
        """SIGKILL the whole tree now (a second Ctrl-C)."""
        if not self.process.ended:
            self.process.kill()
            self._force_at = min(self._force_at or math.inf, now + GUARD_MARGIN)

    def tick(self, now: float) -> None:
        """Act on the deadlines that passed: the trial's timeout, a guard that is late."""
        if self.process.ended:
            return
        if (self.deadline is not None and now >= self.deadline
                and self.phase is Phase.RUNNING and not self.process.command_exited):
            self.stop(Stop.TIMEOUT, now)
        if self._force_at is not None and now >= self._force_at:
            self.process.force_kill()
            self._force_at = now + GUARD_MARGIN

    def judged_now(self, now: float) -> None:
        """The command exited and the trial was told; its leftovers get the guard's grace."""
        self._move(Phase.TOLD)
        if self._force_at is None:
            self._force_at = now + self.grace + GUARD_MARGIN

    def clear_device(self, held: set[int], now: float) -> bool | None:
        """After the tree ended (the trial was told): is the device free of the trial's
        processes? `held` are the pids NVML shows on it. True: free; None: some were
        SIGKILLed, look again at `cleanup_at`; False: they survived a second after SIGKILL
        (the device is unusable)."""
        if self.phase is not Phase.ENDED:
            self._move(Phase.ENDED)
        left = held & self.process.seen_pids
        if not left:
            return True
        if self.cleanup_at is None:
            kill_pids(left)
            self.cleanup_at = now + 1.0
        return None if now < self.cleanup_at else False

    @property
    def follows_reports(self) -> bool:
        """Its intermediate values are read until it is told: every poll while it runs, and
        once its command exited (also one that was being stopped: what a trainer reports as
        it saves on SIGTERM is kept) the driver drains them, a bounded batch a pass, before
        it judges."""
        return self.reports is not None and not self.phase.told

    def hurry(self) -> None:
        """The run is interrupted (a stop signal): once its command exited, its values are
        read for HURRIED_DRAIN s at most, so a flooded backlog cannot hold the run's end."""
        self.hurried = True

    def drain_pass(self, now: float) -> None:
        """A pass reads its values after its command exited (its hurried drain starts)."""
        self.drained += 1
        if self.hurried and self.drain_until is None:
            self.drain_until = now + HURRIED_DRAIN

    def cut_drain(self, now: float) -> bool:
        """After a pass that left values: the drain ends here (MAX_DRAIN passes, or its
        hurried drain's time is over); `unread` is set. True: it was cut now."""
        if self.unread or self.reports is None or not self.reports.more:
            return False
        self.unread = self.drained > MAX_DRAIN or (
            self.drain_until is not None and now >= self.drain_until)
        return self.unread

    @property
    def reports_pending(self) -> bool:
        """Values wait that the last bounded read left for the next pass (after its command
        exited, until `cut_drain` ends the drain: a reader can never keep a trial from being
        told)."""
        return self.reports is not None and self.reports.more and not self.unread

    def verdict(self, metrics: list[str], timeout: float | None, patterns: list[str],
                stream: str = "stdout") -> Outcome:
        """`outcome.judge` of this trial's files, exit code, stop and last report (`patterns`
        search `stream`: stdout or stderr)."""
        paths, result = self.process.plan.paths, self.process.plan.result
        stale = not patterns and written_before(result, paths, self.result_before)
        verdict = judge_files(paths.stderr, result, self.process.exit_code,
                              metrics, stdout=paths.stdout, patterns=patterns, stream=stream,
                              env_result=paths.result,
                              at_end=(None,) if stale else self.process.result_at_end,
                              stop=self.stop_text(), timeout=timeout,
                              last_report=self.last_report)
        if stale and (verdict.fail_reason or "").startswith("no result:"):
            return Outcome(FAIL, exit_code=verdict.exit_code, fail_reason=(
                f"no result: {result} was last written before the trial started (left by "
                "an earlier run?)"))
        return verdict

    def stop_text(self) -> str | None:
        """How the trial was stopped, as `outcome.judge` is to be told (None: it was not)."""
        if self.stop_reason is Stop.BAD_REPORT and self.reports is not None:
            return self.reports.error
        if self.stop_reason in (Stop.HUNG, Stop.DEVICE_OUT) and self.detail is not None:
            return self.detail
        if self.stop_reason is None and self.process.lost:
            return "its guard process was killed (by the trainer?); what was left was stopped"
        return self.stop_reason.value if self.stop_reason else None

    def next_wakeup(self, now: float = 0.0, poll: float | None = None) -> float | None:
        """When the driver next has something to do for this trial: `tick`'s deadlines, its
        reports every `poll` s (at once while lines wait), its next look for a hang. None:
        only an event can."""
        if self.follows_reports and self.process.command_exited:
            return now  # its values drained, then it is judged (also once its tree is gone)
        if self.process.ended:
            return self.cleanup_at
        times = [self._force_at]
        if self.follows_reports and self.phase is Phase.RUNNING and poll is not None:
            times.append(now if self.reports_pending else now + poll)
        if self.phase is Phase.RUNNING and not self.process.command_exited:
            times.append(self.deadline)
        if self.watch is not None and self.phase is Phase.RUNNING:
            times.append(self.watch.next_look())
        known = [t for t in times if t is not None]
        return min(known) if known else None


def stop_all(runs: list[RunningTrial], reason: Stop, grace: float, now: float) -> None:
    """Stop every trial and wait until their trees are gone (SIGKILL after grace + margin).

    Blocking: for the way out of a driver that cannot go on.
    """
    for run in runs:
        run.stop(reason, now)
    deadline = time.monotonic() + grace + GUARD_MARGIN
    for run in runs:
        run.process.wait(max(0.0, deadline - time.monotonic()))
    for run in runs:
        if not run.process.ended:
            run.process.force_kill()
            run.process.wait(5)
        run.process.close()


def where_to_look(paths: TrialPaths, stop: Stop | None = None) -> Path:
    """The file a user should read about a failed trial: a hung one's stack.txt; else its
    stderr.log, or its stdout.log when the trainer wrote nothing to stderr."""
    if stop is Stop.HUNG:
        return paths.dir / STACK_NAME
    try:
        return paths.stderr if paths.stderr.stat().st_size else paths.stdout
    except OSError:
        return paths.stderr
