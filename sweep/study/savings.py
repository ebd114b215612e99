"""What a study's training cost, and what training every configuration to the end would have
cost: one computation (pure: trials in, numbers out) for `sweep report`, the run's last lines
and `benchmarks/`.

Steps are the step numbers the trainer reported, not its count of reports: a script that
reports every 25 steps and reached step 100 trained 100 steps (`steps_trained`). The cost of a
step is the device-hours spent over the steps trained, and training every configuration to
the end is that cost times `max_steps` (the scheduler's; without one, the steps of the
longest lineage that completed) for each configuration (lineage) that ran.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from optuna.trial import FrozenTrial, TrialState

from sweep._core import names


@dataclass(frozen=True)
class Savings:
    """`device_hours` spent by every attempt, `steps` they trained, the `configurations`
    (lineages) that ran, the step they would each have trained to (`max_steps`), `pauses`
    (attempts paused: at a rung, or a PBT donor for its copy) and `stops` (attempts stopped
    before the end by the scheduler or the pruner, told PRUNED: the pauses, lineages a PBT
    exploit replaced, trials pruned)."""

    device_hours: float
    steps: int
    configurations: int
    max_steps: int
    pauses: int
    stops: int = 0

    @property
    def full_device_hours(self) -> float:
        """Training every configuration to `max_steps` at the mean cost of a step trained."""
        return self.device_hours / self.steps * self.max_steps * self.configurations

    @property
    def saved_device_hours(self) -> float:
        return self.full_device_hours - self.device_hours

    def line(self) -> str:
        """The run's closing line on what it cost and saved."""
        pauses = f", {self.pauses} pause{'s' if self.pauses != 1 else ''}" if self.pauses else ""
        return (f"{self.device_hours:.3g} device-hours spent on {self.steps} steps trained"
                f"{pauses}; training all {self.configurations} configuration"
                f"{'s' if self.configurations != 1 else ''} to step {self.max_steps} would have "
                f"cost {self.full_device_hours:.3g}: {self.saved_device_hours:.3g} saved")


def ended(t: FrozenTrial, now: datetime) -> datetime | None:
    """When attempt `t` stopped holding its devices: its driver's last sign of life where a
    reclaim told it (`ALIVE_UNTIL`), else when it was told, else `now` (running); None if it
    never started."""
    if t.datetime_start is None:
        return None
    alive = t.user_attrs.get(names.ALIVE_UNTIL)
    if isinstance(alive, int | float) and t.state is TrialState.FAIL:
        return max(t.datetime_start, datetime.fromtimestamp(float(alive)))
    return t.datetime_complete or now


def device_hours(t: FrozenTrial, now: datetime) -> float:
    """The device-hours attempt `t` held (its devices times its time, until `ended`)."""
    end = ended(t, now)
    if end is None or t.datetime_start is None:
        return 0.0
    devices = str(t.user_attrs.get(names.GPUS) or "").count(",") + 1
    return max(0.0, (end - t.datetime_start).total_seconds()) * devices / 3600


def report_interval(trials: Iterable[FrozenTrial]) -> int | None:
    """The steps between two reports: the smallest gap between steps an attempt reported one
    after the other (None: no attempt reported twice)."""
    gaps = [b - a for t in trials
            for a, b in itertools.pairwise(sorted(t.intermediate_values)) if b > a]
    return min(gaps) if gaps else None


def steps_trained(trials: Iterable[FrozenTrial]) -> dict[int, int]:
    """The steps each attempt trained, by trial number: from the step its lineage had reached
    before it (the last its earlier attempts reported, which a continuation carries in its
    own curve; a PBT exploit's first, the step of its donor's state copied) to its last
    report. An attempt that started over (`RESUMED_AT`: its first report did not come after
    that step), or a lineage's first, trained from one report interval before its first
    report (no earlier than step -1: step 0 reported after one step, as a script counting
    from 0 reports)."""
    trials = list(trials)
    interval = report_interval(trials)
    by_origin: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        by_origin.setdefault(int(t.user_attrs.get(names.RETRY_OF, t.number)), []).append(t)

    def before(first: int) -> int:
        return -1 if interval is None else max(-1, first - interval)

    out: dict[int, int] = {}
    for attempts in by_origin.values():
        attempts.sort(key=lambda t: (int(t.user_attrs.get(names.ATTEMPT, 0)), t.number))
        copied = [int(t.user_attrs[names.EXPLOIT_STEP]) for t in attempts
                  if names.EXPLOIT_STEP in t.user_attrs]
        reached: int | None = copied[0] if copied else None
        for t in attempts:
            steps = t.intermediate_values
            own = [s for s in steps if reached is None or s > reached]
            resumed_at = t.user_attrs.get(names.RESUMED_AT)
            if isinstance(resumed_at, int) and steps:  # started over: steps again, then its own
                out[t.number] = max(0, max(steps) - before(resumed_at))
            elif not own:
                out[t.number] = 0
            else:
                out[t.number] = max(own) - (before(min(own)) if reached is None else reached)
            if steps:
                reached = max(steps) if reached is None else max(reached, max(steps))
    return out


def of_study(trials: Iterable[FrozenTrial], max_steps: int | None,
             now: datetime | None = None) -> Savings | None:
    """`savings` with each attempt's `device_hours` until `now` (default: now)."""
    trials, now = list(trials), now or datetime.now()
    return savings(trials, {t.number: device_hours(t, now) for t in trials}, max_steps)


def savings(trials: Iterable[FrozenTrial], hours: Mapping[int, float],
            max_steps: int | None) -> Savings | None:
    """The study's `Savings`: `hours`, the device-hours each attempt spent, by trial number
    (`device_hours`, or a benchmark's own clock); `max_steps`, the scheduler's (None: the
    steps trained by the longest lineage that completed). None before a step is trained, or
    without a `max_steps` to train to."""
    trials = list(trials)
    trained = steps_trained(trials)
    steps = sum(trained.values())
    if max_steps is None:
        lines: dict[int, int] = {}
        for t in trials:
            origin = int(t.user_attrs.get(names.RETRY_OF, t.number))
            lines[origin] = lines.get(origin, 0) + trained[t.number]
        ends = [lines[int(t.user_attrs.get(names.RETRY_OF, t.number))] for t in trials
                if t.state is TrialState.COMPLETE]
        max_steps = max(ends, default=0) or None
    if not steps or max_steps is None:
        return None
    ran = {int(t.user_attrs.get(names.RETRY_OF, t.number)) for t in trials
           if t.datetime_start is not None}
    pauses = sum(names.PAUSED_AT in t.user_attrs for t in trials)
    stops = sum(t.state is TrialState.PRUNED for t in trials)
    return Savings(sum(hours.get(t.number, 0.0) for t in trials), steps, len(ran), max_steps,
                   pauses, stops)
