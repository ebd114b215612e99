"""A trainer of several processes that records what its `Accelerator` was given by the
launch config: mixed precision, debug mode, the FSDP plugin accelerate builds from the
launch's variables, its processes and devices (tests of `trainer.accelerate.config_file`).

On a machine without GPUs the processes join through gloo (FSDP itself needs a GPU, so the
plugin is read, not applied)."""

import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin


def main() -> None:
    acc = Accelerator(cpu=not torch.cuda.is_available())
    plugin = FullyShardedDataParallelPlugin() if os.environ.get(
        "ACCELERATE_USE_FSDP") == "true" else None  # as Accelerator() builds it
    total = acc.reduce(torch.tensor([float(acc.process_index)]), reduction="sum")
    record = {
        "num_processes": acc.num_processes, "rank_sum": float(total.item()),
        "mixed_precision": acc.mixed_precision, "debug": bool(acc.state.debug),
        "fsdp": None if plugin is None else {
            "sharding_strategy": str(plugin.sharding_strategy),
            "state_dict_type": str(plugin.state_dict_type)},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "port": os.environ.get("MASTER_PORT"),
    }
    if acc.is_main_process:
        trial_dir = os.environ["SWEEP_TRIAL_DIR"]
        with open(os.path.join(trial_dir, "accelerator.json"), "w") as f:
            json.dump(record, f)
        with open(os.environ["SWEEP_RESULT_FILE"], "w") as f:
            json.dump({"score": record["rank_sum"]}, f)
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
