"""The trainer of benchmarks/compare.py: imports torch and accelerate as a real trainer does,
builds an Accelerator, "trains" by sleeping --seconds, and records when each phase began.

Record (JSON, one file per trial in $BENCH_RECORDS): first (its first line ran), ready
(imports and Accelerator done), end (work done), cvd (its CUDA_VISIBLE_DEVICES).
"""

import time

FIRST = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402, F401
from accelerate import Accelerator  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out", default="")
    args, _ = p.parse_known_args()
    Accelerator()
    ready = time.time()
    time.sleep(args.seconds)
    end = time.time()
    record = {"first": FIRST, "ready": ready, "end": end,
              "cvd": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
              "trial": int(os.environ.get("SWEEP_TRIAL_NUMBER", "-1"))}
    folder = Path(os.environ["BENCH_RECORDS"])
    (folder / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
    out = args.out or os.environ.get("SWEEP_RESULT_FILE", "")
    if out:
        Path(out).write_text(json.dumps({"score": (args.x - 0.3) ** 2}))


if __name__ == "__main__":
    main()
