"""The hand-off on a device: from the driver hearing that a trial's command exited to its
spawn of the next trial on that device, and where that time goes.

`sweep run` runs in a child process with timing hooks (RUN below, which wraps the driver's
methods and changes nothing else): N trials of a trainer that sleeps --seconds, writes its
result and exits, on K simulated devices, SQLite or a journal file, for each launcher.
Reported, median and p95 over every hand-off (two trials in a row on one device):
- exit -> spawn: the guard's `exit` report reaches the driver, to the next trial's spawn on
  that device (its folder written, the fork or the interpreter started): the issue's path,
  "the tell, one lease, one spawn", with the ask of the next trial and the wait for the
  guard to see the whole tree gone;
- its parts: the tell (the judge of the trial, its storage writes); release -> ask (from the
  device's release to the next ask: the loop, the budget lock, the count under it); the ask
  (`Store.ask`: the trial's creation, its heartbeat, run id, owner and params); files (from
  the starter's start to the spawn: the lineage's lock, the trial's folder and files, its
  plan); the spawn (the fork or the interpreter started). A checkout without the methods
  timed shows nan.

Usage: python benchmarks/handoff.py [--trials 40] [--gpus 1 4] [--launchers warm python]
                                    [--storage sqlite journal] [--seconds 0.3] [--rounds 2]
                                    [--repo ../old]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = """
import json, os, sys, time
time.sleep(float(sys.argv[sys.argv.index("--seconds") + 1]))
with open(os.environ["SWEEP_RESULT_FILE"], "w") as f:
    json.dump({"score": 0.5}, f)
"""
RUN = """
import json, sys, time
from sweep import cli
try:  # the packages (issue 30; sweep.launch since issue 39); an older checkout: flat modules
    from sweep.runner import driver
    from sweep.study import store
    from sweep.trial import process
    try:
        from sweep.launch._accelerate import BaseLauncher
        from sweep.launch._warm import WarmLauncher
        spawners = (BaseLauncher, WarmLauncher)
    except ImportError:
        from sweep.trial import launchers
        spawners = (launchers.BaseLauncher, launchers.WarmLauncher)
except ImportError:
    from sweep import driver, process, store
    try:
        from sweep import launchers
        spawners = (launchers.BaseLauncher, launchers.WarmLauncher)
    except ImportError:
        spawners = ()
marks = []

def timed(cls, name, kind, number):
    inner = getattr(cls, name)
    def wrapper(self, *a, **k):
        began = time.monotonic()
        result = inner(self, *a, **k)
        marks.append((kind, number(self, a, result), began, time.monotonic()))
        return result
    setattr(cls, name, wrapper)

timed(driver.Driver, "_judge", "tell", lambda self, a, r: a[0].number)
timed(store.Store, "ask", "ask", lambda self, a, r: r.number)
if hasattr(driver.Driver, "_end"):  # the device's release (its last call, once it is clear)
    timed(driver.Driver, "_end", "end", lambda self, a, r: a[0].number)
try:  # the trial's files and plan, before its spawn (issue 30's starter)
    from sweep.runner.starter import Starter
    timed(Starter, "start", "start", lambda self, a, r: a[0].number)
except ImportError:
    pass
if spawners:  # the launchers' spawn (warm's is its own); older: the driver's
    for launcher in spawners:
        timed(launcher, "spawn", "spawn", lambda self, a, r: int(a[0].paths.dir.name))
else:
    timed(driver.Driver, "_spawn", "spawn", lambda self, a, r: int(a[0].paths.dir.name))
init = process.TrialProcess.__init__

def heard(self, plan, grace, on_change=lambda: None, hold=(), server=None):
    number, told = int(plan.paths.dir.name), []
    def changed():
        if not told:  # the first call: the command exited
            told.append(1)
            marks.append(("exit", number, time.monotonic(), time.monotonic()))
        on_change()
    init(self, plan, grace, changed, hold=hold, server=server)

process.TrialProcess.__init__ = heard
started = driver.Driver._start_one

def owned(self):  # trial number -> device: the driver's records (issue 39), or its dict
    if hasattr(self, "trials"):
        return {n: self.trials.record(n).lease.device for n in self.trials.numbers()
                if self.trials.record(n).lease is not None}
    return {n: run.device for n, run in self.running.items()}

def start_one(self, *args):  # (a lease) since 2026-12-01's pool
    before = set(owned(self))
    started(self, *args)
    now = owned(self)
    for number in set(now) - before:
        marks.append(("device", number, float(now[number]), 0.0))

