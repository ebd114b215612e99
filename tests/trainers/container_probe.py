"""A stdlib-only test trainer for trials in a container image (the test image has neither
torch nor sweep): it proves where it ran and checkpoints in $SWEEP_CHECKPOINT_DIR.

It writes `{"score": (x - 0.3) ** 2, "os_release": ..., "executable": ..., "marker": ...,
"cuda_visible": ..., "steps": [first, last]}` to $SWEEP_RESULT_FILE. `marker` is true when
/etc/sweep-test-image exists (only the test image has it). Each step sleeps `--sleep` s and
writes `state.json` (the next step) in the checkpoint folder, and appends
`<trial> <first step> <hostname>` to `starts.log` there as it starts. On SIGTERM it stops after
the current step with its checkpoint written and exits 0 with no result.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

STOP = False


def _stop(*_: object) -> None:
    global STOP
    STOP = True


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    args, _ = p.parse_known_args()
    folder = Path(os.environ["SWEEP_CHECKPOINT_DIR"])
    state = folder / "state.json"
    first = json.loads(state.read_text())["next"] if state.exists() else 0
    with open(folder / "starts.log", "a") as f:
        f.write(f"{os.environ['SWEEP_TRIAL_NUMBER']} {first} {socket.gethostname()}\n")
    step = first
    while step < args.steps:
        time.sleep(args.sleep)
        step += 1
        tmp = folder / "state.json.tmp"
        tmp.write_text(json.dumps({"next": step}))
        os.replace(tmp, state)
        if STOP:
            return 0
    try:
        release = Path("/etc/os-release").read_text().splitlines()[0]
    except OSError:
        release = None
    result = {"score": (args.x - 0.3) ** 2, "os_release": release,
              "executable": sys.executable, "marker": Path("/etc/sweep-test-image").exists(),
              "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "secret": os.environ.get("MY_API_TOKEN"), "steps": [first, step]}
    with open(os.environ["SWEEP_RESULT_FILE"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
