"""A GPU trainer for benchmarks/gpu_smoke.sh that misbehaves the way real ones do: it leaves a
detached child (its own session, SIGTERM ignored) holding GPU memory, writes a valid result
and exits 0 at once. sweep must judge the trial COMPLETE, stop the child (SIGKILL after the
grace period), and free the device before the next trial."""

from __future__ import annotations

import os
import subprocess
import sys
import time

CHILD = """
import signal, sys, time, torch
signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")  # 2 GiB, held
open(sys.argv[1], "w").write("holding")
time.sleep(600)
"""


def main() -> None:
    import torch

    from sweep.protocol import write_result

    marker = os.path.join(os.environ["SWEEP_TRIAL_DIR"], "child_holding")
    subprocess.Popen([sys.executable, "-c", CHILD, marker], start_new_session=True)
    x = torch.ones(2**28, device="cuda")  # 1 GiB in the trainer itself
    deadline = time.time() + 60
    while not os.path.exists(marker) and time.time() < deadline:
        time.sleep(0.1)
    ready = float(os.path.exists(marker))
    write_result({"loss": float(x.sum().item()) / 2**28, "child_ready": ready})


if __name__ == "__main__":
    main()
