"""Successive halving, with no side effects (asha, and hyperband in brackets): whether a
trial that just reported goes on or pauses at a rung, which paused lineage a free device
continues (a promotion before a new configuration), and a Hyperband lineage's bracket.

Everything is decided from the study's lineages (`history.read`) and the step a trial
reached, so every driver of a study decides the same, and it is tested in microseconds.
Successive halving follows Li et al., "A System for Massively Parallel Hyperparameter Tuning"
(MLSys 2020): rungs at min_steps * rf**k below max_steps; a trial reaching a rung outside the
top 1/rf of it is paused; `get_job` looks for a promotable lineage from the top rung down
before it starts a new configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from optuna.trial import TrialState

from sweep.schedulers.exploit_copy import has_steps_left
from sweep.schedulers.history import History, Standing
from sweep.spec import AshaScheduler, HyperbandScheduler


@dataclass(frozen=True)
class GoOn:
    """The trial goes on; `rung`: the rung (an index into `Halving.rungs`) it was judged at
    and is in the top of (or has no value at), None: it passed none."""

    rung: int | None = None


@dataclass(frozen=True)
class Pause:
    """Pause the trial: it reached rung `rung` (an index into `Halving.rungs`) at `step`,
    outside the top of it."""

    rung: int
    step: int


@dataclass(frozen=True)
class Promote:
    """A free device continues the paused lineage `origin`, now in the top of the rung it
    reached (`rung`, an index into `Halving.rungs`)."""

    origin: int
    rung: int


@dataclass(frozen=True)
class NewConfiguration:
    """A free device starts a new configuration (in Hyperband bracket `bracket`)."""

    bracket: int = 0


def rungs(min_steps: int, max_steps: int, reduction_factor: int) -> tuple[int, ...]:
    """The steps where successive halving decides: min_steps * rf**k, while below max_steps
    (max_steps itself is the end, not a rung)."""
    out, r = [], min_steps
    while r < max_steps:
        out.append(r)
        r *= reduction_factor
    return tuple(out)


def top(values: Mapping[int, float], fraction: float, minimize: bool) -> list[int]:
    """The origins in the top floor(n * fraction) of `values` (origin -> value), best first;
    ties go to the lower origin (the earlier lineage)."""
    ranked = sorted(values, key=lambda o: (values[o] if minimize else -values[o], o))
    return ranked[:math.floor(len(values) * fraction + 1e-9)]


def failed(line: History) -> bool:
    """Whether a lineage failed for good (its latest attempt FAIL, nothing queued)."""
    return line.standing is Standing.DONE and line.latest.state is TrialState.FAIL


@dataclass(frozen=True)
class Halving:
    """Successive halving with promotion, in brackets (one for asha). Bracket b's rungs are
    the rungs from min_steps * rf**b on; a lineage is compared with its own bracket's only."""

    rungs: tuple[int, ...]
    reduction_factor: int
    minimize: bool
    brackets: int = 1
    max_steps: int | None = None  # a lineage that reached it is never paused (None: no end)

    @classmethod
    def of(cls, spec: AshaScheduler | HyperbandScheduler, minimize: bool) -> Halving:
        r = rungs(spec.min_steps, spec.max_steps, spec.reduction_factor)
        n = len(r) + 1 if isinstance(spec, HyperbandScheduler) else 1
        return cls(r, spec.reduction_factor, minimize, n, spec.max_steps)

    def rungs_of(self, bracket: int) -> tuple[int, ...]:
        return self.rungs[bracket:]

    def reach(self, line: History) -> int | None:
        """The step a lineage stands at for its rungs: its last reported one, but for one
        paused at a rung (`rung_cap`: paused, or promoted and not reported since), at most
        that rung's step: what its trainer did while it stopped counts at no higher rung (it
        was judged there; it gets there by promotion, and is judged at the rungs it passes
        once it reports again)."""
        last, rung = line.last_step, line.rung_cap
        if last is None or rung is None or not 0 <= rung < len(self.rungs):
            return last
        return min(last, self.rungs[rung])

    def rung_values(self, lineages: Mapping[int, History], bracket: int,
                    k: int) -> dict[int, float]:
        """The values at rung `k` of `bracket` of the bracket's lineages that reached it
        (`reach`): each one's at the first step it reported at or after the rung's."""
        step = self.rungs_of(bracket)[k]
        out = {}
        for o, line in lineages.items():
            reach = self.reach(line)
            if line.bracket == bracket and reach is not None and reach >= step:
                value = line.value_at(step)
                if value is not None and value == value:
                    out[o] = value
        return out

    def rung_top(self, lineages: Mapping[int, History], bracket: int, k: int,
                 closed: bool = False) -> list[int]:
        """The lineages at the top of rung `k` of `bracket`, best first: floor(n/rf) places
        of the n that reached it, taken by the best of those that may still continue (one
        that failed for good keeps none: it can never be promoted), or, `closed` and the
        rung `final` with no place, its best one."""
        values = self.rung_values(lineages, bracket, k)
        able = {o: v for o, v in values.items() if not failed(lineages[o])}
        places = math.floor(len(values) / self.reduction_factor + 1e-9)
        chosen = top(able, 1.0, self.minimize)[:places]
        if not chosen and closed and self.final(lineages, bracket, k):
            chosen = top(able, 1.0, self.minimize)[:1]
        return chosen

    def on_report(self, lineages: Mapping[int, History], origin: int, before: int | None,
                  step: int) -> GoOn | Pause:
        """Lineage `origin` has reported up to `step` (`before`: the last step it had
        reported, or, continued, the step it stood at for its rungs; None: none): at the
        highest rung it has just passed, it goes on if it is in the top of that rung
        (`rung_top`, counting itself: it has reached `step`), else it pauses. One with no
        step left below `max_steps` (`has_steps_left`: its reports came in one batch past the
        rung) has trained to the end: it is never paused, it runs to its result."""
        lineages = {**lineages, origin: replace(lineages[origin], rung_cap=None)}
        own = self.rungs_of(lineages[origin].bracket)
        passed = [k for k, r in enumerate(own) if (before is None or before < r) and r <= step]
        if not passed:
            return GoOn()
        k = passed[-1]
        bracket = lineages[origin].bracket
        if (origin not in self.rung_values(lineages, bracket, k)
                or origin in self.rung_top(lineages, bracket, k)
                or (self.max_steps is not None and not has_steps_left(step, self.max_steps))):
            return GoOn(bracket + k)
        return Pause(bracket + k, step)

    def before_continuing(self, lineages: Mapping[int, History], origin: int) -> GoOn | Pause:
        """Lineage `origin`, about to be continued: judged (`on_report`) at the highest rung
        it reached (`reach`) above the highest it was judged at (`History.judged`), as its
        reports would have been had its last attempt not been stopped first (a driver killed
        after it decided a pause, before it told it; a signal between a rung's report and its
        check). GoOn() if it reached no rung it was not judged at."""
        line = lineages[origin]
        reach = self.reach(line)
        if reach is None:
            return GoOn()
        judged = line.judged
        before = self.rungs[judged] if judged is not None and 0 <= judged < len(
            self.rungs) else None
        return self.on_report(lineages, origin, before, reach)

    def rung_of(self, line: History) -> int | None:
        """The index in its bracket's rungs of the highest rung a lineage has reached
        (`reach`)."""
        last = self.reach(line)
        own = self.rungs_of(line.bracket)
        reached = [k for k, r in enumerate(own) if last is not None and last >= r]
        return reached[-1] if reached else None

    def promotable(self, lineages: Mapping[int, History],
                   closed: bool = False) -> list[Promote]:
        """The paused lineages now in the top of the rung they reached (`rung_top`), from
        the top rung down, and best first within a rung (Li et al.'s get_job order).

        `closed`: no new configuration will start (n_trials reached). Li et al.'s ASHA has no
        end, so a rung that holds fewer than rf lineages promotes none; in a finite study such
        a rung, once it can no longer grow (`final`), would leave its best lineage paused for
        good and the run would end with no configuration trained to max_steps. A final rung
        promotes its best max(1, floor(n/rf)), as successive halving keeps at least one."""
        found: list[tuple[int, float, int, Promote]] = []
        for o, line in lineages.items():
            if line.standing is not Standing.PAUSED:
                continue
            k = self.rung_of(line)
            if k is None:
                continue
            own = self.rungs_of(line.bracket)
            values = self.rung_values(lineages, line.bracket, k)
            if o in self.rung_top(lineages, line.bracket, k, closed):
                value = values[o] if self.minimize else -values[o]
                found.append((-own[k], value, o, Promote(o, line.bracket + k)))
        return [p for *_, p in sorted(found, key=lambda f: f[:3])]

    def final(self, lineages: Mapping[int, History], bracket: int, k: int) -> bool:
        """With no new configuration to come: whether rung `k` of `bracket` can no longer
        grow, i.e. no lineage of the bracket runs or waits below it, and none paused at a
        lower rung is in the top of that rung (so none will be promoted into it)."""
        own = self.rungs_of(bracket)
        members = [v for v in lineages.values() if v.bracket == bracket]
        if any(v.standing in (Standing.RUNNING, Standing.QUEUED)
               and ((reach := self.reach(v)) is None or reach < own[k]) for v in members):
            return False
        return not any(lineages[o].standing is Standing.PAUSED and self.rung_of(lineages[o]) == j
                       for j in range(k) for o in self.rung_top(lineages, bracket, j, True))

    def bracket_for(self, lineages: Mapping[int, History]) -> int:
        """The bracket of a new configuration: the one furthest below its Hyperband share
        (bracket b starts ceil((s+1)/(s-b+1) * rf**(s-b)) configurations per round, s the
        number of rungs), the most aggressive first on a tie."""
        if self.brackets == 1:
            return 0
        s = self.brackets - 1
        share = [math.ceil((s + 1) / (s - b + 1) * self.reduction_factor ** (s - b))
                 for b in range(self.brackets)]
        counts = [0] * self.brackets
        for line in lineages.values():
            if 0 <= line.bracket < self.brackets:
                counts[line.bracket] += 1
        return min(range(self.brackets), key=lambda b: ((counts[b] + 1) / share[b], b))
