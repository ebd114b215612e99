"""sweep against the alternatives, side by side in one invocation, on a simulated pool.

N trials of benchmarks/bench_trainer.py (torch + accelerate imported, an Accelerator built,
then --seconds of "work") on K simulated devices, each way in turn, for several rounds:

- sweep with each launcher: `accelerate` (the default: `accelerate launch` as a new process
  per trial, the command a user would type), `direct` (one interpreter with the variables
  accelerate would set), `warm` (forks of a server that imported torch and accelerate),
  `python`;
- by hand: one loop per device of `CUDA_VISIBLE_DEVICES=i accelerate launch ... trainer`, as
  the accelerate articles do it (`xargs -P` with a device per slot);
- Optuna's multi-GPU recipe: one `study.optimize` process per device on one SQLite study, its
  objective running `accelerate launch` on that device.

Printed, medians over the rounds: makespan and its ratio to the hand-made way; the share of
device-time the trainers spent working (N x seconds / (makespan x K)); the hand-off on a
device (one trainer's end to the next trainer's first line: launcher start-up included); the
first trainer line after the start (start-up of the driver and of one trial); a trial's
start-up (sweep writes its command.sh, then spawns it, to the trainer's first line). Then the
driver's CPU per trial at 100 and 10,000 trials in the study (`driver_cpu.py`).

Usage: python benchmarks/compare.py [--trials 12] [--gpus 4] [--seconds 3] [--rounds 3]
                                    [--ways sweep-accelerate sweep-direct ...] [--cpu-at 100 10000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ROOT / "benchmarks" / "bench_trainer.py"
WAYS = ["sweep-accelerate", "sweep-direct", "sweep-warm", "sweep-python", "by-hand",
        "optuna-recipe"]
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def sweep_way(launcher: str, work: Path, args: argparse.Namespace) -> None:
    import yaml

    study = work / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": {"name": "bench", "direction": "minimize", "metric": "score",
                  "n_trials": args.trials, "sampler": {"type": "random", "seed": 0}},
        "trainer": {"script": str(TRAINER), "launcher": launcher,
                    "args": ["--seconds", str(args.seconds)]},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }))
    done = subprocess.run([sys.executable, "-m", "sweep", "run", str(study)],
                          env={**os.environ, "SWEEP_FAKE_GPUS": str(args.gpus),
                               "SWEEP_LOCK_DIR": str(work / "locks")}, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"sweep, launcher {launcher}: exit {done.returncode}\n{done.stderr[-3000:]}")


def by_hand(work: Path, args: argparse.Namespace) -> None:
    todo = list(range(args.trials))
    lock = threading.Lock()

    def device_loop(gpu: int) -> None:
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop(0)
            subprocess.run([*LAUNCH, "--gpu_ids", str(gpu), str(TRAINER), "--x", str(n / 20),
                            "--seconds", str(args.seconds), "--out", str(work / f"{n}.json")],
                           check=True, capture_output=True,
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)})

    threads = [threading.Thread(target=device_loop, args=(g,)) for g in range(args.gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


RECIPE = """
import json, os, subprocess, sys
import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState
storage, gpu, trials, seconds, trainer, launch = sys.argv[1:7]
launch = json.loads(launch)
def objective(trial):
    x = trial.suggest_float("x", 0.0, 1.0)
    out = f"{os.environ['BENCH_RECORDS']}/../{trial.number}.out"
    subprocess.run([*launch, "--gpu_ids", gpu, trainer, "--x", str(x), "--seconds", seconds,
                    "--out", out], check=True, capture_output=True,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
    return json.load(open(out))["score"]
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="bench", storage=storage)
study.optimize(objective, callbacks=[MaxTrialsCallback(int(trials),
               states=(TrialState.COMPLETE, TrialState.RUNNING))])
