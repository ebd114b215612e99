"""Driver CPU while a stubborn trainer sits in its grace period.

One trial ignores SIGTERM; `trainer.timeout` stops it after 1 s and `trainer.stop_grace` gives
it 8 s before SIGKILL. The driver's own CPU time (not its children's) is read when the grace
period starts and when it ends, and printed as a share of one core. `--repo DIR` runs another
checkout's sweep the same way, side by side (e.g. a worktree of an older commit):

    python benchmarks/grace_cpu.py [--repo ../old] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

HERE = Path(__file__).resolve().parent.parent
PROBE = HERE / "tests" / "trainers" / "probe.py"
TIMEOUT, GRACE = 1.0, 8.0


def one_round(repo: Path) -> float:
    """The driver's CPU share of one core over the grace period."""
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "study.yaml"
        study.write_text(yaml.safe_dump({
            "study": {"name": "grace", "direction": "minimize", "metric": "score",
                      "n_trials": 1, "max_consecutive_failures": 1},
            "trainer": {"script": str(PROBE), "launcher": "python", "args": ["--mode", "stubborn"],
                        "timeout": TIMEOUT, "grace_period": GRACE},
            "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        }))
        env = {**os.environ, "SWEEP_FAKE_GPUS": "1", "PYTHONPATH": f"{repo}:{HERE / 'tests'}"}
        driver = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(study)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        proc = psutil.Process(driver.pid)
        start_file = Path(tmp) / "grace" / "trials" / "0" / "probe_start.json"
        while not start_file.exists():
            time.sleep(0.01)
        time.sleep(TIMEOUT + 0.5)  # the timeout has fired: the grace period runs
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(GRACE - 1.5)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        driver.wait(timeout=60)
        return (cpu1 - cpu0) / (t1 - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, action="append", default=[],
                   help="another checkout to measure beside this one")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"driver CPU during a {GRACE:g} s grace period, median of {args.rounds} rounds")
    for repo in [HERE, *args.repo]:
        shares = [one_round(repo.resolve()) for _ in range(args.rounds)]
        print(f"{repo!s:40s} {100 * statistics.median(shares):6.2f}% of one core "
              f"(rounds: {', '.join(f'{100 * s:.2f}%' for s in shares)})")


if __name__ == "__main__":
    main()
