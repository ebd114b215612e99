"""The trainer of the stored old studies: its `fate` param decides what the trial does.

complete: two steps, then the result `score = (x - 0.3) ** 2`; fail: exits 1 with no result;
prune: reports 10.0 each step until the pruner (threshold upper 5) stops it; long: 24 steps of
0.2 s, checkpointing the next step in `$SWEEP_CHECKPOINT_DIR/state.json` (when the sweep that
runs it gives that folder) and resuming from it; on SIGTERM (`should_stop`) it stops after the
step it is in. Each start is logged to `starts.log` there (`<trial number> <first step>`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sweep.protocol import report, should_stop, write_result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, required=True)
    p.add_argument("--fate", required=True)
    args, _ = p.parse_known_args()
    if args.fate == "fail":
        print("failing on purpose", file=sys.stderr)
        return 1
    folder = Path(os.environ.get("SWEEP_CHECKPOINT_DIR") or os.environ["SWEEP_TRIAL_DIR"])
    state = folder / "state.json"
    step = json.loads(state.read_text())["next"] if state.exists() else 0
    with open(folder / "starts.log", "a") as f:
        f.write(f"{os.environ['SWEEP_TRIAL_NUMBER']} {step}\n")
    should_stop()  # SIGTERM from now on ends the loop after the step it is in
    steps = {"complete": 2, "prune": 1000, "long": 24}[args.fate]
    while step < steps:
        time.sleep(0.2 if args.fate != "complete" else 0.0)
        report(step, 10.0 if args.fate == "prune" else (args.x - 0.3) ** 2 + 1.0 / (step + 1))
        step += 1
        tmp = folder / "state.json.tmp"
        tmp.write_text(json.dumps({"next": step}))
        os.replace(tmp, state)
        if should_stop():
            return 0
    write_result({"score": (args.x - 0.3) ** 2})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
