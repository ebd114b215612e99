"""The learning curves `schedulers.py` replays: LCDB's measured ones, mf-prior-bench's
MF-Hartmann, and three synthetic families.

Each source gives `Instance`s: a search space, the step numbers a trainer reports, the
configurations a seed starts (in order), how one step of a configuration goes (`walk`: its
cost in seconds of the fake clock, its value, the state a checkpoint carries), the best value
a configuration reaches at the last step (`optimum`: regrets are against it) and what
training every configuration to the end costs (`full_cost`, the budgets' unit).

- **LCDB 1.0** (Mohr et al., 2022; `pip install lcdb`, its CSVs ship in the package and are
  read from its folder, never imported: the module imports `openml`, which it does not
  declare): a configuration is a scikit-learn learner, a step an anchor (the training-set
  size, reported as the step number), its value the validation error (1 - accuracy, the mean
  over LCDB's outer and inner seeds), its cost the recorded `traintime` (the mean), scaled so
  that one configuration trained to the end costs on average what a synthetic one does
  (27 steps of `STEP_SECONDS`). A learner with no value at the dataset's last anchor (LCDB's
  run of it timed out) is left out.
- **MF-Hartmann** (`mf-prior-bench`'s `mfh3_good`, `_moderate`, `_bad`, `_terrible`: how well
  low fidelities rank): three continuous params, fidelity 4, 8, ..., 100 as the steps, one
  step a simulated minute.
- **parallel, crossing, schedule**: see `schedulers.py`'s docstring; the only ones with a
  state that a learning-rate schedule (PBT) changes.
"""

from __future__ import annotations

import importlib.util
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_SECONDS = 2.0  # one synthetic step on the fake clock (4 report polls), a simulated minute
SYNTHETIC_STEPS = 27  # steps of a synthetic configuration
SYNTHETIC_CONFIGS = 27  # configurations of a synthetic seed
LCDB_LEARNERS = 20  # learners in LCDB 1.0 (a dataset may have fewer that reach its end)
DEFAULT_LCDB = 30  # datasets of the default subset (`default_datasets`)
HARTMANN = ("mfh3_good", "mfh3_moderate", "mfh3_bad", "mfh3_terrible")

Walk = Callable[[dict[str, Any], Any, int], tuple[float, float, Any]]


@dataclass(frozen=True)
class Instance:
    """One set of curves to replay. `walk(params, state, i)`: step `steps[i]` of the
    configuration `params` after `state` (None: from scratch) -> (seconds, value, state)."""

    curves: str
    dataset: str
    space: dict[str, Any]
    steps: list[int]
    configs: list[dict[str, Any]]
    walk: Walk
    optimum: float
    full_cost: float  # seconds: every configuration in `configs` to the last step

    @property
    def nominal(self) -> int:
        """The configurations of the source (LCDB: its 20 learners), the budgets' first
        one's denominator."""
        return LCDB_LEARNERS if self.curves == "lcdb" else len(self.configs)


def full_cost(walk: Walk, configs: Iterable[dict[str, Any]], steps: int,
              exit_seconds: float) -> float:
    """Seconds that training each of `configs` through all `steps` costs, each exit
    included: the budgets' unit, "training every configuration to the end"."""
    total = 0.0
    for params in configs:
        state = None
        for i in range(steps):
            seconds, _, state = walk(params, state, i)
            total += seconds
        total += exit_seconds
    return total


# --- LCDB --------------------------------------------------------------------------------

def lcdb_folder() -> Path:
    """The installed lcdb package's folder (its CSVs), found without importing it."""
    spec = importlib.util.find_spec("lcdb")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("LCDB is not installed: pip install -e '.[bench]' (or pip install "
                         "--no-deps lcdb): see benchmarks/README.md")
    return Path(next(iter(spec.submodule_search_locations)))


Table = dict[str, dict[str, list[tuple[int, float, float]]]]  # id -> learner -> (anchor, s, err)


def read_lcdb(path: Path | None = None, datasets: set[str] | None = None) -> Table:
    """LCDB's accuracy curves, by dataset and learner: (anchor, mean traintime, mean
    validation error) per anchor, over LCDB's seeds. `path`: the package's
    database-accuracy.csv (default) or a file of those columns already averaged (the test's
    fixture: openmlid, learner, size_train, traintime, score_valid)."""
    import pandas as pd

    path = path or lcdb_folder() / "database-accuracy.csv"
    df = pd.read_csv(path, usecols=["openmlid", "learner", "size_train", "traintime",
                                    "score_valid"], dtype={"openmlid": str})
    if datasets is not None:
        df = df[df["openmlid"].isin(datasets)]
    means = df.groupby(["openmlid", "learner", "size_train"]).agg(
        t=("traintime", "mean"), v=("score_valid", "mean")).reset_index()
    means["id"] = means["openmlid"].astype(int)
    means = means.sort_values(["id", "learner", "size_train"])
    out: Table = {}
    for oid, learner, anchor, t, v in zip(means["openmlid"], means["learner"],
                                          means["size_train"], means["t"], means["v"],
                                          strict=True):
        out.setdefault(oid, {}).setdefault(learner, []).append(
            (int(anchor), float(t), 1.0 - float(v)))
    return out


