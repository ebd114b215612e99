"""PBT's explore, with no side effects: the donor's params perturbed for its exploit
(`explore`), and whether the exploit runs with them or with its donor's, restored from the
checkpoint it was copied from (an optimizer's state holds its learning rate: Ray Tune #62173),
judged from the values the script logs (`trainer.logged_params`: `restored`).

The script's logged value may follow a schedule (a HF Trainer logs the decayed learning
rate; timm restores its donor's scheduler too), so the exploit's logged value is not compared
with its param but with what its donor logged at the same step: the first `interval` boundary
both noted (else, for an exploit that passed none, its first logged value with the donor's at
the last boundary before it). Run with the perturbed value, the ratio of the two is that of
the params (the perturb factor); run with the donor's, it is about 1. A value nearer the
donor's than the perturbed one in that log-ratio (within half the perturb factor's) is the
donor's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from sweep.spec import BoolParam, CategoricalParam, FloatParam, IntParam, Searched


def boundary(before: int | None, step: int, interval: int) -> int | None:
    """The highest multiple of `interval` a trial passed from `before` (its last step before,
    None: none) to `step`; None if it passed none (step 0 is no boundary)."""
    passed = (before is None or before // interval < step // interval) and step // interval > 0
    return step // interval * interval if passed else None


def at_or_before(notes: Mapping[str, float], at: int) -> float | None:
    """The value noted at the highest boundary up to `at` (`notes`: boundary, as a string in
    the study's JSON, -> value); None if none is."""
    found = [int(b) for b in notes if int(b) <= at]
    return notes[str(max(found))] if found else None


def restored(logged: float, donor_logged: float | None, given: float,
             donor_given: float) -> bool | None:
    """Whether the exploit's script ran with its donor's value: it logged `logged`, its donor
    `donor_logged` at the last boundary before (None: not known, then the donor's param stands
    for it), for params `given` (the exploit's, perturbed) and `donor_given`. None: it cannot be
    told (the param was not changed, or a value is not positive)."""
    reference = donor_given if donor_logged is None else donor_logged
    if min(logged, reference, given, donor_given) <= 0 or given == donor_given:
        return None
    return abs(math.log(logged / reference)) < abs(math.log(given / donor_given)) / 2


def explore(params: dict[str, Any], searched: Mapping[str, Searched],
            factors: Sequence[float], resample: float, rng: random.Random) -> dict[str, Any]:
    """The donor's `params`, explored as Jaderberg et al.'s PBT (and Ray Tune's) does: each
    param redrawn from its range with probability `resample` (a number uniformly, on a log
    scale for a `log` one; a categorical or bool among its choices), else a number scaled by
    one of `factors` and a categorical kept; a number kept in its range (an int rounded, a
    stepped value on its step). Params not searched are kept."""
    out = dict(params)
    for name, dim in searched.items():
        if name not in out:
            continue
        if isinstance(dim, (CategoricalParam, BoolParam)):
            if rng.random() < resample:
                out[name] = rng.choice(list(dim.choices))
            continue
        assert isinstance(dim, (FloatParam, IntParam))
        redraw = resample > 0 and rng.random() < resample  # no draw for none: the same stream
        if redraw and dim.log:
            value = math.exp(rng.uniform(math.log(dim.low), math.log(dim.high)))
        elif redraw and isinstance(dim, IntParam):
            value = rng.randint(dim.low, dim.high)  # each value alike, the ends too
        elif redraw:
            value = rng.uniform(dim.low, dim.high)
        else:
            value = float(out[name]) * rng.choice(list(factors))
        if dim.step is not None and not (isinstance(dim, IntParam) and dim.step == 1):
            value = dim.low + round((value - dim.low) / dim.step) * dim.step
        value = min(max(value, dim.low), dim.high)
        out[name] = round(value) if isinstance(dim, IntParam) else value
    return out
