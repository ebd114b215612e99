"""Studies as sweep leaves them, written fast through Optuna's public API (`add_trials` of
`FrozenTrial`s), without running a trainer: for the report's tests and benchmark.

    path = write_study(tmp_path, "finished", n=40)   # a study file; its storage filled
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

from sweep.spec.storageurl import StorageKind, StorageUrl

KINDS = ("finished", "running", "multi", "only_fail")
DISTRIBUTIONS = {
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "layers": IntDistribution(1, 8),
    "optimizer": CategoricalDistribution(["adam", "sgd"]),
}
REASONS = ["exit code 1: RuntimeError: CUDA error: an illegal memory access",
           "out of memory: torch.OutOfMemoryError: CUDA out of memory",
           "timeout after 600 s"]


def write_study(folder: Path, kind: str = "finished", n: int = 40, gpus: int = 4,
                seed: int = 0, storage: str | None = None, simulated: bool = False) -> Path:
    """A study file in `folder` and its study of `n` trials on `gpus` devices of one host
    (`kind`: finished, running, multi (two objectives), only_fail), with GPU samples beside
    it (`simulated`: as on a simulated pool, samples without figures and no energy or
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
        "trainer": {"script": "train.py"},
        "params": {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
                   "layers": {"type": "int", "low": 1, "high": 8},
                   "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]}},
    }
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
    for number in range(n):
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
        attrs: dict[str, Any] = {"gpu": gpu, "host": "node1", "attempt": 0}
        if not running:
            attrs["exit_code"] = 0
        if not running and not simulated:
            attrs.update({"energy_j": seconds * 250 * steps / 10,
                          "gpu_util_mean": rng.uniform(40, 99),
                          "gpu_mem_peak_mb": rng.uniform(2000, 30000)})
        if state is TrialState.FAIL:
            attrs.update({"fail_reason": rng.choice(REASONS), "exit_code": 1})
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
