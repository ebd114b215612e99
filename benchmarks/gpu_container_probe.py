"""A trainer for benchmarks/gpu_smoke.sh's container case: what a trial in a container sees.

Torch and the standard library only (no sweep inside the image): writes to $SWEEP_RESULT_FILE
whether CUDA is available, how many devices torch sees, the UUID of `cuda:0`, the
CUDA_VISIBLE_DEVICES it was given, and whether /etc/sweep-smoke-image exists (only the smoke
test's image has it: the trial ran in the container), after a few matmuls on `cuda:0`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def main() -> None:
    cuda = torch.cuda.is_available()
    uuid = None
    if cuda:
        a = torch.randn(1024, 1024, device="cuda:0")
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "") or None
    result = {"loss": 1.0, "cuda": float(cuda), "device_count": float(torch.cuda.device_count()),
              "uuid": uuid, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "inside": Path("/etc/sweep-smoke-image").exists()}
    with open(os.environ["SWEEP_RESULT_FILE"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
