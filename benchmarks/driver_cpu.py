"""The driver's own CPU per trial, as a study grows: at its first trials, and with 10,000
trials already in the study.

A study of trainers that write their result and exit (plain python launcher, random sampler,
8 simulated devices, SQLite or a journal file) runs N1 then N2 more trials on a copy of a
study that already holds K finished trials; the driver runs in this process's child, which
reports its own CPU (user + system, its threads included, its trainers not). CPU per trial
is the difference of the two runs over N2 - N1 trials, so the driver's start-up (imports,
study load) drops out; the median of --rounds rounds, each of them every study size in turn.
A SQLite study is in WAL mode, as sweep creates its files.

`--floor` also measures, in this process, what the same trials cost through Optuna's public
API alone: the storage calls a driver cannot do without (the count under the budget lock,
`study.ask`, the heartbeat, the owner and run id, the param, the four attributes of the tell,
`study.tell`), with --gpus trials running at a time, on a file in sweep's SQLite settings,
and no trainer, file or other sweep code. The
driver's CPU above that floor is sweep's own.

Usage: python benchmarks/driver_cpu.py [--at 100 10000] [--n1 40] [--n2 140] [--gpus 8]
                                       [--sampler random] [--storage sqlite|journal]
                                       [--rounds 3] [--repo ../old] [--floor]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def has_wal(repo: Path) -> bool:
    """Whether the checkout at `repo` creates its SQLite files in WAL mode (its SQLite module,
    wherever that version keeps it)."""
    return any((repo / "sweep" / p).exists()
               for p in ("sqlite.py", "study/sqlite.py", "study/_sqlite.py"))


def prefill(path: Path, k: int, kind: str = "sqlite", wal: bool = True) -> float:
    """A study of `k` finished trials (as the benchmark's study would have them); seconds.
    `wal`: a SQLite file in WAL mode, as sweep creates its files since it has its SQLite
    module (`has_wal`; the last connection to it folds the log into the file)."""
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
    if kind == "sqlite" and wal:
        from sweep.study import _sqlite

        _sqlite.adopt_wal(path)
    return time.perf_counter() - began


def driver_cpu(work: Path, template: Path | None, total: int, args: argparse.Namespace,
               repo: Path = ROOT) -> float:
    """CPU seconds of one `sweep run` driver (of the checkout `repo`) that takes the study to
    `total` trials."""
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
                          text=True, check=True, cwd=repo,
                          env={**os.environ, "SWEEP_FAKE_GPUS": str(args.gpus),
                               "SWEEP_LOCK_DIR": str(run_dir / "locks"),
                               "PYTHONPATH": str(repo)})
    line = [x for x in done.stdout.splitlines() if x.startswith("CPU ")][-1]
    _, cpu, code = line.split()
    if code != "0":
        raise RuntimeError(f"sweep run failed: {done.stderr[-500:]}")
    return float(cpu)


def optuna_floor(work: Path, template: Path | None, n: int, gpus: int, kind: str) -> float:
    """CPU seconds per trial of `n` trials done through Optuna's public API alone, as the
    driver does them (see the module's docstring), `gpus` of them running at a time."""
    import optuna
    from optuna.trial import TrialState

    db = work / f"floor.{kind}"
    db.unlink(missing_ok=True)
    if template is not None:
        shutil.copy(template, db)
    storage: Any = f"sqlite:///{db}" if kind == "sqlite" else None
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(db)))
    else:  # the file as sweep makes it: WAL, synchronous=NORMAL
        from sweep.study import _sqlite

        _sqlite.adopt_wal(db)
        storage = optuna.storages.RDBStorage(storage, heartbeat_interval=60)
        _sqlite.tune(storage.engine)
    study = optuna.create_study(study_name="cpu", storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    running: list[optuna.Trial] = []

    def one(i: int) -> None:
        study.get_trials(deepcopy=False)  # the count under the budget lock
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = study.ask()
        if kind == "sqlite":
            storage.record_heartbeat(trial._trial_id)
        else:
            trial.set_user_attr("beat", time.time())
        trial.set_user_attr("run_id", f"cpu-{trial.number}-00000000")
        trial.set_user_attr("owner", {"host": "h", "pid": 1, "started": 0.0, "gpu": i % gpus,
                                      "dir": str(work)})
        trial.suggest_float("x", 0.0, 1.0)
        running.append(trial)
        if len(running) >= gpus:
            done = running.pop(0)
            for key, value in (("gpu", i % gpus), ("host", "h"), ("attempt", 0),
                               ("exit_code", 0)):
                done.set_user_attr(key, value)
            study.tell(done, 0.5, state=TrialState.COMPLETE)

    for i in range(gpus * 2):  # warm: the first trials fill the devices
        one(i)
    began = time.process_time()
    for i in range(n):
        one(i)
    return (time.process_time() - began) / n


def measure(at: list[int], n1: int = 40, n2: int = 340, gpus: int = 8,
            sampler: str = "random", storage: str = "sqlite", rounds: int = 3,
            say: bool = True, repos: list[Path] | None = None) -> dict[int, float]:
    """CPU seconds per trial of the driver, with each of `at` trials already in the study:
    the median of `rounds` rounds, each of them every study size (and every checkout of
    `repos`, this one first) in turn, so a busy spell of the machine hits them alike. Returns
    this checkout's; prints all."""
    args = argparse.Namespace(gpus=gpus, sampler=sampler, storage=storage)
    repos = [ROOT, *(repos or [])]
    per: dict[tuple[Path, int], list[float]] = {(r, k): [] for r in repos for k in at}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        templates: dict[tuple[Path, int], Path | None] = {}
        for repo in repos:
            wal = has_wal(repo)
            for k in at:
                done = next((t for (r, n), t in templates.items() if n == k and wal == has_wal(r)),
                            None)
                if k and done is None:
                    done = work / f"template{k}-{len(templates)}.{storage}"
                    took = prefill(done, k, storage, wal)
                    if say:
                        print(f"prefilled {k} trials in {took:.0f} s", flush=True)
                templates[repo, k] = done
        for r in range(rounds):
            for repo in repos:
                for k in at:
                    low = driver_cpu(work, templates[repo, k], k + n1, args, repo)
                    high = driver_cpu(work, templates[repo, k], k + n2, args, repo)
                    per[repo, k].append((high - low) / (n2 - n1))
                    if say:
                        print(f"round {r + 1}, {repo}, study at {k} trials: driver CPU "
                              f"{low:.2f} s for {n1} trials, {high:.2f} s for {n2}: "
                              f"{per[repo, k][-1] * 1000:.1f} ms per trial", flush=True)
    if say:  # the least of the rounds: the code's own cost, the least disturbed by others
        for repo in repos:
            print(f"{repo}: " + ", ".join(
                f"at {k}: median {statistics.median(per[repo, k]) * 1000:.1f} ms, least "
                f"{min(per[repo, k]) * 1000:.1f} ms" for k in at), flush=True)
    return {k: statistics.median(per[ROOT, k]) for k in at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--n1", type=int, default=40)
    parser.add_argument("--n2", type=int, default=340)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--sampler", default="random")
    parser.add_argument("--storage", default="sqlite", choices=["sqlite", "journal"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", action="store_true",
                        help="also measure Optuna's public API alone (see above)")
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="another checkout to measure beside this one (e.g. an older "
                             "commit's worktree)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results = measure(args.at, args.n1, args.n2, args.gpus, args.sampler, args.storage,
                      args.rounds, repos=[r.resolve() for r in args.repo])
    print(json.dumps({str(k): round(v * 1000, 2) for k, v in results.items()}))
    if args.floor:
        with tempfile.TemporaryDirectory() as tmp:
            for k in args.at:
                template = None
                if k:
                    template = Path(tmp) / f"template{k}.{args.storage}"
                    prefill(template, k, args.storage)
                floors = [optuna_floor(Path(tmp), template, args.n2 - args.n1, args.gpus,
                                       args.storage) for _ in range(args.rounds)]
                print(f"Optuna's public API alone, study at {k} trials: median "
                      f"{statistics.median(floors) * 1000:.1f} ms per trial, least "
                      f"{min(floors) * 1000:.1f} ms", flush=True)
    if len(results) > 1:
        first, last = results[min(results)], results[max(results)]
        print(f"ratio at {max(results)} to at {min(results)}: {last / first:.2f}")


if __name__ == "__main__":
    main()
