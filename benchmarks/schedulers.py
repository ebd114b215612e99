"""study.scheduler against Optuna's pruners and Ray Tune's, on measured and synthetic learning
curves, in simulated time, through the real code: anytime regret at 8 budgets.

Each sweep is a real `Driver` on the fake clock and fake trial processes of
`sweep.testing.fakes` (the layer of tests/runner/test_loop.py): the real policy, store (Optuna, in
memory), pool, scheduler decisions and lineages; only time and the trainers are simulated. A
simulated trainer replays a configuration's curve (`curves.Instance.walk`: each step's cost
on the fake clock and value), checkpoints its state after each step in $SWEEP_CHECKPOINT_DIR
and resumes from it, so a paused trial continues where it stopped and a PBT exploit continues
from its donor's state with its own params.

Curves (`--curves`, `curves.py` says more):
- `lcdb`: LCDB 1.0's measured learning curves (a configuration a scikit-learn learner, a step
  an anchor, its cost the recorded traintime), one instance per OpenML dataset (`--datasets`;
  default: `curves.default_datasets`, the 30 lowest ids on which all 20 learners reached the
  last anchor);
- `hartmann`: mf-prior-bench's MF-Hartmann 3 (`mfh3_good` ... `mfh3_terrible`: how well low
  fidelities rank);
- `parallel`, `crossing`, `schedule`: three synthetic families (below), the only ones with a
  state a learning-rate schedule changes (what PBT can exploit):
  - `parallel`: curves that never cross, loss = (x - 0.3)^2 + 1 / (1 + step / 3);
  - `crossing`: fast starters end worse: loss = (x - 0.7)^2 + exp(-k(x) * step), with
    k(x) = 0.02 + 0.5 * (1 - x);
  - `schedule`: a loss trained with a rate `lr` in [1e-3, 1] (log): each step moves it a
    fraction lr of the way to a floor of 0.5 * lr, so a falling rate beats every fixed one.

Methods: no pruning; Optuna's SuccessiveHalvingPruner, HyperbandPruner and MedianPruner (stop
only); sweep's asha, hyperband (pause and promote) and pbt; the random sampler's order (the
same configurations for every method of a seed, queued) and, beside it, Optuna's TPE sampler
(5.0's defaults) with no pruning and with the SuccessiveHalvingPruner; where Ray Tune imports,
Ray's ASHAScheduler and its AsyncHyperBand (ASHAScheduler with 3 brackets) deciding on the same
curves (`ray_schedulers.py`). 4 simulated devices; rungs at min_steps * 3**k for every
successive-halving method (min_steps = max_steps // 27).

Anytime regret: the best value *known* after each budget of device time was spent (every value
a trainer reported counts, a paused or stopped lineage's last one included, as a user watching
the study sees them), minus the best value any configuration reaches at its last step, at 8
budgets from one configuration's full cost (1/n of all, n = 20 for LCDB's learners, 27
otherwise) to the cost of training every configuration to the end (geometric). Printed per
curves: the mean with a 95 % bootstrap interval, the median, and the share of (dataset, seed)
where the method's regret is below that of Optuna's stop-only SuccessiveHalvingPruner (ties
count half). `--json FILE` writes every regret as records {"curves", "dataset", "seed",
"method", "budget_fraction", "regret"}. Usage:

    python benchmarks/schedulers.py --curves lcdb --seeds 5 [--datasets 3,6,11] [--jobs 2]
    python benchmarks/schedulers.py --curves parallel,crossing,schedule --seeds 20
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import curves
import optuna
import ray_schedulers
import yaml
from curves import STEP_SECONDS, Instance

from sweep.gpus.pool import Pool, fake_devices
from sweep.protocol import TRIAL_NUMBER_ENV
from sweep.runner.driver import Driver
from sweep.spec import config, searchspace
from sweep.study import savings
from sweep.study.ownership import Owner
from sweep.study.store import Store
from sweep.testing.fakes import FakeClock, FakeSpawn, Script
from sweep.trial.lineage import CHECKPOINT_ENV

EXIT_SECONDS = ray_schedulers.EXIT_SECONDS  # a trainer that reached its last step exits then
BUDGETS = 8
REFERENCE = "optuna successive_halving"  # the stop-only pruner every method is compared with
ALL_CURVES = ("lcdb", "hartmann", "parallel", "crossing", "schedule")


class Trainer:
    """A simulated trainer replaying `instance`'s curves; it checkpoints its state each step."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.sweep: Any = None

    def __call__(self, params: dict[str, Any]) -> Script:
        s, inst = self.sweep, self.instance
        folder = Path(s.spawn.plan.env[CHECKPOINT_ENV])
        path = folder / "state.json"
        saved = json.loads(path.read_text()) if path.exists() else {"next": 0, "state": None}
        first, state = saved["next"], saved["state"]
        index, t0 = len(s.spawn.processes), s.clock.t
        reports, elapsed = [], 0.0
        for i in range(first, len(inst.steps)):
            seconds, value, state = inst.walk(params, state, i)
            elapsed += seconds

            def save(i: int = i, state: Any = state) -> None:
                if not s.spawn.processes[index].command_exited:
                    path.write_text(json.dumps({"next": i + 1, "state": state}))

            s.clock.at(t0 + elapsed - min(1e-6, seconds / 2), save)
            reports.append((elapsed, inst.steps[i], value))
        final = reports[-1][2] if reports else math.nan
        return Script(runs=elapsed + EXIT_SECONDS, reports=reports, result={"score": final})


