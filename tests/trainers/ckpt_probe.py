"""A test trainer that checkpoints every step in $SWEEP_CHECKPOINT_DIR and resumes from it.

Each step is logged to `steps.log` in the checkpoint folder (`<trial number> <step>`) before
its checkpoint is written, so a kill between the two runs that step once more. On SIGTERM
(`should_stop`) it stops after the current step, its checkpoint written, and exits 0 with no
result (the driver tells the trial FAIL "interrupted"). It reports each step's value, and
prints the step it starts at and its x; `--fresh` starts over whatever the folder holds;
`--restore-x` takes x from the checkpoint over the one it is given (as a restored optimizer's
state overrides a learning rate: Ray Tune #62173); `--weights N` saves N bytes of weights.bin
with each checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sweep.protocol import report, should_stop, write_result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--fresh", action="store_true", help="ignore the folder: start over")
    p.add_argument("--restore-x", action="store_true", help="x from the checkpoint, if any")
    p.add_argument("--weights", type=int, default=0, help="bytes of weights.bin per save")
    args, _ = p.parse_known_args()
    folder = Path(os.environ["SWEEP_CHECKPOINT_DIR"])
    number = os.environ["SWEEP_TRIAL_NUMBER"]
    state = folder / "state.json"
    saved = json.loads(state.read_text()) if state.exists() and not args.fresh else {}
    step = saved.get("next", 0)
    x = saved.get("x", args.x) if args.restore_x else args.x
    print(f"starting at step {step} with x={x}", flush=True)
    with open(folder / "starts.log", "a") as f:
        f.write(f"{number} {step} {os.environ.get('SWEEP_RUN_ID')}\n")
    should_stop()  # SIGTERM from now on ends the loop after the step it is in
    while step < args.steps:
        time.sleep(args.sleep)
        value = (x - 0.3) ** 2 + 1.0 / (step + 1)
        with open(folder / "steps.log", "a") as f:
            f.write(f"{number} {step}\n")
        if args.weights:
            (folder / "weights.bin").write_bytes(b"w" * args.weights)
        tmp = folder / "state.json.tmp"
        tmp.write_text(json.dumps({"next": step + 1, "x": x}))
        os.replace(tmp, state)
        report(step, value)
        step += 1
        if should_stop():
            return 0
    write_result({"score": (x - 0.3) ** 2})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
