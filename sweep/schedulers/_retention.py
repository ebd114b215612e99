"""Which lineages' checkpoint folders a scheduler's study removes, with no side effects: those
of lineages that can never continue (finished, replaced in PBT, or paused below the cut of a
full rung), less those `keep_checkpoints` keeps, and more of the kept ones, worst first, while
`<output_dir>/checkpoints/` is over `max_checkpoint_gb`. A lineage that may still continue is
never chosen, whatever the bound.

A rung is full when no other lineage can ever reach it: every configuration of `n_trials` has
started, and each lineage of its bracket has reached the rung or can never continue. Its top
`1/reduction_factor` is then final, and a lineage paused there outside it is never promoted.
A donor's folder stays while a lineage that exploits it has not reported a step (its copy may
not be made yet). So does the folder of a lineage an exploit replaces until the exploit has
copied its donor (`spared`: it goes on if the exploit is called off), unless the study sets
`max_checkpoint_gb` (the copy to come needs the room). Before an exploit's copy, the bytes it
will write (`incoming`) are counted as held: room is made first, so that the copy itself does
not take the folders over the bound while a folder that may go is left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from optuna.trial import TrialState

from sweep._core import REPLACES
from sweep.schedulers.halving import Halving
from sweep.schedulers.history import History, Standing
from sweep.schedulers.pbt import Pbt

GB = 1e9  # max_checkpoint_gb counts in decimal gigabytes


def never_continue(lines: Mapping[int, History], decide: Halving | Pbt,
                   n_trials: int) -> frozenset[int]:
    """The origins of the lineages that can never continue: done (finished, replaced and stopped,
    or a PBT exploit called off before it ran; not one that failed by itself: a device taken out
    runs its failed trials again, and its folder is what a user debugs), or, under successive
    halving, paused below the cut of a full rung; never a donor whose exploit has not reported
    yet, nor a lineage `spared`, nor a lineage promotable now that no configuration can come. A
    lineage whose folder was removed is never promoted after (`Scheduling`), even in a later run
    of more configurations."""
    dead = {o for o, line in lines.items() if line.standing is Standing.DONE
            and (line.latest.state is not TrialState.FAIL or line.called_off)}
    if isinstance(decide, Halving) and len(lines) >= n_trials:
        dead |= _below_full_cuts(lines, decide, dead)
        dead -= {p.origin for p in decide.promotable(lines, closed=True)}
    for line in lines.values():
        if line.exploit_of is not None and line.standing is not Standing.DONE and not line.curve:
            dead.discard(line.exploit_of)
    return frozenset(dead - spared(lines))


def spared(lines: Mapping[int, History]) -> frozenset[int]:
    """The lineages replaced by an exploit that has not copied its donor yet: each goes on
    if its exploit is called off (its folder is removed only under `max_checkpoint_gb`)."""
    return frozenset(int(line.first[REPLACES]) for line in lines.values()
                     if line.awaits_copy and REPLACES in line.first)


def _below_full_cuts(lines: Mapping[int, History], decide: Halving,
                     done: set[int]) -> set[int]:
    """The paused lineages outside the top of a full rung, each bracket's rungs in order (a
    lineage out at one rung never reaches the next, which may then be full)."""
    out = set(done)
    for bracket in range(decide.brackets):
        members = [o for o, line in lines.items() if line.bracket == bracket]
        for k in range(len(decide.rungs_of(bracket))):
            values = decide.rung_values(lines, bracket, k)
            if any(o not in values and o not in out for o in members):
                break  # a lineage may still reach this rung: it is not full
            best = set(decide.rung_top(lines, bracket, k))
            out |= {o for o in values if o not in best
                    and lines[o].standing is Standing.PAUSED
                    and decide.rung_of(lines[o]) == k}
    return out - done


@dataclass(frozen=True)
class Removal:
    """What to remove: `remove` the origins whose folders go, in order; `held` the bytes
    left in the lineages' folders after; `over`: still over the bound (what is left may
    continue, or is the best finished lineage's)."""

    remove: tuple[int, ...]
    held: int
    over: bool


def plan(lines: Mapping[int, History], dead: frozenset[int], sizes: Mapping[int, int],
         keep: int | Literal["all"], bound_gb: float | None, minimize: bool,
         spare: frozenset[int] = frozenset(), incoming: int = 0) -> Removal:
    """The folders to remove, given the lineages that can never continue (`dead`) and the
    bytes in each lineage folder there is (`sizes`, by origin): every dead one but the
    `keep` best finished (COMPLETE; `all`: every dead one kept); then, while over `bound_gb`,
    the kept ones too: the `spare` ones first (by origin: lineages an exploit is replacing,
    whose copy to come needs the room), then those not finished (by origin), then the
    finished from the worst up, never the best. `incoming`: the bytes a copy about to be
    made will add (an exploit's of its donor's state), held already and never removed."""
    finished = sorted(
        (o for o in dead if lines[o].latest.state is TrialState.COMPLETE
         and _finite(lines[o].latest.value)),
        key=lambda o: (float(lines[o].latest.value or 0.0) * (1 if minimize else -1), o))
    there = [o for o in sorted(dead) if o in sizes]
    if keep == "all":
        kept = [o for o in there if o not in finished] + [
            o for o in reversed(finished[1:]) if o in sizes]
        remove: list[int] = []
    else:
        kept = [o for o in reversed(finished[1:keep]) if o in sizes]
        remove = [o for o in there if o not in finished[:keep]]
    held = sum(sizes.values()) + incoming - sum(sizes[o] for o in remove)
    bound = None if bound_gb is None else bound_gb * GB
    # `spared` folders go first while over a bound (a copy may follow), never under it: a
    # called-off exploit gives its lineage back, to go on from its own folder
    kept = [o for o in sorted(spare) if o in sizes and o not in remove] + kept
    for o in kept:
        if bound is None or held <= bound:
            break
        remove.append(o)
        held -= sizes[o]
    return Removal(tuple(remove), held, bound is not None and held > bound)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
