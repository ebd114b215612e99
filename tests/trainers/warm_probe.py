"""Records what a trial's process looks like from inside (for `launcher: warm` against a
fresh interpreter), then behaves as --mode says: ok, exit3, raise, interrupt, term, numpy."""

import time

FIRST = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--mode", default="ok")
    args = p.parse_args()
    record = {
        "first": FIRST, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
        "ppid": os.getppid(), "argv": sys.argv, "name": __name__, "path0": sys.path[0],
        "cwd": os.getcwd(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "random": random.random(), "stdin": sys.stdin.read(),
        "torch_loaded_at_start": "torch" in sys.modules,
    }
    if args.mode == "numpy":
        import numpy

        record["numpy"] = float(numpy.random.random())
    print(f"stdout of trial {os.environ['SWEEP_TRIAL_NUMBER']}")
    print(f"stderr of trial {os.environ['SWEEP_TRIAL_NUMBER']}", file=sys.stderr)
    Path(os.environ["SWEEP_TRIAL_DIR"], "probe.json").write_text(json.dumps(record))
    Path(os.environ["SWEEP_RESULT_FILE"]).write_text(json.dumps({"score": args.x}))
    if args.mode == "exit3":
        return 3
    if args.mode == "raise":
        raise RuntimeError("the trainer broke")
    if args.mode == "interrupt":
        raise KeyboardInterrupt
    if args.mode == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
