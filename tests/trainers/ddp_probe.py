"""A two-process trainer: every process joins torch.distributed through Accelerate, the
processes sum their ranks, and the main one writes the result (tests of multi-GPU trials)."""

import json
import os

import torch
from accelerate import Accelerator


def main() -> None:
    acc = Accelerator(cpu=not torch.cuda.is_available())  # gloo on a machine without GPUs
    total = acc.reduce(torch.tensor([float(acc.process_index)]), reduction="sum")
    record = {"num_processes": acc.num_processes, "rank_sum": float(total.item()),
              "backend": str(acc.state.backend), "distributed": str(acc.distributed_type),
              "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "port": os.environ.get("MASTER_PORT")}
    if acc.is_main_process:
        out = os.environ.get("SWEEP_RESULT_FILE", "result.json")
        with open(out, "w") as f:
            json.dump({"score": record["rank_sum"], **{k: v for k, v in record.items()
                                                        if isinstance(v, (int, float))}}, f)
        print(json.dumps(record), flush=True)
    acc.wait_for_everyone()
    # gloo aborts some exits ("terminate called without an active exception") when the group
    # is left to the interpreter's teardown: end it here, as a trainer should
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
