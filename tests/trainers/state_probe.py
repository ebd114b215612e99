"""Records the Accelerate state a trial gets (device, mixed precision, processes) and the
variables `accelerate launch` sets, so `launcher: direct` can be compared with it."""

import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import PartialState


def main() -> None:
    acc = Accelerator()
    state = PartialState()
    record = {
        "device": str(acc.device), "mixed_precision": acc.mixed_precision,
        "num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type),
        "state_device": str(state.device), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_threads": torch.get_num_threads(),
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("ACCELERATE_", "OMP_", "KMP_", "MASTER_"))},
    }
    trial_dir = Path(os.environ["SWEEP_TRIAL_DIR"])
    (trial_dir / "state.json").write_text(json.dumps(record, indent=1))
    ancestors, pid = [], os.getpid()  # how the trial was started: its parents' command lines
    for _ in range(3):
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        ancestors.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
    (trial_dir / "ancestors.json").write_text(json.dumps(ancestors))
    Path(os.environ["SWEEP_RESULT_FILE"]).write_text(json.dumps({"score": 0.0}))


if __name__ == "__main__":
    main()
