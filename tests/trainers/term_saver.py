"""A test trainer that saves only when it is stopped, slowly: on SIGTERM it takes
`--save-seconds` to write the step it reached to `state.json` in $SWEEP_CHECKPOINT_DIR (as a big
model's checkpoint takes a while), then exits 0 with no result. It starts from that step, and
logs `<trial number> <step> <time.time()>` to `starts.log` there as it starts. A second
SIGTERM while it saves changes nothing; a SIGKILL then loses the save.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from sweep.protocol import report, write_result

stopping = False


def on_term(signum: int, frame: object) -> None:
    global stopping
    stopping = True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--save-seconds", type=float, default=3.0)
    args, _ = p.parse_known_args()
    signal.signal(signal.SIGTERM, on_term)
    folder = Path(os.environ["SWEEP_CHECKPOINT_DIR"])
    state = folder / "state.json"
    step = json.loads(state.read_text())["next"] if state.exists() else 0
    with open(folder / "starts.log", "a") as f:
        f.write(f"{os.environ['SWEEP_TRIAL_NUMBER']} {step} {time.time()}\n")
    while step < args.steps:
        if stopping:
            time.sleep(args.save_seconds)
            tmp = folder / "state.json.tmp"
            tmp.write_text(json.dumps({"next": step}))
            os.replace(tmp, state)
            return 0
        time.sleep(args.sleep)
        report(step, (args.x - 0.3) ** 2 + 1.0 / (step + 1))
        step += 1
    write_result({"score": (args.x - 0.3) ** 2})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
