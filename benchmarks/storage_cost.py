"""What one trial costs in storage, per storage kind and number of drivers (issue 12).

Each driver is a process doing what `sweep run` does to storage for every trial, with no
trainer: under the budget lock, read the counts and `ask` (heartbeat, owner record, 2 params
sampled by the random sampler); then tell COMPLETE with the attributes sweep stores. The
drivers share one study until `--trials` are finished. Reported: wall time per trial (all
drivers together), each driver's median time per trial (lock waits included), and the
drivers' own CPU per trial.

Storages: SQLite (a file), PostgreSQL (a throwaway server on loopback, as the tests start),
the gRPC proxy (`sweep storage-proxy` in front of that PostgreSQL), and a journal file.

Usage: python benchmarks/storage_cost.py [--trials 1000] [--drivers 1 4] [--kinds sqlite ...]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optuna.trial import TrialState  # noqa: E402

from sweep.spec import schema  # noqa: E402
from sweep.study.attrs import Owner  # noqa: E402
from sweep.study.connect import connect  # noqa: E402
from sweep.study.opening import open_study  # noqa: E402
from sweep.study.storage import open_storage  # noqa: E402
from sweep.testing.postgres import throwaway_postgres  # noqa: E402
from sweep.trial.outcome import Outcome  # noqa: E402


def spec_for(url: str, name: str) -> schema.Spec:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return schema.Spec.model_validate({
        "study": {"name": name, "direction": "minimize", "metric": "score", "n_trials": 10**6,
                  "storage": url, "sampler": {"type": "random", "seed": 0}},
        "trainer": {"script": "train.py"},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0},
                   "y": {"type": "int", "low": 1, "high": 64, "log": True}},
    })


def driver(url: str, name: str, budget: int, index: int, out: multiprocessing.Queue) -> None:
    spec = spec_for(url, name)
    store = connect(spec, Owner(f"bench{index}", os.getpid(), 0), 60)
    done, per_trial = 0, []
    cpu = time.process_time()
    while True:
        t0 = time.perf_counter()
        with store.budget_lock():
            counts = store.counts()
            if counts.finished + counts.running >= budget:
                break
            asked = store.ask(spec.searched, gpu=index, trial_dir=lambda n: f"/t/{n}")
        verdict = Outcome(TrialState.COMPLETE, [asked.params["x"]], exit_code=0,
                          extras={"loss": 1.0})
        store.tell_verdict(asked.trial, verdict, index, 0, {"gpu_util_mean": 50.0})
        per_trial.append(time.perf_counter() - t0)
        done += 1
    out.put((done, per_trial, time.process_time() - cpu))


def measure(url: str, name: str, trials: int, drivers: int,
            ) -> tuple[float, float, float, int]:
    """(wall ms per trial, median ms per trial in a driver, the drivers' own CPU ms per
    trial, trials finished)."""
    spec = spec_for(url, name)
    open_study(spec, open_storage(spec))  # created once, before the clock starts
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=driver, args=(url, name, trials, i, out))
             for i in range(drivers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    finished = sum(n for n, _, _ in results)
    per_trial = [s for _, times, _ in results for s in times]
    cpu = sum(c for _, _, c in results)
    return (1000 * wall / finished, 1000 * statistics.median(per_trial),
            1000 * cpu / finished, finished)


@contextlib.contextmanager
def storage_proxy(behind: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "storage-proxy", "--host", "127.0.0.1", "--port", "0",
         "--storage", behind], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline() if proc.stdout else ""
    port = re.search(r" on 127\.0\.0\.1:(\d+)", line)
    if not port:
        proc.kill()
        raise RuntimeError(f"the proxy did not start: {line!r}")
    try:
        yield f"grpc://127.0.0.1:{port.group(1)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--drivers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--kinds", nargs="+", default=["sqlite", "postgresql", "proxy",
                                                        "journal"])
    args = parser.parse_args()
    rows = []
    proxy_url = ""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        needs_pg = {"postgresql", "proxy"} & set(args.kinds)
        pg = stack.enter_context(throwaway_postgres()) if needs_pg else ""
        for kind in args.kinds:
            for n in args.drivers:
                name = f"{kind}-{n}"
                if kind == "sqlite":
                    url = f"sqlite:///{tmp}/{name}.db"
                elif kind == "journal":
                    url = f"journal:///{tmp}/{name}.log"
                elif kind == "postgresql":
                    url = pg
                else:
                    proxy_url = proxy_url or stack.enter_context(storage_proxy(pg))
                    url = proxy_url
                wall, median, cpu, finished = measure(url, name, args.trials, n)
                rows.append((kind, n, wall, median, cpu, finished))
                print(f"{kind:10s} drivers={n}  wall/trial {wall:7.1f} ms  "
                      f"driver median/trial {median:7.1f} ms  CPU/trial {cpu:6.1f} ms  "
                      f"finished {finished}", flush=True)
    print()
    print(f"| storage | drivers | wall ms per trial | a driver's median ms per trial | "
          f"drivers' CPU ms per trial | finished (of {args.trials}) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, n, wall, median, cpu, finished in rows:
        print(f"| {kind} | {n} | {wall:.1f} | {median:.1f} | {cpu:.1f} | {finished} |")


if __name__ == "__main__":
    main()
