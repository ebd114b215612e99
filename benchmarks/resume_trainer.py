"""The trainer of benchmarks/resume_cost.py: a step every --sleep s, a checkpoint after each
in $SWEEP_CHECKPOINT_DIR (or, where sweep gives none, $SWEEP_TRIAL_DIR), resumed at start;
on SIGTERM it saves and exits with no result."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sweep.protocol import should_stop, write_result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.1)
    args, _ = p.parse_known_args()
    folder = Path(os.environ.get("SWEEP_CHECKPOINT_DIR") or os.environ["SWEEP_TRIAL_DIR"])
    state = folder / "state.json"
    step = json.loads(state.read_text())["next"] if state.exists() else 0
    should_stop()
    while step < args.steps:
        time.sleep(args.sleep)
        step += 1
        with open(folder / "steps.log", "a") as f:
            f.write(f"{step}\n")
        state.write_text(json.dumps({"next": step}))
        if should_stop():
            return 0
    write_result({"score": (args.x - 0.3) ** 2})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
