"""What a scheduler's study may start, counted in configurations, not attempts (pure): its
jobs now, its configurations, why a run ends short of n_trials, and when n_trials is small
for its rungs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from sweep.schedulers import _disk, history
from sweep.schedulers.halving import Halving, Promote
from sweep.schedulers.history import History
from sweep.schedulers.pbt import Pbt
from sweep.spec import PbtScheduler, Scheduler, Spec


def decisions(spec: Spec) -> Halving | Pbt:
    """The decisions of `spec.study.scheduler` (which it must have)."""
    assert spec.study.scheduler is not None
    return decisions_of(spec.study.scheduler, spec.study.objective_directions[0] == "minimize")


def decisions_of(spec: Scheduler, minimize: bool) -> Halving | Pbt:
    """The decisions of `study.scheduler` `spec`, ranking by one objective (`minimize`)."""
    if isinstance(spec, PbtScheduler):
        return Pbt(spec, minimize)
    return Halving.of(spec, minimize)


def jobs(decide: Halving | Pbt, n_trials: int, trials: Sequence[FrozenTrial],
         output_dir: Path | None = None) -> int:
    """How many jobs a scheduler's study (`trials`, all of them) may start now: every queued
    attempt (a continuation after an interruption or a dead driver, a promotion, an exploit:
    a lineage carried on is no new configuration, so it runs whatever the budget), every
    promotable lineage, and new configurations while `n_trials` (configurations, not
    attempts) allows (PBT: up to its population; its exploits are queued within n_trials)."""
    lines = history.read(trials)
    queued = sum(1 for t in trials if t.state is TrialState.WAITING)
    if isinstance(decide, Pbt):  # and its lineages paused that may go on
        return (queued + len(continuable(decide, lines, output_dir))
                + unstarted(decide, n_trials, lines))
    new = max(0, n_trials - len(lines))
    return queued + len(promotable(decide, lines, new == 0, output_dir)) + new


def unstarted(decide: Pbt, n_trials: int, lines: Mapping[int, History]) -> int:
    """How many of a PBT population's first configurations have not started yet (up to
    `n_trials`; its exploits are configurations too, but none of the population)."""
    first = sum(1 for v in lines.values() if v.exploit_of is None)
    return max(0, min(n_trials, decide.spec.population) - first)


def continuable(decide: Pbt, lines: Mapping[int, History],
                output_dir: Path | None) -> list[int]:
    """`Pbt.continuable`, less the lineages whose checkpoint folder in `output_dir` was
    removed (paused under another scheduler whose rungs it could never pass again)."""
    return [o for o in decide.continuable(lines)
            if output_dir is None or not _disk.removed(output_dir, o)]


def promotable(decide: Halving, lines: Mapping[int, History], closed: bool,
               output_dir: Path | None) -> list[Promote]:
    """`Halving.promotable` (`closed`: no configuration can come), less the lineages whose
    checkpoint folder in `output_dir` was removed: they were judged never to continue, and a
    later run of more configurations keeps to that."""
    return [j for j in decide.promotable(lines, closed=closed)
            if output_dir is None or not _disk.removed(output_dir, j.origin)]


def short_of(decide: Halving | Pbt, n_trials: int, trials: Sequence[FrozenTrial]) -> str | None:
    """Why a scheduler's study (`trials`, all of them) that has nothing left to run (no job,
    none running) has fewer configurations than `n_trials`; None if it has them all. Only
    PBT can: it starts its population, then adds a configuration by each exploit of a
    lineage still training."""
    made = configurations(trials)
    if made >= n_trials or not isinstance(decide, Pbt):
        return None
    return (f"pbt starts its population ({decide.spec.population}, all started) and adds a "
            "configuration only by an exploit while lineages train, and none trains now: "
            "raise study.scheduler.population to start more, or start a new study")


def too_few(decide: Halving | Pbt, n_trials: int) -> str | None:
    """The warning of an asha study whose `n_trials` is below rf**k (k rungs): a lineage
    passes a rung only in the top 1/rf of it, so fewer configurations may train none to
    max_steps. None otherwise (Hyperband's last bracket has no rung; pbt has none)."""
    if not isinstance(decide, Halving) or decide.brackets > 1 or not decide.rungs:
        return None
    rf, k = decide.reduction_factor, len(decide.rungs)
    needed = rf ** k
    if n_trials >= needed:
        return None
    return (f"study.n_trials ({n_trials}) is below {needed} (reduction_factor {rf} to the "
            f"power of the {k} rungs): asha may train no trial to max_steps, as a lineage "
            f"goes past a rung only in the top 1/{rf} of it; raise n_trials to {needed}, or "
            "have fewer rungs (a larger min_steps or reduction_factor)")


def configurations(trials: Sequence[FrozenTrial]) -> int:
    """The study's configurations (lineages): what `n_trials` counts under a scheduler."""
    return len(history.read(trials))
