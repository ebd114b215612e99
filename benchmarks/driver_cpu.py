"""The driver's own CPU per trial, as a study grows: at its first trials, and with 10,000
trials already in the study.

A study of trainers that write their result and exit (plain python launcher, random sampler,
8 simulated devices, SQLite or a journal file) runs N1 then N2 more trials on a copy of a
study that already holds K finished trials; the driver runs in this process's child, which
reports its own CPU (user + system, its threads included, its trainers not), and the
transactions and SQL statements its storage ran (SQLAlchemy event hooks set by the benchmark
in that child: nothing in sweep counts them). CPU per trial is the difference of the two runs
over N2 - N1 trials, so the driver's start-up (imports, study load) drops out; the median of
--rounds rounds, each of them every study size (and every checkout) in turn.

Every checkout is measured on the SQLite file as that checkout makes it: a first run of it on
a new file says its mode (`PRAGMA journal_mode` of the file it made: wal, or delete for a
rollback journal), the prefilled studies it runs on are made in that mode, and each run's file
is checked to be in it still. The mode measured is printed beside each figure.

`--floor` also measures, in this process, what the same trials cost through Optuna's public
API alone: the storage calls a driver cannot do without (the count under the budget lock,
`study.ask`, the heartbeat, the run id and owner, the param, the four attributes of the
tell, `study.tell` less its last read, as sweep's `_optuna_compat.tell`: the calls today's
driver makes, in its order), with --gpus trials running
at a time, on a new file each round in sweep's SQLite settings (WAL, synchronous=NORMAL), and
no trainer, file or other sweep code. The driver's CPU above that floor is sweep's own.

Usage: python benchmarks/driver_cpu.py [--at 100 10000] [--n1 40] [--n2 140] [--gpus 8]
                                       [--sampler random] [--storage sqlite|journal]
                                       [--rounds 3] [--repo ../old] [--floor]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy

ROOT = Path(__file__).resolve().parent.parent
TRAINER = """
import json, os
from pathlib import Path
Path(os.environ["SWEEP_RESULT_FILE"]).write_text(json.dumps({"score": 0.5}))
"""
COUNT = """
import collections, sqlalchemy
SQL = collections.Counter()  # statements, transactions, transactions that wrote
_writing = set()

@sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "begin")
def _begin(conn):
    SQL["transactions"] += 1
    _writing.discard(id(conn))

@sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "before_cursor_execute")
def _statement(conn, cursor, statement, parameters, context, executemany):
    SQL["statements"] += 1
    if not statement.lstrip().upper().startswith(("SELECT", "PRAGMA")) \
            and id(conn) not in _writing:
        _writing.add(id(conn))
        SQL["writes"] += 1
