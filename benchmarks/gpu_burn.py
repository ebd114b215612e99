"""A GPU trainer for benchmarks/gpu_smoke.sh: bf16 matmuls for --seconds, through Accelerate.

Records whether CUDA was available and how many devices it saw in the result, and the
CUDA_VISIBLE_DEVICES it was given in `<trial dir>/visible.txt` (sweep pins by UUID), so the
smoke test can check real pinning; loss is a fake objective depending on --size.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from sweep.protocol import report, write_result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--size", type=int, default=4096)
    args = p.parse_args()
    acc = Accelerator()
    a = torch.randn(args.size, args.size, device=acc.device, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=acc.device, dtype=torch.bfloat16)
    t0, step = time.time(), 0
    while time.time() - t0 < args.seconds:
        for _ in range(50):
            a = (a @ b).clamp_(-1, 1)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        report(step, 1.0 / args.size + step * 1e-6)
        step += 1
    write_result({
        "loss": 1.0 / args.size,
        "cuda": float(torch.cuda.is_available()),
        "device_count": float(torch.cuda.device_count()),
        "steps": float(step),
    })
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    (Path(os.environ.get("SWEEP_TRIAL_DIR", ".")) / "visible.txt").write_text(visible)


if __name__ == "__main__":
    main()
