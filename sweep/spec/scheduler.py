"""`study.scheduler`: schedulers that pause and promote trials through their lineages
(successive halving with promotion, Hyperband, population-based training), and their checks.

A study uses `study.scheduler` or `study.pruner`, not both: a pruner only stops, a scheduler
pauses a trial at a rung and may bring it back later from its checkpoint folder. What the
schedulers decide is in `sweep.schedulers.halving`; this module only says what a study file
may ask for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sweep._core import Problem, short
from sweep.spec.searchspace import (
    BoolParam,
    CategoricalParam,
    PrunerSpec,
    Searched,
    Section,
)


class _Disk(Section):
    """What a scheduler keeps of the checkpoint folders of lineages that can never continue
    (below the cut of a full rung, replaced in PBT, finished): `keep_checkpoints` the folders
    of that many of the best lineages trained to the end (`all`: every folder), and
    `max_checkpoint_gb`, a bound on `<output_dir>/checkpoints/` past which the kept folders go
    too, worst first, but for the best one (see `sweep.schedulers._retention`)."""

    keep_checkpoints: Annotated[int, Field(ge=0)] | Literal["all"] = 1
    max_checkpoint_gb: Annotated[float, Field(gt=0)] | None = None

    @field_validator("keep_checkpoints", mode="before")
    @classmethod
    def _count_or_all(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "all":
            raise ValueError(f"how many of the best finished lineages keep their checkpoint "
                             f"folders (e.g. 1, or 0), or all; not {short(repr(value), 40)}")
        return value


class _Halving(_Disk):
    """Rungs at `min_steps * reduction_factor**k` below `max_steps`, and `max_steps`."""

    min_steps: Annotated[int, Field(gt=0)]
    max_steps: Annotated[int, Field(gt=0)]
    reduction_factor: Annotated[int, Field(ge=2)] = 3

    @model_validator(mode="after")
    def _steps(self) -> _Halving:
        if self.min_steps >= self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) must be below max_steps "
                             f"({self.max_steps})")
        return self


class AshaScheduler(_Halving):
    """Asynchronous successive halving with promotion (Li et al., MLSys 2020)."""

    type: Literal["asha"]


class HyperbandScheduler(_Halving):
    """Brackets of `asha`, each with its own first rung: min_steps * reduction_factor**b."""

    type: Literal["hyperband"]


class PbtScheduler(_Disk):
    """Population-based training: `population` lineages trained to `max_steps`; every
    `interval` steps one in the bottom `quantile` is replaced by a copy of one in the top
    `quantile` (its checkpoint folder), with each param redrawn from its range with
    `resample_probability`, else a number scaled by one of `perturb` (kept in range)."""

    type: Literal["pbt"]
    population: Annotated[int, Field(ge=2)]
    interval: Annotated[int, Field(gt=0)]
    max_steps: Annotated[int, Field(gt=0)]
    quantile: Annotated[float, Field(gt=0, le=0.5)] = 0.25
    perturb: Annotated[tuple[Annotated[float, Field(gt=0)], ...], Field(min_length=1)] = (
        0.8, 1.2)
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25
    seed: int | None = None

    @model_validator(mode="after")
    def _steps(self) -> PbtScheduler:
        if self.interval >= self.max_steps:
            raise ValueError(f"interval ({self.interval}) must be below max_steps "
                             f"({self.max_steps}): no lineage would ever be replaced")
        return self


SchedulerSpec = Annotated[AshaScheduler | HyperbandScheduler | PbtScheduler,
                          Field(discriminator="type")]
Scheduler = AshaScheduler | HyperbandScheduler | PbtScheduler


def problems(file: str, scheduler: Scheduler | None, pruner: PrunerSpec,
             multi_objective: bool, n_trials: int,
             searched: Mapping[str, Searched]) -> list[Problem]:
    """What is wrong with `study.scheduler` beside the rest of the study file."""
    if scheduler is None:
        return []
    out: list[Problem] = []
    if pruner.type != "none":
        out.append(Problem(file, "study.scheduler", "a study uses study.scheduler or "
                           "study.pruner, not both: remove study.pruner (a scheduler pauses "
                           "the trials a pruner would stop, and can bring them back)"))
    if multi_objective:
        out.append(Problem(file, "study.scheduler", "schedulers rank trials by one objective: "
                           "use direction and metric, not directions and metrics"))
    if isinstance(scheduler, PbtScheduler):
        if n_trials < scheduler.population:
            out.append(Problem(file, "study.n_trials", f"{n_trials} is below the pbt "
                               f"population ({scheduler.population}): n_trials counts the "
                               "population's first configurations and every exploit"))
        if not any(not isinstance(p, (CategoricalParam, BoolParam))
                   for p in searched.values()) and scheduler.resample_probability == 0:
            out.append(Problem(file, "study.scheduler.resample_probability", "with no "
                               "numeric param searched and a resample_probability of 0, an "
                               "exploit would copy its donor unchanged"))
    return out
