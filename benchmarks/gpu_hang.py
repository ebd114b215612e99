"""A trainer for benchmarks/gpu_smoke.sh's hang case: it takes GPU memory, prints one line,
then waits for ever in a function of its own (GPU idle, no output): sweep must find it hung
by utilisation, dump its stack (naming `hold_memory_and_wait`) and stop it."""

import time

import torch


def hold_memory_and_wait(block: torch.Tensor) -> None:
    while True:
        time.sleep(1.0)


def main() -> None:
    block = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    block.fill_(1.0)
    torch.cuda.synchronize()
    print(f"holding {block.numel() * 4 >> 20} MB on {torch.cuda.get_device_name()}", flush=True)
    hold_memory_and_wait(block)


if __name__ == "__main__":
    main()
