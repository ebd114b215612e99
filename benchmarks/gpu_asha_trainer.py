"""The trainer of benchmarks/gpu_smoke.sh's asha case: a small real model (an MLP on a
synthetic classification task held on the device: CUDA when available, else the CPU), Adam at
--lr, steps 1..--max_steps, each padded to at least --step_seconds (sweep reads the reports
every 0.5 s, so a rung is seen within a few steps of it), its batch loss reported every step.

Its state (step, model, optimizer) is saved in $SWEEP_CHECKPOINT_DIR every --save_every steps
and when it is stopped (SIGTERM: a pause), to a temporary file then renamed, and loaded at
start when there. Each save and load is timed (torch.save with its fsync, or torch.load to the
device with both states restored; CUDA synchronised) and appended as a JSON line to
$SWEEP_TRIAL_DIR/timing.jsonl, with a line at the first step (`start`: the step it resumed
from, and the seconds from the process's start to there):
    {"event": "load", "seconds": 0.041, "step": 37, "bytes": 31000000}
    {"event": "start", "step": 37, "startup": 3.2, "device": "cuda"}
    {"event": "save", "seconds": 0.052, "step": 52, "stop": true, "bytes": 31000000}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from sweep.protocol import report, should_stop, write_result


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def note(folder: Path, **line: Any) -> None:
    with open(folder / "timing.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def save(path: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
         device: torch.device) -> tuple[float, int]:
    """Save the state atomically; (seconds, bytes)."""
    t0 = time.perf_counter()
    sync(device)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return time.perf_counter() - t0, path.stat().st_size


def load(path: Path, model: nn.Module, opt: torch.optim.Optimizer,
         device: torch.device) -> tuple[int, float]:
    """Load the state onto `device`; (its step, seconds)."""
    t0 = time.perf_counter()
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    sync(device)
    return int(state["step"]), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max_steps", type=int, default=270)
    p.add_argument("--step_seconds", type=float, default=0.0)
    p.add_argument("--save_every", type=int, default=50)  # 0: only when stopped
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    should_stop()  # SIGTERM from now on sets a flag: save, then exit
    trial_dir = Path(os.environ.get("SWEEP_TRIAL_DIR") or ".")
    folder = Path(os.environ.get("SWEEP_CHECKPOINT_DIR") or trial_dir)
    path = folder / "state.pt"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # several trials share the CPU in a simulated pool

    g = torch.Generator(device="cpu").manual_seed(0)  # the same task for every trial
    d_in, classes, n = 256, 10, 8192
    x = torch.randn(n, d_in, generator=g).to(device)
    teacher = torch.randn(d_in, classes, generator=g).to(device)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g).to(device)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d_in, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, classes)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0
    if path.exists():
        step, seconds = load(path, model, opt, device)
        note(trial_dir, event="load", seconds=seconds, step=step, bytes=path.stat().st_size)
        for group in opt.param_groups:
            group["lr"] = args.lr  # the lr given, not the one saved with the optimizer
    note(trial_dir, event="start", step=step, device=device.type,
         startup=time.time() - psutil.Process().create_time())
    loss = torch.zeros(())
    while step < args.max_steps:
        t0 = time.perf_counter()
        idx = (step * args.batch + torch.arange(args.batch, device=device)) % n
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        report(step, loss.item())  # .item() waits for the step
        if should_stop() or (args.save_every and step % args.save_every == 0):
            seconds, size = save(path, step, model, opt, device)
            note(trial_dir, event="save", seconds=seconds, step=step, bytes=size,
                 stop=should_stop())
            if should_stop():
                return 0  # paused (or stopped): no result, the state saved
        time.sleep(max(0.0, args.step_seconds - (time.perf_counter() - t0)))
    with torch.no_grad():
        final = nn.functional.cross_entropy(model(x), y).item()
    write_result({"loss": final, "train_loss": loss.item(), "steps": float(step),
                  "cuda": float(device.type == "cuda")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
