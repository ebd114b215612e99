"""What the driver costs, as ratios against a baseline run side by side.

1. Scheduling: N trials of a trivial trainer on K simulated GPUs through `sweep run` (plain
   python launcher, then warm), against a baseline of the same N processes started by hand K
   at a time. Reports the wall-time ratio and the hand-off on a device: from one trainer's
   last line to the next trainer's first line (median, p95, max).
2. Monitor: CPU time of one sample of 8 devices (fake NVML with processes), as a share of a
   core at the default 1 s interval.
3. Start-up: the modules the driver imports (no torch, no accelerate).

Usage: python benchmarks/overhead.py [--trials 24] [--gpus 4] [--sleep 1.0]
                                     [--launchers python warm]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "trainers" / "probe.py"


def sweep_run(tmp: Path, trials: int, gpus: int, sleep: float,
              launcher: str = "python") -> tuple[float, list[float]]:
    study = tmp / "bench.yaml"
    shutil.rmtree(tmp / "bench", ignore_errors=True)
    for old in tmp.glob("bench.db*"):
        old.unlink()
    study.write_text(yaml.safe_dump({
        "study": {"name": "bench", "direction": "minimize", "metric": "score",
                  "n_trials": trials, "sampler": {"type": "random", "seed": 0}},
        "trainer": {"script": str(PROBE), "launcher": launcher,
                    "args": ["--sleep", str(sleep)]},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", "run", str(study)], check=True,
                   env={"SWEEP_FAKE_GPUS": str(gpus), "PATH": "/usr/bin:/bin"},
                   capture_output=True)
    wall = time.perf_counter() - t0
    records = [json.loads(p.read_text()) for p in (tmp / "bench" / "trials").glob("*/probe.json")]
    gaps = []
    for device in {r["cvd"] for r in records}:
        mine = sorted((r for r in records if r["cvd"] == device), key=lambda r: r["start"])
        gaps += [b["start"] - a["end"] for a, b in itertools.pairwise(mine)]
    return wall, gaps


def baseline_run(tmp: Path, trials: int, gpus: int, sleep: float) -> float:
    def one(i: int) -> None:
        d = tmp / "base" / str(i)
        d.mkdir(parents=True)
        env = {"SWEEP_TRIAL_DIR": str(d), "SWEEP_PARAMS_FILE": str(d / "p.json"),
               "SWEEP_RESULT_FILE": str(d / "r.json"), "CUDA_VISIBLE_DEVICES": str(i % gpus),
               "PATH": "/usr/bin:/bin"}
        (d / "p.json").write_text("{}")
        subprocess.run([sys.executable, str(PROBE), "--sleep", str(sleep), "--x", "0.5"],
                       env=env, check=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(gpus) as pool:
        list(pool.map(one, range(trials)))
    return time.perf_counter() - t0


def monitor_cost(samples: int = 300) -> float:
    """CPU seconds of one sample of 8 fake devices, each held by a trial."""
    import pytest

    from sweep.gpus.monitor import Monitor
    from sweep.gpus.nvml import Nvml
    from sweep.gpus.pool import Pool, fake_devices
    from sweep.testing import fake_pynvml
    from sweep.testing.fakes import lease

    class Pids:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def tree_pids(self) -> set[int]:
            return {self.pid}

    mp = pytest.MonkeyPatch()
    gpus = [fake_pynvml.FakeGpu(util_gpu=50, processes=[(10 + i, 2**30)]) for i in range(8)]
    fake_pynvml.install(mp, gpus)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pool = Pool(fake_devices("8"))
            m = Monitor(Nvml(), pool, Path(tmp) / "s.csv")
            m.create_csv()
            for i in range(8):
                lease(pool, i, Pids(10 + i))
                m.trial_started(i, i)
            t0 = time.thread_time()
            for _ in range(samples):
                m.sample_once()
            return (time.thread_time() - t0) / samples
    finally:
        mp.undo()


def driver_imports() -> list[str]:
    code = ("import sys, sweep.cli, sweep.runner.driver, sweep.gpus.monitor, "
            "sweep.runner.progress, sweep.gpus.pool\n"
            "print([m for m in ('torch', 'accelerate', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.replace("'", '"'))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--sleep", type=float, default=1.0)
    p.add_argument("--launchers", nargs="+", default=["python", "warm"],
                   choices=["python", "direct", "warm"])
    a = p.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_run(Path(tmp), a.trials, a.gpus, a.sleep)
        for launcher in a.launchers:
            runs[launcher] = sweep_run(Path(tmp), a.trials, a.gpus, a.sleep, launcher)
    ideal = a.trials / a.gpus * a.sleep
    print(f"{a.trials} trials x {a.sleep} s on {a.gpus} simulated GPUs (ideal {ideal:.1f} s)")
    print(f"  baseline (python by hand, {a.gpus} at a time): {base:.2f} s")
    for launcher, (wall, gaps) in runs.items():
        print(f"  sweep run, launcher {launcher} (study creation included): {wall:.2f} s, "
              f"ratio {wall / base:.2f}")
        if gaps:
            gaps.sort()
            p95 = gaps[int(0.95 * (len(gaps) - 1))]
            print(f"    hand-off on a device, the trainer's last line to the next one's first: "
                  f"median {statistics.median(gaps) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
                  f"max {gaps[-1] * 1000:.0f} ms")
    cost = monitor_cost()
    print(f"monitor: {cost * 1000:.2f} ms CPU per sample of 8 devices = "
          f"{cost * 100:.2f}% of a core at 1 s interval")
    print(f"driver imports of torch/accelerate/pandas: {driver_imports()}")


if __name__ == "__main__":
    main()
