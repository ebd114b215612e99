"""What `sweep report` costs on a large study, against `sweep summary` on the same study (issue 24).

A study of `--trials` trials on 8 devices (COMPLETE, PRUNED with intermediate values, FAIL with
reasons; GPU samples every 10 s) is written once through Optuna's public API
(`sweep.testing.studies`), in a journal file and in SQLite. Then, in interleaved rounds, each a
fresh process: `python -m sweep summary STUDY --csv ...` (the baseline: the same storage read,
the same samples, a CSV) and `python -m sweep report STUDY -o ...`. Reported: the median wall
time of each, their ratio, and the report's size.

Usage: python benchmarks/report_cost.py [--trials 10000] [--rounds 3] [--storage journal sqlite]
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

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", *argv], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", nargs="+", default=["journal", "sqlite"],
                        choices=["journal", "sqlite"])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from sweep.testing.studies import stored_study

    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.storage:
            folder = Path(tmp) / kind
            folder.mkdir()
            url = None if kind == "journal" else f"sqlite:///{folder / 'study.db'}"
            start = time.perf_counter()
            study = stored_study(folder, "finished", n=args.trials, gpus=8, storage=url)
            made = time.perf_counter() - start
            summary, report = [], []
            for _ in range(args.rounds):
                summary.append(timed(["summary", str(study), "--csv", str(folder / "s.csv")]))
                report.append(timed(["report", str(study), "-o", str(folder / "r.html")]))
            s, r = statistics.median(summary), statistics.median(report)
            size = (folder / "r.html").stat().st_size / 1e6
            print(f"{kind}: {args.trials} trials (written in {made:.1f} s); median of "
                  f"{args.rounds}: summary {s:.2f} s, report {r:.2f} s, ratio {r / s:.2f}; "
                  f"report {size:.1f} MB")


if __name__ == "__main__":
    main()
