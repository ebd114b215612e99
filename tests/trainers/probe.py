"""A test trainer without torch: records where and when it ran, then behaves as --mode says.

Modes: ok, crash, hang, stubborn (ignores SIGTERM), oom, nan, badjson, noresult,
report (reports each step; stops gracefully on SIGTERM), spawn (leaves a grandchild in its own
session and hangs), detach (leaves such a grandchild and exits 0 with its result), oomcaught
(prints a CUDA out-of-memory line, then succeeds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sweep.protocol import report, should_stop, write_result


def first_to_claim(path: str, text: str = "failed once") -> bool:
    """Create `path` unless it exists; True for the one trial that created it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--y", type=float, default=0.0)
    p.add_argument("--mode", default="ok")
    p.add_argument("--sleep", type=float, default=0.3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fail_first", default="", help="crash once: when this file is absent")
    p.add_argument("--fault_once", default="", help="--mode only when this file is absent")
    args, _ = p.parse_known_args()
    trial_dir = Path(os.environ["SWEEP_TRIAL_DIR"])
    record = {
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
        "start": time.time(), "pid": os.getpid(), "argv": sys.argv[1:],
        "params": json.loads(Path(os.environ["SWEEP_PARAMS_FILE"]).read_text()),
    }
    (trial_dir / "probe_start.json").write_text(json.dumps(record))
    mode = args.mode
    if args.fail_first and first_to_claim(args.fail_first):
        mode = "crash"
    if args.fault_once and not first_to_claim(args.fault_once, mode):
        mode = "ok"
    score = (args.x - 0.3) ** 2 + args.y
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("spawn", "detach"):
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", str(trial_dir)],
            start_new_session=True,
        )
    if mode in ("hang", "stubborn", "spawn"):
        time.sleep(600)
    if mode == "report":
        should_stop()  # SIGTERM (pruned) now ends the loop: "save a checkpoint" and exit
        for step in range(args.steps):
            report(step, score * (step + 1))
            time.sleep(args.sleep)
            if should_stop():
                (trial_dir / "stopped_gracefully").write_text(str(step))
                return 0
    else:
        time.sleep(args.sleep)
    record["end"] = time.time()
    (trial_dir / "probe.json").write_text(json.dumps(record))
    if mode == "crash":
        print("Traceback (most recent call last):\nValueError: boom", file=sys.stderr)
        return 3
    if mode == "oomcaught":
        print("CUDA out of memory. Tried to allocate 2.00 GiB; retrying with batch 16",
              file=sys.stderr)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
              file=sys.stderr)
        return 1
    if mode == "nan":
        write_result({"score": float("nan")})
    elif mode == "badjson":
        Path(os.environ["SWEEP_RESULT_FILE"]).write_text("{oops")
    elif mode == "noresult":
        pass
    else:
        write_result({"score": score, "size": args.x * 10, "label": "not a number"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