class SimulatedSweep:
    """One sweep of `instance` with the study section `study` on the fake clock, `gpus`
    devices."""

    def __init__(self, folder: Path, instance: Instance, gpus: int, seed: int = 0,
                 sampler: str = "random", **study: Any) -> None:
        data = {
            "study": {"name": "bench", "direction": "minimize", "metric": "score",
                      "sampler": {"type": sampler, "seed": seed}, "heartbeat_interval": 3600,
                      **study},
            "trainer": {"script": __file__, "launcher": "python", "grace_period": 1.0,  # not run
                        "resume_args": ["--resume"]},
            "params": instance.space,
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
        self.trainer = Trainer(instance)
        self.spawn = FakeSpawn(self.clock, self.trainer)
        self.trainer.sweep = self
        pool = Pool(fake_devices(str(gpus)), 1, width=1)
        self.driver = Driver(self.spec, self.store, pool, spawn=self.spawn, clock=self.clock)
        self.driver.events.message = lambda text: None  # type: ignore[method-assign]

    def known(self) -> list[tuple[float, float]]:
        """Run the sweep: (seconds of device time spent when it was reported, value) of every
        value a trainer reported, in order of time: what a user watching the study knew."""
        self.driver.run()
        events = []
        for p in self.spawn.processes:
            end = p.ended_at if p.ended_at is not None else self.clock.t
            events += [(p.started + when, value) for when, _, value in p.script.reports
                       if p.started + when <= end + 1e-9]
        events.sort()
        return [(self.spent(t), v) for t, v in events]

    def saved(self) -> savings.Savings | None:
        """What the sweep cost and training every configuration to the end would have, as
        `sweep report` and the run's closing line count them (`sweep.study.savings`), each
        attempt's device time on the simulated clock (a step of `STEP_SECONDS` a minute)."""
        hours: dict[int, float] = {}
        for p in self.spawn.processes:
            number = int(p.plan.env[TRIAL_NUMBER_ENV])
            end = p.ended_at if p.ended_at is not None else self.clock.t
            hours[number] = hours.get(number, 0.0) + (end - p.started) / STEP_SECONDS / 60
        sched = self.spec.study.scheduler
        return savings.savings(self.store.study.get_trials(deepcopy=False), hours,
                               None if sched is None else sched.max_steps)

    def spent(self, t: float) -> float:
        """Device-seconds spent by all the trial processes up to clock time `t`."""
        return sum(max(0.0, min(p.ended_at if p.ended_at is not None else self.clock.t, t)
                            - p.started) for p in self.spawn.processes)


def max_steps(inst: Instance) -> int:
    """The scheduler's max_steps: the last step number reported (synthetic: the count of
    0-based steps)."""
    return inst.steps[-1] if inst.steps[0] > 0 else len(inst.steps)


def methods(inst: Instance) -> dict[str, dict[str, Any]]:
    """Each sweep method's study section (`sampler`: "tpe" where not the random order)."""
    top = max_steps(inst)
    low, rf = max(1, top // 27), 3
    sh = {"type": "successive_halving", "min_resource": low, "reduction_factor": rf}
    return {
        "no pruning": {},
        "optuna successive_halving": {"pruner": sh},
        "optuna hyperband": {"pruner": {
            "type": "hyperband", "min_resource": low, "max_resource": top,
            "reduction_factor": rf}},
        "optuna median": {"pruner": {"type": "median", "n_startup_trials": 4,
                                     "n_warmup_steps": low}},
        "sweep asha": {"scheduler": {
            "type": "asha", "min_steps": low, "max_steps": top, "reduction_factor": rf}},
        "sweep hyperband": {"scheduler": {
            "type": "hyperband", "min_steps": low, "max_steps": top, "reduction_factor": rf}},
        "sweep pbt": {"scheduler": {
            "type": "pbt", "population": 8, "interval": max(1, top // 9), "max_steps": top,
            "quantile": 0.25, "perturb": [0.8, 1.25], "seed": 0}},
        "tpe: no pruning": {"sampler": "tpe"},
        "tpe: optuna successive_halving": {"sampler": "tpe", "pruner": sh},
    }


def budgets(inst: Instance) -> list[float]:
    """The budgets, as fractions of training every configuration to the end: from one
    configuration's (1/n) to all, geometric."""
    n = inst.nominal
    return [n ** (-(BUDGETS - 1 - i) / (BUDGETS - 1)) for i in range(BUDGETS)]


def best_within(known: list[tuple[float, float]], limit: float) -> float:
    """The best (lowest) value known once `limit` device-seconds were spent; NaN: none."""
    values = [v for spent, v in known if spent <= limit + 1e-9]
    return min(values) if values else math.nan


# Filled in the parent before the workers fork: LCDB's table (read once).
_TABLE: curves.Table = {}


def instance(kind: str, dataset: str, seed: int) -> Instance:
    if kind == "lcdb":
        return curves.lcdb(_TABLE, dataset, seed, EXIT_SECONDS)
    if kind == "hartmann":
        return curves.hartmann(dataset, seed, EXIT_SECONDS)
    return curves.synthetic(kind, seed, EXIT_SECONDS)


def run_one(task: tuple[str, str, int, str, int]) -> list[dict[str, Any]]:
    """One method on one instance and seed: its records (one per budget), and the sweep's
    own count of what it spent and would have spent (`sweep.study.savings`)."""
    kind, dataset, seed, method, gpus = task
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    inst = instance(kind, dataset, seed)
    fractions = budgets(inst)
    cost_model: dict[str, float] = {}
    if method.startswith("ray "):
        known = ray_schedulers.replay(method, inst, gpus, max(1, max_steps(inst) // 27), 3,
                                      seed, EXIT_SECONDS)
    else:
        study = dict(methods(inst)[method])
        sampler = study.pop("sampler", "random")
        n = len(inst.configs)
        n_trials = 8 + 4 * n if "pbt" in method else n
        with tempfile.TemporaryDirectory() as tmp:
            sweep = SimulatedSweep(
                Path(tmp), inst, gpus, seed, sampler=sampler, n_trials=n_trials,
                enqueue=[] if sampler == "tpe" else inst.configs, **study)
            known = sweep.known()
            found = sweep.saved()
            spent = sweep.spent(math.inf)
        if found is not None:  # in units of the full cost, so that instances average
            unit = STEP_SECONDS * 60 / inst.full_cost
            cost_model = {"spent": spent / inst.full_cost,
                          "model_full": found.full_device_hours * unit}
    return [{"curves": kind, "dataset": dataset, "seed": seed, "method": method,
             "budget_fraction": f, "regret": best_within(known, f * inst.full_cost)
             - inst.optimum, **({"_cost": cost_model} if i == 0 and cost_model else {})}
            for i, f in enumerate(fractions)]


def bootstrap(values: list[float], rounds: int = 2000) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of the mean of `values` (seeded)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = np.asarray(values)
    means = a[rng.integers(0, len(a), size=(rounds, len(a)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def beats(mine: dict[tuple[str, int], float], ref: dict[tuple[str, int], float]) -> float:
    """The share of (dataset, seed) where `mine` is below `ref` (ties half; no value known
    counts as the worst)."""
    def v(x: float) -> float:
        return math.inf if x != x else x
    keys = list(mine)
    won = sum(1.0 if v(mine[k]) < v(ref[k]) else 0.5 if v(mine[k]) == v(ref[k]) else 0.0
              for k in keys)
    return won / len(keys)


def tables(records: list[dict[str, Any]], kind: str) -> str:
    """The anytime tables of `kind`: mean [95 % CI] per budget, then median and the share
    beating Optuna's SuccessiveHalvingPruner."""
    rows = [r for r in records if r["curves"] == kind]
    names = list(dict.fromkeys(r["method"] for r in rows))
    by: dict[str, list[dict[tuple[str, int], float]]] = {}
    fractions: list[list[float]] = [[] for _ in range(BUDGETS)]
    for m in names:
        per = [r for r in rows if r["method"] == m]
        cells: list[dict[tuple[str, int], float]] = [{} for _ in range(BUDGETS)]
        for r in per:
            i = budgets_index(r, per)
            cells[i][(r["dataset"], r["seed"])] = r["regret"]
            fractions[i].append(r["budget_fraction"])
        by[m] = cells
    heads = [f"{statistics.mean(f):.3g}" for f in fractions]
    out = [f"Mean regret [95 % bootstrap interval], {kind}, at each budget (fraction of "
           "training every configuration to the end):", "",
           "| method | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * BUDGETS]
    for m in names:
        cells = []
        for c in by[m]:
            vals = list(c.values())
            missing = sum(1 for x in vals if x != x)
            if missing:
                cells.append(f"none in {missing}/{len(vals)}")
                continue
            lo, hi = bootstrap(vals)
            cells.append(f"{statistics.mean(vals):.4f} [{lo:.4f}, {hi:.4f}]")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", f"Median regret / share of (dataset, seed) below {REFERENCE}'s regret, {kind}:",
            "", "| method | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * BUDGETS]
    ref = by.get(REFERENCE)
    for m in names:
        cells = []
        for i, c in enumerate(by[m]):
            vals = [x for x in c.values() if x == x]
            med = f"{statistics.median(vals):.4f}" if vals else "–"
            share = f"{100 * beats(c, ref[i]):.0f} %" if ref is not None else "–"
            cells.append(f"{med} / {share}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    costs = [(m, [r["_cost"] for r in rows if r["method"] == m and "_cost" in r])
             for m in names]
    costs = [(m, c) for m, c in costs if c]
    if costs:
        out += ["", f"Device time spent and `sweep.study.savings`' estimate of training every "
                f"configuration to the end, {kind}, as fractions of the true full cost (mean):",
                "", "| method | spent | estimated full cost |", "| --- | ---: | ---: |"]
        out += [f"| {m} | {statistics.mean(x['spent'] for x in c):.3f} | "
                f"{statistics.mean(x['model_full'] for x in c):.3f} |" for m, c in costs]
    return "\n".join(out)


def budgets_index(r: dict[str, Any], per: list[dict[str, Any]]) -> int:
    """The index of record `r`'s budget among those of its (dataset, seed)."""
    same = sorted(x["budget_fraction"] for x in per
                  if x["dataset"] == r["dataset"] and x["seed"] == r["seed"])
    return same.index(r["budget_fraction"])


def datasets_of(kind: str, chosen: str | None) -> list[str]:
    if kind == "lcdb":
        if chosen:
            ids = [d.strip() for d in chosen.split(",") if d.strip()]
            unknown = [d for d in ids if d not in _TABLE]
            if unknown:
                raise SystemExit(f"--datasets: LCDB has no dataset {', '.join(unknown)} "
                                 f"(it has {len(_TABLE)} OpenML ids)")
            return ids
        return curves.default_datasets(_TABLE)
    if kind == "hartmann":
        return list(curves.HARTMANN)
    return [""]


def method_names(kind: str, only: list[str] | None) -> list[str]:
    probe = curves.synthetic("parallel", 0, EXIT_SECONDS)  # the names do not depend on it
    names = list(methods(probe))
    if ray_schedulers.available() is None:
        names += list(ray_schedulers.METHODS)
    if only:  # a method's own name picks it alone; another word, every name holding it
        names = [n for n in names if n in only or any(w in n for w in only if w not in names)]
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", default="lcdb",
                   help=f"comma-separated, of {', '.join(ALL_CURVES)} (default: lcdb)")
    p.add_argument("--datasets", default=None,
                   help="LCDB's OpenML ids, comma-separated (default: the documented subset)")
    p.add_argument("--lcdb-csv", type=Path, default=None,
                   help="LCDB's curves from this CSV instead of the installed package's")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (default: 2)")
    p.add_argument("--methods", nargs="*", default=None,
                   help="only these methods, or those whose name contains one of these words")
    p.add_argument("--json", type=Path, default=None, help="write every regret here")
    p.add_argument("--ray-pbt", type=int, default=0, metavar="SEEDS",
                   help="also Ray Tune's PopulationBasedTraining on the synthetic families, "
                   "in the real Ray runtime (about a minute a seed)")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.curves.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ALL_CURVES]
    if bad:
        raise SystemExit(f"--curves: unknown {', '.join(bad)} (one of {', '.join(ALL_CURVES)})")
    start, cpu0 = time.time(), time.process_time()
    if "lcdb" in kinds:
        global _TABLE
        _TABLE = curves.read_lcdb(args.lcdb_csv)
    tasks = [(k, d, s, m, args.gpus) for k in kinds for d in datasets_of(k, args.datasets)
             for s in range(args.seeds) for m in method_names(k, args.methods)]
    skipped = ray_schedulers.available()
    print(f"{args.seeds} seeds, {args.gpus} simulated devices, budgets from one "
          "configuration's full cost to all of them; regret against the best configuration "
          "trained to the end", flush=True)
    if skipped:
        print(skipped)
    records: list[dict[str, Any]] = []
    step = max(1, len(tasks) // 10)

    def progress(got: list[dict[str, Any]]) -> None:
        records.extend(got)
        done = len(records) // BUDGETS
        if done % step == 0:
            print(f"{done}/{len(tasks)} sweeps, {time.time() - start:.0f} s", file=sys.stderr,
                  flush=True)

    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            for got in pool.imap_unordered(run_one, tasks, chunksize=1):
                progress(got)
    else:
        for t in tasks:
            progress(run_one(t))
    order = {t[:4]: i for i, t in enumerate(tasks)}
    records.sort(key=lambda r: (order[(r["curves"], r["dataset"], r["seed"], r["method"])],
                                r["budget_fraction"]))
    for k in kinds:
        print()
        print(tables(records, k))
    if args.ray_pbt and not skipped:
        ray_pbt([k for k in kinds if k in curves.FAMILIES], args.gpus, args.ray_pbt)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "_cost"}
                                         for r in records], indent=0) + "\n")
    children = os.times()
    print(f"\n{len(tasks)} sweeps in {time.time() - start:.0f} s wall, "
          f"{time.process_time() - cpu0 + children.children_user + children.children_system:.0f}"
          f" CPU-s (this process and its workers); load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def ray_pbt(families: Iterable[str], gpus: int, seeds: int) -> None:
    """Ray Tune's PopulationBasedTraining, real runtime, with sweep pbt's settings and the
    first configurations of each seed as its population."""
    probe = curves.synthetic("parallel", 0, EXIT_SECONDS)
    pbt = methods(probe)["sweep pbt"]["scheduler"]
    steps = curves.SYNTHETIC_STEPS
    print()
    print(f"Ray Tune PopulationBasedTraining in the real Ray runtime, {seeds} seeds "
          f"(population {pbt['population']}, {gpus} at once, interval {pbt['interval']}, "
          f"quantile {pbt['quantile']}, perturb {pbt['perturb']}, Ray's resample "
          "probability 0.25): the best value at the last step")
    print()
    print("| family | method | mean regret | median regret | mean device-hours |")
    print("| --- | --- | ---: | ---: | ---: |")
    for family in families:
        f, space = curves.FAMILIES[family]
        bounds = {k: (v["low"], v["high"], bool(v.get("log"))) for k, v in space.items()}
        optimum = curves.best_fixed(family, steps)
        regrets, hours = [], []
        for seed in range(seeds):
            population = curves.configurations(family, seed, pbt["population"])
            with tempfile.TemporaryDirectory() as tmp:
                best, spent = ray_schedulers.pbt(
                    f, population, bounds, steps, gpus, pbt["interval"], pbt["quantile"],
                    tuple(pbt["perturb"]), seed, Path(tmp))
            regrets.append(best - optimum)
            hours.append(spent)
        print(f"| {family} | ray tune PopulationBasedTraining | "
              f"{statistics.mean(regrets):.4f} | {statistics.median(regrets):.4f} | "
              f"{statistics.mean(hours):.2f} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
