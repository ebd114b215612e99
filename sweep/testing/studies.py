"""Studies as sweep leaves them, written fast through Optuna's public API (`add_trials` of
`FrozenTrial`s), without running a trainer: for the report's tests and benchmark.

    path = stored_study(tmp_path, "finished", n=40)   # a study file; its storage filled
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from sweep._core import names
from sweep.spec.storageurl import StorageKind, StorageUrl

KINDS = ("finished", "running", "multi", "only_fail", "asha", "pbt")
SCHEDULERS = {  # the study.scheduler of the kinds `_scheduled` writes
    "asha": {"type": "asha", "min_steps": 2, "max_steps": 18, "reduction_factor": 3},
    "pbt": {"type": "pbt", "population": 4, "interval": 5, "max_steps": 20, "seed": 0},
}
DISTRIBUTIONS = {
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "layers": IntDistribution(1, 8),
    "optimizer": CategoricalDistribution(["adam", "sgd"]),
}
REASONS = ["exit code 1: RuntimeError: CUDA error: an illegal memory access",
           "out of memory: torch.OutOfMemoryError: CUDA out of memory",
           "timeout after 600 s"]


def stored_study(folder: Path, kind: str = "finished", n: int = 40, gpus: int = 4,
                 seed: int = 0, storage: str | None = None, simulated: bool = False) -> Path:
    """A study file in `folder` and its study of `n` trials on `gpus` devices of one host
    (`kind`: finished, running, multi (two objectives), only_fail; asha and pbt: a
    scheduler's study of its own size, see `_scheduled`), with GPU samples beside it
    (`simulated`: as on a simulated pool, samples without figures and no energy or
    utilisation stored). `storage` defaults to a journal file (fast to fill); returns the
    study file."""
    assert kind in KINDS
    rng = random.Random(seed)
    multi = kind == "multi"
    name = f"fake-{kind}"
    url = storage or f"journal:///{(folder / (name + '.log')).resolve()}"
    data: dict[str, Any] = {
        "study": {"name": name, "storage": url, "n_trials": max(n, 1),
                  **({"directions": ["minimize", "maximize"], "metrics": ["loss", "acc"]}
                     if multi else {"direction": "minimize", "metric": "loss"})},
        "trainer": {"script": "train.py", **({"resume_args": ["--resume"]}
                                             if kind in SCHEDULERS else {})},
        "params": {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
                   "layers": {"type": "int", "low": 1, "high": 8},
                   "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]}},
    }
    if kind in SCHEDULERS:
        data["study"]["scheduler"] = SCHEDULERS[kind]
    study_file = folder / f"{name}.yaml"
    study_file.write_text(yaml.safe_dump(data, sort_keys=False))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, flush = _storage(url)
    study = optuna.create_study(
        study_name=name, storage=storage,
        **({"directions": ["minimize", "maximize"]} if multi else {"direction": "minimize"}))
    if multi:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
            warnings.simplefilter("ignore")
            study.set_metric_names(["loss", "acc"])
    now = dt.datetime.now()
    start = now - dt.timedelta(seconds=60.0 * n / gpus + 120)
    free = [start] * gpus
    trials = []
    samples: list[list[Any]] = []
    for number in range(0 if kind in SCHEDULERS else n):
        gpu = min(range(gpus), key=lambda g: free[g])
        begin = free[gpu] + dt.timedelta(seconds=rng.uniform(0, 20))  # idle gaps
        seconds = rng.uniform(20, 100)
        state = _state(kind, rng, number, n)
        lr, layers = 10 ** rng.uniform(-5, -1), rng.randint(1, 8)
        params = {"lr": lr, "layers": layers, "optimizer": rng.choice(["adam", "sgd"])}
        loss = abs(math.log10(lr) + 3) + 0.05 * layers + rng.random() * 0.2
        steps = 1 if state is TrialState.FAIL else (4 if state is TrialState.PRUNED else 10)
        inter = {} if multi else {s: loss * (1 + 2.0 / (s + 1)) for s in range(steps)}
        end = begin + dt.timedelta(seconds=seconds * steps / 10)
        running = state is TrialState.RUNNING
        attrs: dict[str, Any] = {names.GPU: gpu, names.HOST: "node1", names.ATTEMPT: 0}
        if not running:
            attrs[names.EXIT_CODE] = 0
        if not running and not simulated:
            attrs.update({names.ENERGY_J: seconds * 250 * steps / 10,
                          names.GPU_UTIL_MEAN: rng.uniform(40, 99),
                          names.GPU_MEM_PEAK_MB: rng.uniform(2000, 30000)})
        if state is TrialState.FAIL:
            attrs.update({names.FAIL_REASON: rng.choice(REASONS), names.EXIT_CODE: 1})
        values = None
        if state is TrialState.COMPLETE:
            values = [loss, 100 - 10 * loss] if multi else [loss]
        elif state is TrialState.PRUNED:
            values = [inter[max(inter)]]
        trials.append(FrozenTrial(
            number=number, state=state, value=None, values=values, datetime_start=begin,
            datetime_complete=None if running else end, params=params,
            distributions=DISTRIBUTIONS, user_attrs=attrs, system_attrs={},
            intermediate_values=inter, trial_id=number))
        free[gpu] = now if running else end
        for t in range(0, int((end - begin).total_seconds()), 10):
            at = begin + dt.timedelta(seconds=t)
            figures = [math.nan] * 5 if simulated else [
                rng.uniform(40, 99), rng.uniform(10, 60), rng.uniform(2000, 30000), 80000,
                rng.uniform(100, 300)]
            samples.append([at.timestamp(), "node1", gpu, str(number), *figures])
    if kind in SCHEDULERS:
        trials = _scheduled(kind, rng, start, gpus)
    study.add_trials(trials)
    flush()
    out = folder / name / "drivers" / "node1-1"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "gpu_samples.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "host", "gpu", "trials", "util_gpu", "util_mem",
                         "mem_used_mb", "mem_total_mb", "power_w"])
        writer.writerows(sorted(samples))
    return study_file


def _scheduled(kind: str, rng: random.Random, start: dt.datetime,
               gpus: int) -> list[FrozenTrial]:
    """The trials a scheduler leaves, one step 6 s: asha, 9 configurations paused at rung 0
    (step 2), the top 3 promoted and paused at rung 1 (step 6), the best of them trained to
    step 17; pbt, a population of 4 trained to step 19, the worst replaced at steps 5 and 10
    by copies of the best with its lr scaled by 0.8."""
    free = [start] * gpus
    trials: list[FrozenTrial] = []

    def add(params: dict[str, Any], steps: range, state: TrialState,
            attrs: dict[str, Any]) -> int:
        gpu = min(range(gpus), key=lambda g: free[g])
        begin = free[gpu]
        end = begin + dt.timedelta(seconds=6.0 * len(steps))
        base = abs(math.log10(params["lr"]) + 3) + 0.05 * params["layers"]
        inter = {s: base * (1 + 2.0 / (s + 1)) for s in steps}
        number = len(trials)
        trials.append(FrozenTrial(
            number=number, state=state, value=None, values=[inter[max(inter)]],
            datetime_start=begin, datetime_complete=end, params=params,
            distributions=DISTRIBUTIONS, trial_id=number, system_attrs={},
            user_attrs={names.GPU: gpu, names.HOST: "node1", names.EXIT_CODE: 0, **attrs},
            intermediate_values=inter))
        free[gpu] = end
        return number

    def config() -> dict[str, Any]:
        return {"lr": 10 ** rng.uniform(-5, -1), "layers": rng.randint(1, 8),
                "optimizer": rng.choice(["adam", "sgd"])}

    pruned, done = TrialState.PRUNED, TrialState.COMPLETE
    if kind == "pbt":
        population = [config() for _ in range(4)]
        best = min(range(4), key=lambda i: abs(math.log10(population[i]["lr"]) + 3))
        worst = sorted(set(range(4)) - {best}, key=lambda i: -abs(
            math.log10(population[i]["lr"]) + 3))[:2]
        numbers = {}
        for i in sorted(range(4), key=lambda i: (i in worst, worst.index(i) if i in worst
                                                 else 0)):
            stop = {worst[0]: 6, worst[1]: 11}.get(i, 20)
            numbers[i] = add(population[i], range(stop), done if stop == 20 else pruned,
                             {names.ATTEMPT: 0})
        for at, replaced in ((5, worst[0]), (10, worst[1])):
            add({**population[best], "lr": population[best]["lr"] * 0.8}, range(at + 1, 20),
                done, {names.ATTEMPT: 0, names.EXPLOIT_OF: numbers[best],
                       names.EXPLOIT_STEP: at, names.REPLACES: numbers[replaced]})
        return trials
    configs = [config() for _ in range(9)]
    first = [add(c, range(3), pruned, {names.ATTEMPT: 0, names.PAUSED_AT: 2, names.RUNG: 0})
             for c in configs]
    top = sorted(range(9), key=lambda i: trials[first[i]].intermediate_values[2])[:3]
    second = {i: add(configs[i], range(3, 7), pruned,
                     {names.ATTEMPT: 1, names.RETRY_OF: first[i], names.CONTINUES: first[i],
                      names.PAUSED_AT: 6, names.RUNG: 1}) for i in top}
    add(configs[top[0]], range(7, 18), done,
        {names.ATTEMPT: 2, names.RETRY_OF: first[top[0]], names.CONTINUES: second[top[0]]})
    return trials


def _state(kind: str, rng: random.Random, number: int, n: int) -> TrialState:
    if kind == "only_fail":
        return TrialState.FAIL
    if kind == "running" and number >= n - 3:
        return TrialState.RUNNING
    roll = rng.random()
    if kind == "multi":
        return TrialState.FAIL if roll < 0.1 else TrialState.COMPLETE
    return (TrialState.FAIL if roll < 0.1 else TrialState.PRUNED if roll < 0.35
            else TrialState.COMPLETE)


class _Buffer(BaseJournalBackend):
    """A journal kept in memory, written to its file at once (a file lock per trial makes
    10,000 trials take a minute)."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        return self.logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.logs.extend(logs)


def _storage(url: str) -> tuple[Any, Any]:
    """(the storage to fill, what writes it to `url` once filled)."""
    parsed = StorageUrl.parse(url)
    if parsed.kind is not StorageKind.JOURNAL:
        return url, lambda: None
    buffer = _Buffer()
    path = str(parsed.file)
    return JournalStorage(buffer), lambda: JournalFileBackend(path).append_logs(buffer.logs)
