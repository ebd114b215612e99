"""A lineage's history: what the study stores of a lineage, as a scheduler reads it (for each
lineage, by its first attempt's number: its params, its curve over all its attempts, and where
it stands: running, queued, paused, done), read from the trials' states and user attributes
(pure: trials in, histories out). Read only: a lineage's attempts and their folder are
`sweep.trial.lineage`'s, the lock on that folder `sweep.trial.lineage_lock`'s.

A scheduler's decisions are recorded in the attempts' user attributes (their names and what
each holds: `sweep._core.names.SCHEDULER_RECORDS`), so every driver of the study reads the
same lineages.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweep._core import (
    ATTEMPT,
    BRACKET,
    CALLED_OFF,
    EXPLOIT_OF,
    EXPLOIT_STEP,
    FIXED_PARAMS,
    PASSED_RUNG,
    PAUSED_AT,
    REPLACES,
    RETRY_OF,
    RUNG,
)
from sweep.trial import lineage


class Standing(enum.Enum):
    """Where a lineage stands, by its latest attempt."""

    RUNNING = "running"  # its latest attempt runs
    QUEUED = "queued"  # its latest attempt waits to be asked
    PAUSED = "paused"  # stopped at a rung (PAUSED_AT), not carried on yet
    DONE = "done"  # finished, failed for good, or replaced: it never continues


@dataclass(frozen=True)
class History:
    """One lineage's history: `origin` (its first attempt's number), the searched params it runs,
    `curve` (each step's value, from the latest attempt that reported it), its `standing`,
    and its latest attempt (to queue its continuation from)."""

    origin: int
    params: Mapping[str, Any]
    curve: Mapping[int, float]
    standing: Standing
    latest: FrozenTrial
    bracket: int = 0
    exploit_of: int | None = None
    replaced: bool = False  # a PBT lineage took its place
    first: Mapping[str, Any] = field(default_factory=dict)  # its first attempt's user attrs
    # a PBT exploit: the step of its donor's state copied into its folder (`EXPLOIT_STEP`, set
    # by the attempt that made the copy, the first or, if that one was cut before, a later one)
    exploit_step: int | None = None
    called_off: bool = False  # a PBT exploit called off (`CALLED_OFF` on an attempt of it)
    # the rung (`RUNG`) of its latest attempt paused at one, while no attempt after it has
    # reported a step past that attempt's last (an attempt that resumes starts with the curve
    # carried): the steps its trainer reported while it stopped count at no higher rung
    rung_cap: int | None = None
    # the highest rung it was judged at: one an attempt went on from (`PASSED_RUNG`), or was
    # paused at and told so (`RUNG` on a PRUNED attempt); a pause decided but never told (its
    # driver killed first) is no judgement. None: it was judged at none
    judged: int | None = None

    @property
    def last_step(self) -> int | None:
        return max(self.curve) if self.curve else None

    def value_at(self, step: int) -> float | None:
        """The value at the first reported step at or after `step` (None: not reached)."""
        later = [s for s in self.curve if s >= step]
        return self.curve[min(later)] if later else None

    @property
    def awaits_copy(self) -> bool:
        """A PBT exploit whose donor's state is not copied yet (no attempt set `EXPLOIT_STEP`:
        it is set as the copy is made) and whose latest attempt is queued or starting: its
        first, or the continuation of a first cut before its copy (a signal while it waited,
        a dead driver). A first attempt queued by an earlier sweep, which set it then, is
        waiting all the same."""
        if self.exploit_of is None:
            return False
        if self.latest.state is TrialState.WAITING and self.latest.number == self.origin:
            return True
        return (self.latest.state in (TrialState.WAITING, TrialState.RUNNING)
                and self.exploit_step is None)

    @property
    def last_value(self) -> float | None:
        last = self.last_step
        return None if last is None else self.curve[last]


def _status(t: FrozenTrial) -> Standing:
    if t.state is TrialState.RUNNING:
        return Standing.RUNNING
    if t.state is TrialState.WAITING:
        return Standing.QUEUED
    if PAUSED_AT in t.user_attrs and t.state is TrialState.PRUNED:
        return Standing.PAUSED
    return Standing.DONE


def _rung_cap(attempts: Iterable[FrozenTrial]) -> int | None:
    """`History.rung_cap` of a lineage's `attempts`, in order."""
    cap, last = None, -1
    for t in attempts:
        if t.state is TrialState.PRUNED and PAUSED_AT in t.user_attrs and RUNG in t.user_attrs:
            cap, last = int(t.user_attrs[RUNG]), max(t.intermediate_values, default=-1)
        elif max(t.intermediate_values, default=-1) > last:
            cap = None
    return cap


def _judged(attempts: Iterable[FrozenTrial]) -> int | None:
    """`History.judged` of a lineage's `attempts`."""
    rungs = [int(t.user_attrs[PASSED_RUNG]) for t in attempts if PASSED_RUNG in t.user_attrs]
    rungs += [int(t.user_attrs[RUNG]) for t in attempts
              if t.state is TrialState.PRUNED and PAUSED_AT in t.user_attrs
              and RUNG in t.user_attrs]
    return max(rungs, default=None)


def read(trials: Iterable[FrozenTrial]) -> dict[int, History]:
    """The history of each lineage of `trials` (every trial of a study), by origin."""
    by_origin: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        origin = int(t.user_attrs.get(RETRY_OF, t.number))
        by_origin.setdefault(origin, []).append(t)
    replaced = {int(t.user_attrs[REPLACES]) for ts in by_origin.values() for t in ts
                if REPLACES in t.user_attrs
                and not any(a.user_attrs.get(CALLED_OFF) for a in ts)}  # any attempt of it
    out: dict[int, History] = {}
    for origin, attempts in by_origin.items():
        attempts.sort(key=lambda t: (int(t.user_attrs.get(ATTEMPT, 0)), t.number))
        first, latest = attempts[0], attempts[-1]
        curve = lineage.merged_curve(
            [(int(t.user_attrs.get(ATTEMPT, 0)), t.intermediate_values)
             for t in attempts])
        params = {**first.system_attrs.get(FIXED_PARAMS, {}), **first.params}
        standing = Standing.DONE if origin in replaced else _status(latest)
        if standing is Standing.DONE and latest.state is TrialState.RUNNING:
            standing = Standing.RUNNING  # replaced, still winding down
        exploit = first.user_attrs.get(EXPLOIT_OF)
        copied = [t.user_attrs[EXPLOIT_STEP] for t in attempts
                  if EXPLOIT_STEP in t.user_attrs and t.state is not TrialState.WAITING]
        out[origin] = History(
            origin, params, curve, standing, latest, int(first.user_attrs.get(BRACKET, 0)),
            None if exploit is None else int(exploit), origin in replaced,
            dict(first.user_attrs), int(copied[0]) if copied and exploit is not None else None,
            any(t.user_attrs.get(CALLED_OFF) for t in attempts), _rung_cap(attempts),
            _judged(attempts))
    return out
