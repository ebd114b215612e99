"""Population-based training's exploit, with no side effects: whether a lineage that just
reported is replaced (in the bottom quantile of the population at an `interval` boundary) by an
exploit of one in the top quantile, with the donor's params explored (`explore.explore`), and
which donors paused for an exploit's copy may continue. Decided from the study's lineages
(`history.read`), with a seed, so that every driver of a study decides the same (Jaderberg et
al., "Population Based Training of Neural Networks", 2017).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep.schedulers._explore import explore
from sweep.schedulers.exploit_copy import has_steps_left
from sweep.schedulers.halving import GoOn, top
from sweep.schedulers.history import History, Standing
from sweep.spec import PbtScheduler, Searched


@dataclass(frozen=True)
class Replace:
    """PBT: the trial is in the bottom quantile at `step`: a new lineage takes its place,
    copied from `donor`'s checkpoint folder, with `params` (the donor's, perturbed)."""

    donor: int
    step: int
    params: dict[str, Any]


@dataclass(frozen=True)
class Pbt:
    """Population-based training (`PbtScheduler`): exploit and explore at every `interval`
    steps. `seed` makes a decision the same in every driver that takes it."""

    spec: PbtScheduler
    minimize: bool

    def on_report(self, lineages: Mapping[int, History], origin: int, before: int | None,
                  step: int, searched: Mapping[str, Searched], room: bool) -> GoOn | Replace:
        """Lineage `origin` reported up to `step`: if it has just passed a multiple of
        `interval` (below max_steps), is in the bottom quantile of the live lineages' latest
        values, and `room` (n_trials allows another configuration), it is replaced by an
        exploit of a lineage in the top quantile."""
        every = self.spec.interval
        passed = (before is None or before // every < step // every) and step // every > 0
        if not room or not passed or step >= self.spec.max_steps:
            return GoOn()
        live = {o: line.last_value for o, line in lineages.items()
                if line.standing in (Standing.RUNNING, Standing.QUEUED, Standing.PAUSED)
                and not line.replaced
                and line.last_value is not None and line.last_value == line.last_value}
        if origin not in live or len(live) < 2:
            return GoOn()
        values = {o: float(v) for o, v in live.items() if v is not None}
        n = len(values)
        cut = max(1, math.floor(n * self.spec.quantile + 1e-9))
        best = top(values, 1.0, self.minimize)
        if origin not in best[n - cut:] or origin in best[:cut]:
            return GoOn()
        donors = [o for o in best[:cut] if _steps_left(lineages[o], self.spec.max_steps)]
        if not donors:  # the top is at its last step: no state with steps left to copy
            return GoOn()
        rng = random.Random(f"{self.spec.seed}-{origin}-{step}")
        donor = rng.choice(donors)
        return Replace(donor, step, explore(dict(lineages[donor].params), searched,
                                            self.spec.perturb,
                                            self.spec.resample_probability, rng))

    def continuable(self, lineages: Mapping[int, History]) -> list[int]:
        """The lineages paused for an exploit's copy (a donor with a plain folder) that no
        exploit waits on any more: they continue, lowest origin first."""
        waited = {line.exploit_of for line in lineages.values() if line.awaits_copy}
        return sorted(o for o, line in lineages.items()
                      if line.standing is Standing.PAUSED and not line.replaced
                      and o not in waited)


def _steps_left(line: History, max_steps: int) -> bool:
    """Whether a lineage's latest state leaves a step to train below `max_steps`."""
    return line.last_step is not None and has_steps_left(line.last_step, max_steps)