"""
RUN = COUNT + """
import json, resource, sys
from sweep import cli
code = cli.main(["run", sys.argv[1]])
u = resource.getrusage(resource.RUSAGE_SELF)
print("CPU", u.ru_utime + u.ru_stime, code, json.dumps(SQL))
"""


def storage_url(path: Path, kind: str) -> str:
    return f"sqlite:///{path}" if kind == "sqlite" else f"journal://{path}"


def journal_mode(path: Path) -> str:
    """The journal mode of the SQLite file `path` as it is now (`wal`, `delete`, ...): the mode
    is kept in the file, so this is how the checkout that made it left it."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def prefill(path: Path, k: int, kind: str = "sqlite", mode: str = "wal") -> float:
    """A study of `k` finished trials (as the benchmark's study would have them); seconds.
    `mode`: the SQLite journal mode the file is made in (as the checkout measured on it makes
    its files: `mode_of`); the last connection to a WAL file folds the log into it."""
    import optuna
    from optuna.distributions import BaseDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.perf_counter()
    storage: Any = f"sqlite:///{path}"
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(path)))
    else:  # the mode first, on the new file, as sweep switches a new file
        with contextlib.closing(sqlite3.connect(path)) as conn:
            got = str(conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]).lower()
        if got != mode:
            raise RuntimeError(f"{path}: journal mode {got}, not {mode}")
    study = optuna.create_study(study_name="cpu", storage=storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # set_metric_names is "experimental"
        study.set_metric_names(["score"])
    dist: dict[str, BaseDistribution] = {"x": FloatDistribution(0.0, 1.0)}
    batch = [create_trial(state=TrialState.COMPLETE, value=i / k, params={"x": i / k},
                          distributions=dist, user_attrs={"gpu": i % 8, "host": "prefill"})
             for i in range(k)]
    study.add_trials(batch)
    if isinstance(storage, str):
        del study
        gc.collect()  # the engine's last connection goes: a WAL file folds its log
    return time.perf_counter() - began


@dataclass
class Run:
    """One driver run: its CPU seconds, its storage's counts (`COUNT`), the file's mode."""

    cpu: float
    sql: dict[str, int]
    mode: str


def driver_cpu(work: Path, template: Path | None, total: int, args: argparse.Namespace,
               repo: Path = ROOT) -> Run:
    """One `sweep run` driver (of the checkout `repo`, importing its own modules: its folder
    is the run's cwd and PYTHONPATH) that takes the study to `total` trials."""
    import yaml

    run_dir = work / f"run{total}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
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
    _, cpu, code, sql = line.split(maxsplit=3)
    if code != "0":
        raise RuntimeError(f"sweep run failed: {done.stderr[-500:]}")
    return Run(float(cpu), json.loads(sql),
               journal_mode(db) if args.storage == "sqlite" else "journal file")


def mode_of(work: Path, args: argparse.Namespace, repo: Path) -> str:
    """The journal mode the checkout `repo` makes a new SQLite study file in: one trial of it
    on a new file, then the file's `PRAGMA journal_mode`."""
    if args.storage != "sqlite":
        return "journal file"
    return driver_cpu(work / f"mode-{repo.name}", None, 1, args, repo).mode


def optuna_floor(work: Path, template: Path | None, n: int, gpus: int, kind: str,
                 sql: Any = None) -> tuple[float, dict[str, float]]:
    """CPU seconds per trial of `n` trials done through Optuna's public API alone, as the
    driver does them (see the module's docstring), `gpus` of them running at a time, in a
    folder of their own under `work` (a new file: nothing of an earlier round's log beside
    it). Returns it, and the storage's counts per trial where `sql` (`COUNT`'s counter, set
    up in this process) is given."""
    import optuna
    from optuna.study._tell import _tell_with_warning
    from optuna.trial import TrialState

    folder = Path(tempfile.mkdtemp(prefix="floor-", dir=work))
    db = folder / f"floor.{kind}"
    if template is not None:
        shutil.copy(template, db)
    storage: Any = f"sqlite:///{db}" if kind == "sqlite" else None
    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(db)))
    else:  # the file as sweep makes it: WAL (the template's, else set here), synchronous=NORMAL
        if template is None:
            with contextlib.closing(sqlite3.connect(db)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        storage = optuna.storages.RDBStorage(storage, heartbeat_interval=60)

        @sqlalchemy.event.listens_for(storage.engine, "connect")
        def normal(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")

        storage.engine.dispose()
    study = optuna.create_study(study_name="cpu", storage=storage, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    running: list[optuna.Trial] = []
    for call in FLOOR_CALLS:
        call.begin(study, storage, kind, work, gpus)

    def one(i: int) -> None:
        for call in FLOOR_CALLS:
            call.ask_side(i, running)
        if len(running) >= gpus:
            done = running.pop(0)
            for call in FLOOR_CALLS:
                call.tell_side(i, done)
            # study.tell but its last read (a copy of the trial it returns), as the driver
            _tell_with_warning(study, done, 0.5, TrialState.COMPLETE)

    for i in range(gpus * 2):  # warm: the first trials fill the devices
        one(i)
    before = dict(sql or {})
    began = time.process_time()
    for i in range(n):
        one(i)
    spent = (time.process_time() - began) / n
    counted = {x: ((sql or {}).get(x, 0) - before.get(x, 0)) / n
               for x in ("transactions", "writes", "statements")}
    if isinstance(storage, optuna.storages.RDBStorage):
        storage.engine.dispose()
    shutil.rmtree(folder, ignore_errors=True)
    return spent, counted


class DriverCalls:
    """The storage calls today's driver makes for one trial, through Optuna's public API: on
    the ask side (the count under the budget lock, `study.ask`, the heartbeat, the run id, the
    owner, the param) and on the tell side (its four attributes; `study.tell` follows)."""

    def begin(self, study: Any, storage: Any, kind: str, work: Path, gpus: int) -> None:
        self.study, self.storage, self.kind, self.work, self.gpus = (study, storage, kind,
                                                                     work, gpus)

    def ask_side(self, i: int, running: list[Any]) -> None:
        study = self.study
        study.get_trials(deepcopy=False)  # the count under the budget lock
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = study.ask()
        if self.kind == "sqlite":
            self.storage.record_heartbeat(trial._trial_id)
        else:
            trial.set_user_attr("beat", time.time())
        trial.set_user_attr("run_id", f"cpu-{trial.number}-00000000")
        trial.set_user_attr("owner", {"host": "h", "pid": 1, "started": 0.0,
                                      "gpu": i % self.gpus, "dir": str(self.work)})
        trial.suggest_float("x", 0.0, 1.0)
        running.append(trial)

    def tell_side(self, i: int, done: Any) -> None:
        for key, value in (("gpu", i % self.gpus), ("host", "h"), ("attempt", 0),
                           ("exit_code", 0)):
            done.set_user_attr(key, value)


FLOOR_CALLS = [DriverCalls()]


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
    sql: dict[tuple[Path, int], dict[str, float]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        modes = {repo: mode_of(work, args, repo) for repo in repos}
        templates: dict[tuple[str, int], Path | None] = {}
        for repo in repos:
            if say:
                print(f"{repo}: makes its SQLite files in journal mode {modes[repo]}"
                      if storage == "sqlite" else f"{repo}: a journal file", flush=True)
            for k in at:
                key = (modes[repo], k)
                if k and key not in templates:
                    done = templates[key] = work / f"template{k}-{modes[repo]}.{storage}"
                    took = prefill(done, k, storage, modes[repo])
                    if say:
                        print(f"prefilled {k} trials ({modes[repo]}) in {took:.0f} s",
                              flush=True)
                templates.setdefault(key, None)
        for r in range(rounds):
            for repo in repos:
                for k in at:
                    loads.append(os.getloadavg()[0])
                    low = driver_cpu(work, templates[modes[repo], k], k + n1, args, repo)
                    high = driver_cpu(work, templates[modes[repo], k], k + n2, args, repo)
                    for run in (low, high):
                        if run.mode != modes[repo]:
                            raise RuntimeError(f"{repo}: its run left the file in mode "
                                               f"{run.mode}, not {modes[repo]}")
                    per[repo, k].append((high.cpu - low.cpu) / (n2 - n1))
                    sql[repo, k] = {x: (high.sql.get(x, 0) - low.sql.get(x, 0)) / (n2 - n1)
                                    for x in ("transactions", "writes", "statements")}
                    if say:
                        print(f"round {r + 1}, {repo}, study at {k} trials ({high.mode}): "
                              f"driver CPU {low.cpu:.2f} s for {n1} trials, {high.cpu:.2f} s "
                              f"for {n2}: {per[repo, k][-1] * 1000:.1f} ms per trial; load "
                              f"{loads[-1]:.1f}", flush=True)
    if say:  # the least of the rounds: the code's own cost, the least disturbed by others
        print(f"load average (1 min) at each pair of runs: {min(loads):.1f} to "
              f"{max(loads):.1f}, median {statistics.median(loads):.1f}")
        for repo in repos:
            print(f"{repo} ({modes[repo]}): " + ", ".join(
                f"at {k}: median {statistics.median(per[repo, k]) * 1000:.1f} ms, least "
                f"{min(per[repo, k]) * 1000:.1f} ms; per trial "
                f"{sql[repo, k]['transactions']:.1f} transactions "
                f"({sql[repo, k]['writes']:.1f} writing), "
                f"{sql[repo, k]['statements']:.1f} statements" for k in at), flush=True)
        for repo in repos[1:]:
            print(f"ratio, this checkout to {repo.name}: " + ", ".join(
                f"at {k}: {statistics.median(per[ROOT, k]) / statistics.median(per[repo, k]):.2f}"
                for k in at))
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
        counting: dict[str, Any] = {}
        exec(COUNT, counting)  # the same hooks as the driver's runs, in this process
        with tempfile.TemporaryDirectory() as tmp:
            for k in args.at:
                template = None
                if k:
                    template = Path(tmp) / f"template{k}.{args.storage}"
                    prefill(template, k, args.storage)
                got = [optuna_floor(Path(tmp), template, args.n2 - args.n1, args.gpus,
                                    args.storage, counting["SQL"]) for _ in range(args.rounds)]
                floors, counted = [g[0] for g in got], got[-1][1]
                print(f"Optuna's public API alone, study at {k} trials: median "
                      f"{statistics.median(floors) * 1000:.1f} ms per trial, least "
                      f"{min(floors) * 1000:.1f} ms; per trial "
                      f"{counted['transactions']:.1f} transactions ({counted['writes']:.1f} "
                      f"writing), {counted['statements']:.1f} statements; load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    if len(results) > 1:
        first, last = results[min(results)], results[max(results)]
        print(f"ratio at {max(results)} to at {min(results)}: {last / first:.2f}")


if __name__ == "__main__":
    main()
