"""The driver's CPU to follow one trial's guard to its end: read its `exit` line and its end
of file, then reap it (what `process.TrialProcess` does in its reader thread, launcher
python), as the driver meets it: eight guards at a time, each running a python trainer.

A guard that had read /proc/self/task/*/children (to see whether the command left anything
behind) cost the process that reaped it about 2 ms more CPU, in the kernel's pruning of that
guard's /proc entries; `--repo` measures another checkout's guard in the same rounds.

Usage: python benchmarks/guard_reap.py [--guards 64] [--rounds 3] [--repo ../old]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AT_ONCE = 8


def follow(guard: Path, trainer: Path) -> float:
    """CPU seconds of the thread that follows one guard: its status pipe to the end, then
    the guard's exit status."""
    control_r, control_w = os.pipe()
    status_r, status_w = os.pipe()
    # guards since 2026-12-01 take a TRAINER argument ("-": the command is the trainer)
    trainer_arg = ["-"] if "TRAINER" in guard.read_text() else []
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(guard), str(control_r), str(status_w), "5",
         *trainer_arg, "--", sys.executable, str(trainer)],
        stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(control_r, status_w))
    os.close(control_r)
    os.close(status_w)
    began = time.thread_time()
    with os.fdopen(status_r, "rb", buffering=0) as status:
        for _ in status:
            pass
    proc.wait()
    spent = time.thread_time() - began
    os.close(control_w)
    return spent


def measure(guard: Path, trainer: Path, n: int) -> float:
    """Median CPU ms per guard followed, `AT_ONCE` guards at a time."""
    spent: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        cpu = follow(guard, trainer)
        with lock:
            spent.append(cpu)

    for _ in range(0, n, AT_ONCE):
        threads = [threading.Thread(target=one) for _ in range(AT_ONCE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return statistics.median(spent) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guards", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, action="append", default=[])
    args = parser.parse_args()
    repos = [ROOT, *(r.resolve() for r in args.repo)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Path(tmp) / "trainer.py"
        trainer.write_text("import json, os\n")
        per: dict[Path, list[float]] = {r: [] for r in repos}
        for r in range(args.rounds):
            for repo in repos:
                per[repo].append(measure(repo / "sweep" / "guard.py", trainer, args.guards))
                print(f"round {r + 1}, {repo}: {per[repo][-1]:.3f} ms per guard", flush=True)
    for repo in repos:
        print(f"{repo}: median {statistics.median(per[repo]):.3f} ms of CPU per guard followed")


if __name__ == "__main__":
    main()
