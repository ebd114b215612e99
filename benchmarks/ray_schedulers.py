"""Ray Tune's `ASHAScheduler` on the replayed curves of `schedulers.py` (optional: Ray).

Ray's scheduler object decides, through its public `TrialScheduler` interface
(`on_trial_add`, `on_trial_result`, `on_trial_complete`); only the trials and time are
simulated, as for sweep's methods: `gpus` workers, each step costing what the curves say
(`curves.Instance.walk`, seconds of the same fake clock), a trial stopped at the result Ray
says STOP on, a trial that reaches the last step costs the same second to exit as sweep's fake
trainer, the next configuration started on the freed worker. Ray's ASHA only stops (it cannot
pause: ray issues 32634 and 44256), like Optuna's pruner; with 3 brackets it is Ray's
asynchronous HyperBand ("ray AsyncHyperBand"). The time attribute is the step number the
trainer reports, so its milestones (grace_period * rf**k) are sweep's rungs. Ray's synchronous
`HyperBandScheduler` pauses trials and picks the next through `choose_trial_to_run`, which
reads Ray's `TuneController`: no public stand-in, so it has no row.

Ray's `PopulationBasedTraining` cannot be driven that way: it exploits through Ray's
`TuneController` (pausing trials, scheduling checkpoint saves, its private checkpoint
manager), which has no public stand-in. `pbt` runs it in the real Ray runtime instead (a
`Tuner`, a function trainable computing the same curve, checkpointing its state each step
with `tune.report` and resuming from `tune.get_checkpoint()`), in wall-clock time: Ray's
own asynchrony, so a seed's run is not exactly repeatable, and about a minute per run here.
Device-hours are the steps the trainables ran (one a simulated minute).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import numpy as np
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler
except ImportError:  # Ray is optional: `available()` says why it is skipped
    ASHAScheduler = None

STEP_SECONDS = 2.0  # as schedulers.STEP_SECONDS
EXIT_SECONDS = 1.0  # a trainer that reaches its last step exits a second later (Script.runs)


def available() -> str | None:
    """None when Ray Tune imports, else the line that says why its rows are skipped."""
    if ASHAScheduler is None:
        return ("Ray Tune is not installed (pip install 'ray[tune]'): its ASHAScheduler and "
                "PopulationBasedTraining rows are skipped")
    return None


@dataclass
class _Trial:
    """What Ray's ASHA reads of a trial: its id."""

    trial_id: str


METHODS = {"ray ASHAScheduler": 1, "ray AsyncHyperBand": 3}  # name -> Ray's brackets


def replay(method: str, inst: Any, gpus: int, min_steps: int, reduction_factor: int,
           seed: int, exit_seconds: float) -> list[tuple[float, float]]:
    """Ray's ASHAScheduler (`METHODS[method]` brackets; stop only) on `gpus` simulated
    workers over `inst.configs` (a `curves.Instance`), each step costing what `inst.walk`
    says: (device-seconds spent when it was reported, value) of every value reported."""
    assert ASHAScheduler is not None
    np.random.seed(seed)  # Ray's bracket choice draws from numpy's global generator
    random.seed(seed)
    steps = inst.steps
    sched = ASHAScheduler(time_attr="step", metric="loss", mode="min",
                          max_t=steps[-1] if steps[0] > 0 else len(steps),
                          grace_period=min_steps, reduction_factor=reduction_factor,
                          brackets=METHODS[method])
    configurations = iter(inst.configs)
    ids = itertools.count()
    order = itertools.count()
    events: list[tuple[float, int, int, _Trial, dict[str, Any], Any, float]] = []
    started: dict[str, float] = {}
    ended: list[tuple[float, float]] = []  # (start, end) of each trial that ended
    reported: list[tuple[float, float]] = []  # (time, value)

    def start(now: float) -> None:
        params = next(configurations, None)
        if params is None:
            return
        trial = _Trial(str(next(ids)))
        sched.on_trial_add(None, trial)
        started[trial.trial_id] = now
        seconds, value, state = inst.walk(params, None, 0)
        heapq.heappush(events, (now + seconds, next(order), 0, trial, params, state, value))

    for _ in range(gpus):
        start(0.0)
    while events:
        now, _, i, trial, params, state, value = heapq.heappop(events)
        reported.append((now, value))
        result = {"step": steps[i], "loss": value}
        if i == len(steps) - 1:
            sched.on_trial_complete(None, trial, result)
            end = now + exit_seconds
            ended.append((started.pop(trial.trial_id), end))
            start(end)
            continue
        if sched.on_trial_result(None, trial, result) == TrialScheduler.STOP:
            sched.on_trial_remove(None, trial)
            ended.append((started.pop(trial.trial_id), now))
            start(now)
            continue
        seconds, value, state = inst.walk(params, state, i + 1)
        heapq.heappush(events, (now + seconds, next(order), i + 1, trial, params, state,
                                value))

    def spent(t: float) -> float:
        return sum(max(0.0, min(e, t) - s) for s, e in ended)

    return [(spent(t), v) for t, v in sorted(reported)]


def pbt(curve: Callable[[dict[str, Any], float | None, int], float],
        population: list[dict[str, Any]], space: dict[str, tuple[float, float, bool]],
        steps: int, gpus: int, interval: int, quantile: float, perturb: tuple[float, ...],
        seed: int, folder: Path) -> tuple[float, float]:
    """Ray Tune's PopulationBasedTraining on `population` (its first configurations) with
    `gpus` trials at once, in the real Ray runtime: (the best value a trial reached at its
    last step, device-hours). `space`: name -> (low, high, log) of each searched float."""
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    if not ray.is_initialized():
        here = str(Path(__file__).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [here, str(Path(here).parent), os.environ.get("PYTHONPATH", "")])
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        ray.init(num_cpus=gpus, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    log = folder / "steps.log"

    def trainable(config: dict[str, Any]) -> None:
        step, state = 0, None
        saved = tune.get_checkpoint()
        if saved:
            with saved.as_directory() as d:
                got = json.loads((Path(d) / "state.json").read_text())
                step, state = got["next"], got["state"]
        while step < steps:
            state = curve(config, state, step)
            time.sleep(0.05)  # so trials run side by side, as on devices
            with open(log, "a") as f:
                f.write(f"{step}\n")
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "state.json").write_text(json.dumps({"next": step + 1,
                                                                "state": state}))
                tune.report({"loss": state, "step": step},
                            checkpoint=tune.Checkpoint.from_directory(d))
            step += 1

    mutations = {k: (tune.loguniform(lo, hi) if log_ else tune.uniform(lo, hi))
                 for k, (lo, hi, log_) in space.items()}
    factors = (max(perturb), min(perturb))
    random.seed(seed)
    np.random.seed(seed)
    scheduler = PopulationBasedTraining(
        time_attr="step", perturbation_interval=interval, quantile_fraction=quantile,
        hyperparam_mutations=mutations, perturbation_factors=factors)
    [name] = space  # one searched param: the population is a grid of its values
    tuner = tune.Tuner(
        trainable, param_space={name: tune.grid_search([c[name] for c in population])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler,
                                    max_concurrent_trials=gpus, reuse_actors=True),
        run_config=tune.RunConfig(verbose=0, storage_path=str(folder / "ray"),
                                  name=f"pbt-{seed}"))
    results = tuner.fit()
    finals = [r.metrics["loss"] for r in results
              if r.metrics and r.metrics.get("step") == steps - 1]
    ran = len(log.read_text().splitlines()) if log.exists() else 0
    return (min(finals) if finals else math.nan), ran / 60