def complete(table: Table, oid: str) -> dict[str, list[tuple[int, float, float]]]:
    """The learners of dataset `oid` with a value at each of the dataset's anchors up to
    its last (those that did not time out)."""
    anchors = sorted({a for rows in table[oid].values() for a, _, _ in rows})
    return {k: rows for k, rows in table[oid].items() if [a for a, _, _ in rows] == anchors}


def default_datasets(table: Table) -> list[str]:
    """The default subset: the DEFAULT_LCDB lowest OpenML ids among the datasets on which
    all of LCDB's 20 learners reached the last anchor (every configuration can be trained
    to the end). A rule on the data's completeness, not on how any method does."""
    ids = [oid for oid in table if len(complete(table, oid)) == LCDB_LEARNERS]
    return sorted(ids, key=int)[:DEFAULT_LCDB]


def lcdb(table: Table, oid: str, seed: int, exit_seconds: float) -> Instance:
    """Dataset `oid` of `table` as an Instance; the seed shuffles the learners' order."""
    rows = complete(table, oid)
    if not rows:
        raise SystemExit(f"LCDB has no learner with a complete curve on dataset {oid}")
    steps = [a for a, _, _ in next(iter(rows.values()))]
    scale = SYNTHETIC_STEPS * STEP_SECONDS / (
        sum(t for r in rows.values() for _, t, _ in r) / len(rows))
    costs = {k: [max(t * scale, 1e-6) for _, t, _ in r] for k, r in rows.items()}
    errors = {k: [e for _, _, e in r] for k, r in rows.items()}

    def walk(params: dict[str, Any], state: Any, i: int) -> tuple[float, float, Any]:
        k = params["learner"]
        return costs[k][i], errors[k][i], errors[k][i]

    learners = sorted(rows)
    order = list(learners)
    random.Random(seed).shuffle(order)
    configs = [{"learner": k} for k in order]
    return Instance("lcdb", oid, {"learner": {"type": "categorical", "choices": learners}},
                    steps, configs, walk, min(e[-1] for e in errors.values()),
                    full_cost(walk, configs, len(steps), exit_seconds))


# --- MF-Hartmann ---------------------------------------------------------------------------

def hartmann(name: str, seed: int, exit_seconds: float) -> Instance:
    """mf-prior-bench's benchmark `name` (seeded): 27 configurations it samples, fidelities
    4, 8, ..., 100 as the steps, one a simulated minute."""
    try:
        import mfpbench
    except ImportError:
        raise SystemExit("mf-prior-bench is not installed: pip install --no-deps "
                         "mf-prior-bench configspace more-itertools (benchmarks/README.md "
                         "says why --no-deps)") from None
    bench = mfpbench.get(name, seed=seed)
    steps = list(range(4, 101, 4))
    names = sorted(bench.space.keys())
    cache: dict[tuple[Any, ...], float] = {}

    def walk(params: dict[str, Any], state: Any, i: int) -> tuple[float, float, Any]:
        key = (*(params[k] for k in names), steps[i])
        if key not in cache:
            config = bench.Config.from_dict({k: params[k] for k in names})
            cache[key] = float(bench.query(config, at=steps[i]).error)
        return STEP_SECONDS, cache[key], cache[key]

    rng = random.Random(seed)
    configs = [{k: rng.random() for k in names} for _ in range(SYNTHETIC_CONFIGS)]
    best = bench.query(bench.optimum, at=steps[-1]).error
    space = {k: {"type": "float", "low": 0.0, "high": 1.0} for k in names}
    return Instance("hartmann", name, space, steps, configs, walk, float(best),
                    full_cost(walk, configs, len(steps), exit_seconds))


# --- synthetic families --------------------------------------------------------------------

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


def configurations(family: str, seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    if family == "schedule":
        return [{"lr": 10 ** rng.uniform(-3, 0)} for _ in range(n)]
    return [{"x": rng.random()} for _ in range(n)]


def synthetic(family: str, seed: int, exit_seconds: float) -> Instance:
    f, space = FAMILIES[family]

    def walk(params: dict[str, Any], state: Any, i: int) -> tuple[float, float, Any]:
        value = f(params, state, i)
        return STEP_SECONDS, value, value

    configs = configurations(family, seed, SYNTHETIC_CONFIGS)
    return Instance(family, "", space, list(range(SYNTHETIC_STEPS)), configs, walk,
                    best_fixed(family, SYNTHETIC_STEPS),
                    full_cost(walk, configs, SYNTHETIC_STEPS, exit_seconds))
