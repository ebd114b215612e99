"""study.scheduler against Optuna's stop-only pruners, in simulated time, through the real code.

Each sweep is a real `Driver` on the fake clock and fake trial processes of
`sweep.testing.fakes` (the layer of tests/runner/test_loop.py): the real policy, store (Optuna, in
memory), pool, scheduler decisions and lineages; only time and the trainers are simulated. A
simulated trainer makes one step a simulated minute, checkpoints its state after each step in
$SWEEP_CHECKPOINT_DIR and resumes from it, so a paused trial continues where it stopped and a
PBT exploit continues from its donor's state with its own params.

Families of learning curves (one param `x` in [0, 1], or `lr`):
- `parallel`: curves that never cross, loss = (x - 0.3)^2 + 1 / (1 + step / 3);
- `crossing`: fast starters end worse: loss = (x - 0.7)^2 + exp(-k(x) * step), with
  k(x) = 0.02 + 0.5 * (1 - x) (x = 0.7 is best at the end, low x is best early);
- `schedule`: a state (the loss) trained with a learning rate `lr` in [1e-3, 1] (log):
  each step moves it a fraction lr of the way to a noise floor of 0.5 * lr; a large rate
  gets down fast to a high floor, a small one slowly to a low one, so a rate that falls
  over time (what PBT can find) beats every fixed rate.

Methods: no pruning; Optuna's SuccessiveHalvingPruner and HyperbandPruner (stop only);
sweep's asha, hyperband (pause and promote) and pbt; where Ray Tune imports, Ray's
ASHAScheduler (stop only) deciding on the same curves and configurations
(`ray_schedulers.py`). The same configurations for each method of a seed; 4 simulated devices;
rungs at min_steps * 3**k for every successive-halving method (min_steps = steps // 27).

Two ways to give the methods a budget:
- `--configs N` (the default, 27): N configurations each (queued with study.enqueue, drawn
  from the seed); each method spends what it spends (the device-hours column).
- `--budget-hours H [H ...]`: equal device-hours. Each method runs on configurations from the
  random sampler (seeded) until well past the largest H; a value counts at budget H only if
  its trial finished by the time H device-hours (all devices together, pauses and stops
  included) had been spent: the best value reached against device-hours spent, read at each H.

Printed: per family and method, over the seeds, the mean and median regret of the best value
reached by a trial trained to the end (against the best fixed configuration of the family:
for `schedule` the best fixed rate, found on a fine grid) and, with --configs, the mean
device-hours spent and saved (against training every configuration to the end, as
`sweep report` counts it: `sweep.study.savings`). Usage:

    python benchmarks/schedulers.py [--seeds 20] [--configs 27] [--steps 27]
    python benchmarks/schedulers.py --budget-hours 1.85 3.7 7.4 [--seeds 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import ray_schedulers
import yaml

from sweep.gpus.pool import Pool, fake_devices
from sweep.protocol import TRIAL_NUMBER_ENV
from sweep.runner.driver import Driver
from sweep.spec import config, searchspace
from sweep.study import savings
from sweep.study.ownership import Owner
from sweep.study.store import Store
from sweep.testing.fakes import FakeClock, FakeSpawn, Script
from sweep.trial.lineage import CHECKPOINT_ENV

STEP_SECONDS = 2.0  # one step on the fake clock (4 report polls), counted as a minute


def parallel(params: dict[str, Any], state: float | None, step: int) -> float:
    return (params["x"] - 0.3) ** 2 + 1.0 / (1.0 + step / 3.0)


def crossing(params: dict[str, Any], state: float | None, step: int) -> float:
    x = params["x"]
    return (x - 0.7) ** 2 + math.exp(-(0.02 + 0.5 * (1.0 - x)) * step)


def schedule(params: dict[str, Any], state: float | None, step: int) -> float:
    lr = params["lr"]
    loss = 1.0 if state is None else state
    floor = 0.5 * lr
    return floor + (loss - floor) * (1.0 - min(0.9, lr))


FAMILIES: dict[str, tuple[Callable[..., float], dict[str, Any]]] = {
    "parallel": (parallel, {"x": {"type": "float", "low": 0.0, "high": 1.0}}),
    "crossing": (crossing, {"x": {"type": "float", "low": 0.0, "high": 1.0}}),
    "schedule": (schedule, {"lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True}}),
}


def fixed_curve(family: str, params: dict[str, Any], steps: int) -> list[float]:
    """A configuration trained from scratch to `steps`, never paused."""
    f, _ = FAMILIES[family]
    out, state = [], None
    for step in range(steps):
        state = f(params, state, step)
        out.append(state)
    return out


def best_fixed(family: str, steps: int) -> float:
    """The best value any fixed configuration reaches at `steps` (a fine grid)."""
    name = "lr" if family == "schedule" else "x"
    grid = [10 ** (-3 + 3 * i / 2000) for i in range(2001)] if name == "lr" else \
        [i / 2000 for i in range(2001)]
    return min(fixed_curve(family, {name: v}, steps)[-1] for v in grid)


class Trainer:
    """A simulated trainer of `steps` steps that checkpoints its state each step."""

    def __init__(self, family: str, steps: int) -> None:
        self.f, _ = FAMILIES[family]
        self.steps = steps
        self.sweep: Any = None

    def __call__(self, params: dict[str, Any]) -> Script:
        s = self.sweep
        folder = Path(s.spawn.plan.env[CHECKPOINT_ENV])
        path = folder / "state.json"
        saved = json.loads(path.read_text()) if path.exists() else {"next": 0, "state": None}
        first, state = saved["next"], saved["state"]
        index, t0 = len(s.spawn.processes), s.clock.t
        reports = []
        for i, step in enumerate(range(first, self.steps)):
            state = self.f(params, state, step)
            when = t0 + (i + 1) * STEP_SECONDS

            def save(step: int = step, state: float = state) -> None:
                if not s.spawn.processes[index].command_exited:
                    path.write_text(json.dumps({"next": step + 1, "state": state}))

            s.clock.at(when - 1e-6, save)
            reports.append(((i + 1) * STEP_SECONDS, step, state))
        final = state if state is not None else math.nan
        return Script(runs=(self.steps - first) * STEP_SECONDS + 1.0, reports=reports,
                      result={"score": final})


class SimulatedSweep:
    """One sweep of `study` (the study section) on the fake clock with `gpus` devices."""

    def __init__(self, folder: Path, family: str, steps: int, gpus: int, seed: int = 0,
                 **study: Any) -> None:
        _, params = FAMILIES[family]
        data = {
            "study": {"name": "bench", "direction": "minimize", "metric": "score",
                      "sampler": {"type": "random", "seed": seed}, "heartbeat_interval": 3600,
                      **study},
            "trainer": {"script": __file__, "launcher": "python", "grace_period": 1.0,  # not run
                        "resume_args": ["--resume"]},
            "params": params,
        }
        path = folder / "study.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        self.spec = config.load(path)
        storage = optuna.storages.InMemoryStorage()
        study_ = optuna.create_study(
            storage=storage, study_name="bench",  # Optuna's HyperbandPruner hashes the name
            sampler=searchspace.build_sampler(self.spec.study.sampler, self.spec.searched),
            pruner=searchspace.build_pruner(self.spec.study.pruner),
            directions=self.spec.study.objective_directions)
        self.store = Store(study_, storage, Owner("bench", 1, 0.0), 3600)
        self.clock = FakeClock(max_waits=10_000_000)
        self.trainer = Trainer(family, steps)
        self.spawn = FakeSpawn(self.clock, self.trainer)
        self.trainer.sweep = self
        pool = Pool(fake_devices(str(gpus)), 1, width=1)
        self.driver = Driver(self.spec, self.store, pool, spawn=self.spawn, clock=self.clock)
        self.driver.events.message = lambda text: None  # type: ignore[method-assign]

    def run(self) -> tuple[float, float, list[tuple[float, float]]]:
        """(the best value reached by a trial that finished its steps, device-hours, and
        each finished trial's (device-hours spent when it finished, value))."""
        self.driver.run()
        values = [t.value for t in self.store.study.get_trials(deepcopy=False)
                  if t.state.name == "COMPLETE" and t.value is not None]
        hours = self.spent(math.inf)
        finished = sorted((p.ended_at, float(p.script.result["score"]))
                          for p in self.spawn.processes
                          if p.exit_code == 0 and p.ended_at is not None and p.script.result)
        return ((min(values) if values else math.nan), hours,
                [(self.spent(t), v) for t, v in finished])

    def saved(self) -> float:
        """Device-hours saved against training every configuration to the end, as `sweep
        report` and the run's closing line count them (`sweep.study.savings`), on the
        simulated clock."""
        hours: dict[int, float] = {}
        for p in self.spawn.processes:
            number = int(p.plan.env[TRIAL_NUMBER_ENV])
            end = p.ended_at if p.ended_at is not None else self.clock.t
            hours[number] = hours.get(number, 0.0) + (end - p.started) / STEP_SECONDS / 60
        sched = self.spec.study.scheduler
        found = savings.savings(self.store.study.get_trials(deepcopy=False), hours,
                                None if sched is None else sched.max_steps)
        return found.saved_device_hours if found is not None else 0.0

    def spent(self, t: float) -> float:
        """Device-hours spent by all the trial processes up to clock time `t`."""
        return sum(max(0.0, min(p.ended_at if p.ended_at is not None else self.clock.t, t)
                            - p.started) for p in self.spawn.processes) / STEP_SECONDS / 60


def methods(configs: int, steps: int) -> dict[str, dict[str, Any]]:
    min_steps, rf = max(1, steps // 27), 3
    return {
        "no pruning": {},
        "optuna successive_halving (stop only)": {"pruner": {
            "type": "successive_halving", "min_resource": min_steps, "reduction_factor": rf}},
        "optuna hyperband (stop only)": {"pruner": {
            "type": "hyperband", "min_resource": min_steps, "max_resource": steps,
            "reduction_factor": rf}},
        "sweep asha (pause + promote)": {"scheduler": {
            "type": "asha", "min_steps": min_steps, "max_steps": steps, "reduction_factor": rf}},
        "sweep hyperband (pause + promote)": {"scheduler": {
            "type": "hyperband", "min_steps": min_steps, "max_steps": steps,
            "reduction_factor": rf}},
        "sweep pbt": {"scheduler": {
            "type": "pbt", "population": 8, "interval": max(1, steps // 9), "max_steps": steps,
            "quantile": 0.25, "perturb": [0.8, 1.25], "seed": 0}},
    }


def pbt_trials(configs: int) -> int:
    """PBT's n_trials: its population of 8 and room for every exploit it may make."""
    return 8 + 4 * configs


def sampled(family: str, seed: int) -> Iterator[dict[str, Any]]:
    """The configurations Optuna's RandomSampler(seed) draws for `family`, in order: those a
    sweep of the family with the random sampler starts as new configurations."""
    _, params = FAMILIES[family]
    dists = {k: optuna.distributions.FloatDistribution(v["low"], v["high"],
                                                       log=v.get("log", False))
             for k, v in params.items()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed))
    while True:
        yield dict(study.ask(dists).params)


def configurations(family: str, seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    if family == "schedule":
        return [{"lr": 10 ** rng.uniform(-3, 0)} for _ in range(n)]
    return [{"x": rng.random()} for _ in range(n)]


def ray_rows(family: str, steps: int, gpus: int, seeds: int, configs: int,
             budgets: list[float] | None) -> list[tuple[str, list[list[float]], list[float]]]:
    """Ray's ASHAScheduler on the family: (name, regrets per budget (one list with
    --configs) over the seeds, device-hours per seed); none without Ray."""
    optimum = best_fixed(family, steps)
    f, _ = FAMILIES[family]
    per = [[] for _ in budgets or [0.0]]
    hours: list[float] = []
    for seed in range(seeds):
        if budgets:
            done = ray_schedulers.asha(f, sampled(family, seed), steps, gpus, max(1, steps // 27),
                                       3, max(budgets), seed)
            for i, b in enumerate(budgets):
                per[i].append(ray_schedulers.best_within(done, b) - optimum)
        else:
            done = ray_schedulers.asha(f, iter(configurations(family, seed, configs)), steps,
                                       gpus, max(1, steps // 27), 3, math.inf, seed)
            per[0].append(min(v for _, v in done) - optimum)
        hours.append(done[-1][0] if done else math.nan)
    return [("ray tune ASHAScheduler (stop only)", per, hours)]


def cell(values: list[float]) -> str:
    """Mean and median of the regrets over the seeds; "none" where a seed has no trial
    trained to the end within the budget (counted in how many)."""
    missing = sum(1 for v in values if v != v)
    if missing:
        return f"none in {missing}/{len(values)} | –"
    return f"{statistics.mean(values):.4f} | {statistics.median(values):.4f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--configs", type=int, default=27)
    p.add_argument("--steps", type=int, default=27)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--methods", nargs="*", default=None,
                   help="only the methods whose name contains one of these words")
    p.add_argument("--ray-pbt", type=int, default=0, metavar="SEEDS",
                   help="also Ray Tune's PopulationBasedTraining on this many seeds, in the real "
                   "Ray runtime (about a minute a seed), with the population of sweep pbt")
    p.add_argument("--budget-hours", type=float, nargs="+", default=None,
                   help="instead of a fixed number of configurations: the best value reached "
                   "by the time each of these many device-hours had been spent "
                   "(configurations from the random sampler, seeded)")
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    budgets = sorted(args.budget_hours) if args.budget_hours else None
    budget = (f"the best value reached by {', '.join(f'{b:g}' for b in budgets)} "
              "device-hours" if budgets else f"{args.configs} configurations (pbt: "
              f"{pbt_trials(args.configs)}, its exploits included)")
    print(f"{args.seeds} seeds, {budget}, {args.steps} steps of a simulated minute, "
          f"{args.gpus} simulated devices; regret against the best fixed configuration")
    skipped = ray_schedulers.available()
    if skipped:
        print(skipped)
    print()
    if budgets:
        heads = " | ".join(f"{b:g} h: mean regret | median" for b in budgets)
        print(f"| family | method | {heads} |")
        print("| --- | --- |" + " ---: | ---: |" * len(budgets))
    else:
        print("| family | method | mean regret | median regret | mean device-hours | "
              "mean device-hours saved |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
    chosen = methods(args.configs, args.steps)
    if args.methods:
        chosen = {k: v for k, v in chosen.items() if any(w in k for w in args.methods)}
    for family in args.families:
        optimum = best_fixed(family, args.steps)
        rows = []
        for name, study in chosen.items():
            per: list[list[float]] = [[] for _ in budgets or [0.0]]
            hours, saved = [], []
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    if budgets:  # all devices busy: well past the largest budget by then
                        timeout = 1.2 * max(budgets) * 60 * STEP_SECONDS / args.gpus
                        sweep = SimulatedSweep(Path(tmp), family, args.steps, args.gpus,
                                               seed, n_trials=10_000, timeout=timeout, **study)
                    else:
                        n = args.configs if "pbt" not in name else pbt_trials(args.configs)
                        sweep = SimulatedSweep(Path(tmp), family, args.steps, args.gpus,
                                               seed, n_trials=n,
                                               enqueue=configurations(family, seed, n), **study)
                    best, spent, done = sweep.run()
                    saved.append(sweep.saved())
                if budgets:
                    for i, b in enumerate(budgets):
                        per[i].append(ray_schedulers.best_within(done, b) - optimum)
                else:
                    per[0].append(best - optimum)
                hours.append(spent)
            rows.append((name, per, hours, f"{statistics.mean(saved):.2f}"))
        if not skipped and (not args.methods or any("ray" in w for w in args.methods)):
            rows += [(*row, "–") for row in ray_rows(family, args.steps, args.gpus, args.seeds,
                                                      args.configs, budgets)]
        for name, per, hours, kept in rows:
            if budgets:
                print(f"| {family} | {name} | " + " | ".join(cell(r) for r in per) + " |")
            else:
                print(f"| {family} | {name} | {cell(per[0])} | {statistics.mean(hours):.2f} | "
                      f"{kept} |")
            sys.stdout.flush()
    if args.ray_pbt and not skipped:
        ray_pbt(args.families, args.steps, args.gpus, args.ray_pbt, args.configs)
    return 0


def ray_pbt(families: list[str], steps: int, gpus: int, seeds: int, configs: int) -> None:
    """Ray Tune's PopulationBasedTraining, real runtime, with sweep pbt's settings and first
    population (the random sampler's, as in --budget-hours)."""
    pbt = methods(configs, steps)["sweep pbt"]["scheduler"]
    print()
    print(f"Ray Tune PopulationBasedTraining in the real Ray runtime, {seeds} seeds "
          f"(population {pbt['population']}, {gpus} at once, interval {pbt['interval']}, "
          f"quantile {pbt['quantile']}, perturb {pbt['perturb']}, Ray's resample "
          "probability 0.25):")
    print()
    print("| family | method | mean regret | median regret | mean device-hours |")
    print("| --- | --- | ---: | ---: | ---: |")
    for family in families:
        f, space = FAMILIES[family]
        bounds = {k: (v["low"], v["high"], bool(v.get("log"))) for k, v in space.items()}
        optimum = best_fixed(family, steps)
        regrets, hours = [], []
        for seed in range(seeds):
            population = list(itertools.islice(sampled(family, seed), pbt["population"]))
            with tempfile.TemporaryDirectory() as tmp:
                best, spent = ray_schedulers.pbt(
                    f, population, bounds, steps, gpus, pbt["interval"], pbt["quantile"],
                    tuple(pbt["perturb"]), seed, Path(tmp))
            regrets.append(best - optimum)
            hours.append(spent)
            print(f"ray pbt, {family}, seed {seed}: regret {best - optimum:.4f}, "
                  f"{spent:.2f} device-hours", file=sys.stderr, flush=True)
        print(f"| {family} | ray tune PopulationBasedTraining | {cell(regrets)} | "
              f"{statistics.mean(hours):.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