"""


def optuna_recipe(work: Path, args: argparse.Namespace) -> None:
    import optuna

    storage = f"sqlite:///{work / 'recipe.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="bench", storage=storage)
    workers = [subprocess.Popen([sys.executable, "-c", RECIPE, storage, str(g), str(args.trials),
                                 str(args.seconds), str(TRAINER), json.dumps(LAUNCH)])
               for g in range(args.gpus)]
    for w in workers:
        if w.wait() != 0:
            raise RuntimeError("a recipe worker failed")


def one_round(way: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        records = work / "records"
        records.mkdir()
        os.environ["BENCH_RECORDS"] = str(records)
        t0 = time.time()
        if way.startswith("sweep-"):
            sweep_way(way.removeprefix("sweep-"), work, args)
        elif way == "by-hand":
            by_hand(work, args)
        else:
            optuna_recipe(work, args)
        makespan = time.time() - t0
        rows = [json.loads(p.read_text()) for p in records.glob("*.json")]
        # sweep writes a trial's command.sh just before it spawns the trial
        spawned = {int(p.parent.name): p.stat().st_mtime
                   for p in work.glob("bench/trials/*/command.sh")}
    gaps = []
    for cvd in {r["cvd"] for r in rows}:
        mine = sorted((r for r in rows if r["cvd"] == cvd), key=lambda r: r["first"])
        gaps += [b["first"] - a["end"] for a, b in itertools.pairwise(mine)]
    return {
        "makespan": makespan, "trials": len(rows),
        "share": args.trials * args.seconds / (makespan * args.gpus),
        "gap": statistics.median(gaps) if gaps else float("nan"),
        "gap_p95": sorted(gaps)[int(0.95 * (len(gaps) - 1))] if gaps else float("nan"),
        "first": min(r["first"] for r in rows) - t0,
        "imports": statistics.median(r["ready"] - r["first"] for r in rows),
        "startup": statistics.median(r["first"] - spawned[r["trial"]] for r in rows)
        if spawned and all(r.get("trial") in spawned for r in rows) else float("nan"),
        "to_spawn": min(spawned.values()) - t0 if spawned else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ways", nargs="+", default=WAYS, choices=WAYS)
    parser.add_argument("--cpu-at", type=int, nargs="*", default=[100, 10_000],
                        help="driver CPU per trial with this many trials in the study "
                             "(none: skip; 10,000 takes a few minutes)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    results: dict[str, list[dict[str, float]]] = {w: [] for w in args.ways}
    for r in range(args.rounds):
        for way in args.ways:  # interleaved: a busy spell hits every way alike
            results[way].append(one_round(way, args))
            got = results[way][-1]
            print(f"round {r + 1} {way:20s} {got['makespan']:6.1f} s "
                  f"({got['trials']:.0f} trials)", flush=True)

    def med(way: str, key: str) -> float:
        return statistics.median(x[key] for x in results[way])

    base = med("by-hand", "makespan") if "by-hand" in results else float("nan")
    print(f"\n{args.trials} trials x {args.seconds:g} s on {args.gpus} simulated devices, "
          f"medians of {args.rounds} rounds\n")
    print("| way | makespan s | ratio to by hand | work share of device-time | hand-off: "
          "end to next first line, median / p95 ms | driver start to first spawn s | "
          "first trainer line after start s | trial start-up: spawn to first line, median ms "
          "| trainer imports + Accelerator s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for way in args.ways:
        print(f"| {way} | {med(way, 'makespan'):.1f} | {med(way, 'makespan') / base:.2f} | "
              f"{100 * med(way, 'share'):.0f} % | {1000 * med(way, 'gap'):.0f} / "
              f"{1000 * med(way, 'gap_p95'):.0f} | {med(way, 'to_spawn'):.2f} | "
              f"{med(way, 'first'):.2f} | {1000 * med(way, 'startup'):.0f} | "
              f"{med(way, 'imports'):.2f} |")
    if args.cpu_at:
        from benchmarks import driver_cpu

        print("\ndriver CPU per trial (benchmarks/driver_cpu.py: random sampler, 8 simulated "
              "devices, SQLite):")
        cpu = driver_cpu.measure(args.cpu_at)
        for k, per in cpu.items():
            print(f"  with {k} trials in the study: {per * 1000:.1f} ms")


if __name__ == "__main__":
    main()
