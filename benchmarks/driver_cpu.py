"""The driver's own CPU per trial, as a study grows: at its first trials, and with 10,000
trials already in the study.

A study of trainers that write their result and exit (plain python launcher, random sampler,
8 simulated devices, SQLite or a journal file) runs N1 then N2 more trials on a copy of a
study that already holds K finished trials; the driver runs in this process's child, which
reports its own CPU (user + system, its threads included, its trainers not). CPU per trial
is the difference of the two runs over N2 - N1 trials, so the driver's start-up (imports,
study load) drops out.

Usage: python benchmarks/driver_cpu.py [--at 100 10000] [--n1 40] [--n2 140] [--gpus 8]
                                       [--sampler random] [--storage sqlite|journal]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAINER = """
import json, os
from pathlib import Path
Path(os.environ["SWEEP_RESULT_FILE"]).write_text(json.dumps({"score": 0.5}))
"""
RUN = """
import resource, sys
from sweep import cli
code = cli.main(["run", sys.argv[1]])
u = resource.getrusage(resource.RUSAGE_SELF)
print("CPU", u.ru_utime + u.ru_stime, code)
"""


def storage_url(path: Path, kind: str) -> str:
    return f"sqlite:///{path}" if kind == "sqlite" else f"journal://{path}"


def prefill(path: Path, k: int, kind: str = "sqlite") -> float:
    """A study of `k` finished trials (as the benchmark's study would have them); seconds."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.perf_counter()
    storage: Any = f"sqlite:///{path}"
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="cpu", storage=storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # set_metric_names is "experimental"
        study.set_metric_names(["score"])
    dist = {"x": FloatDistribution(0.0, 1.0)}
    batch = [create_trial(state=TrialState.COMPLETE, value=i / k, params={"x": i / k},
                          distributions=dist, user_attrs={"gpu": i % 8, "host": "prefill"})
             for i in range(k)]
    study.add_trials(batch)
    if kind == "sqlite":  # as sweep creates its files (its last connection checkpoints)
        from sweep import sqlite

        sqlite.adopt_wal(path)
    return time.perf_counter() - began


def driver_cpu(work: Path, template: Path | None, total: int, args: argparse.Namespace) -> float:
    """CPU seconds of one `sweep run` driver that takes the study to `total` trials."""
    import yaml

    run_dir = work / f"run{total}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    db = run_dir / ("cpu.db" if args.storage == "sqlite" else "cpu.log")
    if template is not None:
        shutil.copy(template, db)
    (run_dir / "trainer.py").write_text(TRAINER)
    study = run_dir / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": {"name": "cpu", "direction": "minimize", "metric": "score",
                  "n_trials": total, "sampler": {"type": args.sampler, "seed": 0},
                  "storage": storage_url(db, args.storage)},
        "trainer": {"script": str(run_dir / "trainer.py"), "launcher": "python"},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }))
    done = subprocess.run([sys.executable, "-c", RUN, str(study)], capture_output=True,
                          text=True, check=True,
                          env={**os.environ, "SWEEP_FAKE_GPUS": str(args.gpus),
                               "SWEEP_LOCK_DIR": str(run_dir / "locks")})
    line = [x for x in done.stdout.splitlines() if x.startswith("CPU ")][-1]
    _, cpu, code = line.split()
    if code != "0":
        raise RuntimeError(f"sweep run failed: {done.stderr[-500:]}")
    return float(cpu)


def measure(at: list[int], n1: int = 40, n2: int = 140, gpus: int = 8,
            sampler: str = "random", storage: str = "sqlite",
            say: bool = True) -> dict[int, float]:
    """CPU seconds per trial of the driver, with each of `at` trials already in the study."""
    args = argparse.Namespace(gpus=gpus, sampler=sampler, storage=storage)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for k in at:
            template = None
            if k:
                template = work / f"template{k}.{storage}"
                took = prefill(template, k, storage)
                if say:
                    print(f"prefilled {k} trials in {took:.0f} s", flush=True)
            low = driver_cpu(work, template, k + n1, args)
            high = driver_cpu(work, template, k + n2, args)
            results[k] = (high - low) / (n2 - n1)
            if say:
                print(f"study at {k} trials: driver CPU {low:.2f} s for {n1} trials, "
                      f"{high:.2f} s for {n2}: {results[k] * 1000:.1f} ms per trial",
                      flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--n1", type=int, default=40)
    parser.add_argument("--n2", type=int, default=140)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--sampler", default="random")
    parser.add_argument("--storage", default="sqlite", choices=["sqlite", "journal"])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results = measure(args.at, args.n1, args.n2, args.gpus, args.sampler, args.storage)
    print(json.dumps({str(k): round(v * 1000, 2) for k, v in results.items()}))
    if len(results) > 1:
        first, last = results[min(results)], results[max(results)]
        print(f"ratio at {max(results)} to at {min(results)}: {last / first:.2f}")


if __name__ == "__main__":
    main()
