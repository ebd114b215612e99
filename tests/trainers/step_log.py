"""A test trainer that keeps its own log of what it trained, apart from sweep's records.

It trains `--steps` steps of `--sleep` s each, resuming from its newest `checkpoint-N` in
$SWEEP_CHECKPOINT_DIR (a PBT exploit's folder holds its donor's), reports every
`--every` steps (`report(steps done, value)`) and saves its state after each report (which
takes `--save` s, as a checkpoint does: the driver's decision on the report comes meanwhile);
on SIGTERM (`should_stop`) it stops after the step it is in, its state saved. Its own log, a
JSON file per process in the folder `--log`: the trial, its checkpoint folder's name, the
step it started and stopped at, the steps it trained, whether it resumed and whether it was
stopped before the end, and when its process and its parent (sweep's guard, under
`launcher: python`) started (the kernel's records) and when it ended.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sweep.protocol import report, should_stop, write_result


def started(pid: int | str = "self") -> float:
    """When process `pid` started (epoch s), from the kernel's record (to a clock tick)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def save(folder: Path, step: int) -> None:
    """The state at `step`, as a HF `Trainer` saves it: `checkpoint-<step>/`, its
    `trainer_state.json` written last (a PBT exploit copies the newest complete one while its
    donor trains on)."""
    tmp = folder / f".checkpoint-{step}.tmp"
    tmp.mkdir(exist_ok=True)
    (tmp / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    os.replace(tmp, folder / f"checkpoint-{step}")


def newest(folder: Path) -> int:
    """The step of the newest complete checkpoint in `folder` (0: none)."""
    steps = [int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*")
             if (p / "trainer_state.json").is_file()]
    return max(steps, default=0)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--sleep", type=float, default=0.01)
    p.add_argument("--save", type=float, default=0.0)
    p.add_argument("--log", required=True)
    args, _ = p.parse_known_args()
    folder = Path(os.environ["SWEEP_CHECKPOINT_DIR"])
    first = newest(folder)
    step, saved, stopped = first, first, False
    should_stop()  # SIGTERM from now on ends the loop after the step it is in
    while step < args.steps:
        time.sleep(args.sleep)
        step += 1
        if step % args.every == 0 or step == args.steps:
            report(step, (args.x - 0.3) ** 2 + 1.0 / step)
            save(folder, step)
            saved = step
            time.sleep(args.save)
        if should_stop() and step < args.steps:
            if saved != step:
                save(folder, step)
            stopped = True
            break
    if not stopped:
        write_result({"score": (args.x - 0.3) ** 2})
    record = {"trial": int(os.environ["SWEEP_TRIAL_NUMBER"]), "folder": folder.name,
              "start_step": first,
              "end_step": step, "steps": step - first, "resumed": first > 0,
              "stopped": stopped, "started": started(),
              "parent_started": started(os.getppid()),
              "ended": time.time()}
    log = Path(args.log)
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{os.getpid()}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