driver.Driver._start_one = start_one
code = cli.main(["run", sys.argv[1]])
print("MARKS " + json.dumps(marks))
sys.exit(code)
"""


def run_one(work: Path, launcher: str, gpus: int, storage: str,
            args: argparse.Namespace, repo: Path = ROOT) -> list[dict[str, float]]:
    """One `sweep run` of the checkout `repo` (importing its own modules: its folder is the
    run's cwd and only PYTHONPATH); a dict of times (s) per hand-off."""
    import yaml

    work.mkdir(parents=True)
    (work / "trainer.py").write_text(TRAINER)
    url = (f"sqlite:///{work / 'h.db'}" if storage == "sqlite"
           else f"journal:///{work / 'h.log'}")
    study = work / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": {"name": "h", "direction": "minimize", "metric": "score",
                  "n_trials": args.trials, "storage": url,
                  "sampler": {"type": "random", "seed": 0}},
        "trainer": {"script": str(work / "trainer.py"), "launcher": launcher,
                    "args": ["--seconds", str(args.seconds)]},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }))
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(study)], capture_output=True, text=True, cwd=repo,
        env={**os.environ, "SWEEP_FAKE_GPUS": str(gpus), "SWEEP_LOCK_DIR": str(work / "locks"),
             "PYTHONPATH": str(repo)})  # its own modules, whatever this process was given
    line = [x for x in done.stdout.splitlines() if x.startswith("MARKS ")]
    if done.returncode != 0 or not line:
        raise RuntimeError(f"sweep run failed: {done.stderr[-800:]}")
    marks: dict[str, dict[int, tuple[float, float]]] = {}
    for kind, number, began, ended in json.loads(line[0].removeprefix("MARKS ")):
        marks.setdefault(kind, {})[number] = (began, ended)
    by_device: dict[int, list[int]] = {}
    for number, (device, _) in marks["device"].items():
        by_device.setdefault(int(device), []).append(number)
    rows = []
    for numbers in by_device.values():
        numbers.sort(key=lambda n: marks["spawn"][n][0])
        for a, b in itertools.pairwise(numbers):
            exited, spawned = marks["exit"][a][0], marks["spawn"][b]
            tell, ask = marks["tell"][a], marks["ask"][b]
            row = {"handoff": spawned[0] - exited, "tell": tell[1] - tell[0],
                   "ask": ask[1] - ask[0], "spawn": spawned[1] - spawned[0],
                   "through": spawned[1] - exited}
            if a in marks.get("end", {}):  # release -> ask: the loop, the lock, the count
                row["to_ask"] = ask[0] - marks["end"][a][1]
            if b in marks.get("start", {}):
                row["files"] = spawned[0] - marks["start"][b][0]
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--launchers", nargs="+", default=["warm", "python"])
    parser.add_argument("--storage", nargs="+", default=["sqlite", "journal"])
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="another checkout to measure beside this one, round by round")
    args = parser.parse_args()
    repos = [ROOT, *(r.resolve() for r in args.repo)]
    print("| checkout | launcher | storage | devices | hand-offs | exit -> spawn, median / p95 ms "
          "| tell ms | release -> ask ms | ask ms | files ms | spawn ms "
          "| exit -> spawned, median ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for launcher in args.launchers:
            for storage in args.storage:
                for gpus in args.gpus:
                    rows: dict[Path, list[dict[str, float]]] = {r: [] for r in repos}
                    for r in range(args.rounds):  # interleaved: a busy spell hits all alike
                        for i, repo in enumerate(repos):
                            rows[repo] += run_one(
                                Path(tmp) / f"{launcher}-{storage}-{gpus}-{r}-{i}", launcher,
                                gpus, storage, args, repo)
                    for repo in repos:
                        print(f"| {repo.name} | {launcher} | {storage} | {gpus} | "
                              f"{table_row(rows[repo])} |", flush=True)


def table_row(rows: list[dict[str, float]]) -> str:
    def ms(key: str, q: float = 0.5) -> float:
        values = sorted(x[key] for x in rows if key in x)
        if not values:  # an older checkout without the method timed
            return math.nan
        if q == 0.5:
            return 1000 * statistics.median(values)
        return 1000 * values[int(q * (len(values) - 1))]

    return (f"{len(rows)} | {ms('handoff'):.1f} / {ms('handoff', 0.95):.1f} | {ms('tell'):.1f} "
            f"| {ms('to_ask'):.1f} | {ms('ask'):.1f} | {ms('files'):.1f} | {ms('spawn'):.1f} "
            f"| {ms('through'):.1f}")


if __name__ == "__main__":
    main()
