"""Make the report screenshots of docs/how-to/report.md from real sweeps:

- `report-simulated.png`: 12 trials of tests/examples/epoch_log.py on a simulated pool
  (`SWEEP_FAKE_GPUS=2`: no samples, so the GPU and energy panels say why they are empty);
- `report-nvml.png`: the same study on 4 devices of the fake NVML
  (`sweep.testing.fake_pynvml`), whose utilisation, memory, power, energy and process list
  follow the trainers running on each device, as a real card's would.

Each is `sweep run`, then `sweep report`, then headless Chromium's screenshot (network off), as
tests/e2e/test_report.py opens the report. Run from the repository root, with the project
importable:

    PYTHONPATH=. python docs/images/make_report_images.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from sweep import cli
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "examples" / "epoch_log.py"
GIB = 2**30


def study(folder: Path) -> Path:
    """A study of 12 trials of tests/examples/epoch_log.py (a script not written for sweep:
    one `epoch N ... valid loss X` line per epoch), some pruned by the median pruner from what
    it prints."""
    path = folder / "epochs.yaml"
    path.write_text(yaml.safe_dump({
        "study": {"name": "epochs", "direction": "minimize", "metric": "loss",
                  "n_trials": 12, "sampler": {"type": "tpe", "seed": 3},
                  "pruner": {"type": "median", "n_startup_trials": 3, "n_warmup_steps": 2},
                  "heartbeat_interval": 2},
        "trainer": {"script": str(EXAMPLE), "launcher": "python", "stop_grace": 2.0,
                    "args": ["--epochs", "10", "--epoch-seconds", "0.5"],
                    "result": {"stdout": r"best valid loss (?P<loss>\S+)"},
                    "report": {"stdout": r"epoch (?P<step>\d+) .* valid loss (?P<value>\S+)"}},
        "gpus": {"sample_interval": 0.25, "skip_busy": False},
        "params": {"lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}},
    }, sort_keys=False))
    return path


class Load(threading.Thread):
    """Drives the fake devices: a device runs whatever process of this one has it in its
    `CUDA_VISIBLE_DEVICES`; busy, it shows 70-98 % utilisation, 8-40 GiB used, ~300 W
    (idle: 0 %, 0.4 GiB, 60 W), and its energy counter adds power x time."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(daemon=True)
        self.gpus, self.stop = gpus, threading.Event()
        self.rng = random.Random(7)

    def _holders(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for child in psutil.Process().children(recursive=True):
            try:
                pins = child.environ().get("CUDA_VISIBLE_DEVICES")
            except (psutil.Error, OSError):
                continue
            if pins:
                for pin in pins.split(","):
                    found.setdefault(pin, []).append(child.pid)
        return found

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(0.1):
            now = time.monotonic()
            holders = self._holders()
            for index, gpu in enumerate(self.gpus):
                pids = holders.get(gpu.uuid, []) + holders.get(str(index), [])
                wave = 0.5 + 0.5 * math.sin(now / (3 + index))
                if pids:
                    used = int((8 + 32 * wave) * GIB)
                    gpu.util_gpu = int(70 + 28 * wave * self.rng.random())
                    gpu.util_memory = gpu.util_gpu // 2
                    gpu.power_mw = int(280_000 + 40_000 * wave)
                    gpu.processes = [(pids[0], used)]
                else:
                    used = int(0.4 * GIB)
                    gpu.util_gpu, gpu.util_memory, gpu.power_mw = 0, 0, 60_000
                    gpu.processes = []
                gpu.memory_used = used
                assert gpu.energy_mj is not None and gpu.power_mw is not None
                gpu.energy_mj += int(gpu.power_mw * (now - last))
            last = now


def screenshot(page: Path, png: Path) -> None:
    """Headless Chromium's screenshot of `page`, network off, as tests/e2e/test_report.py."""
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=3000", "--hide-scrollbars", "--window-size=1300,3600",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True)


def make(kind: str, out: Path, folder: Path) -> None:
    path = study(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        load: Load | None = None
        if kind == "simulated":
            patch.setenv("SWEEP_FAKE_GPUS", "2")
        else:
            patch.delenv("SWEEP_FAKE_GPUS", raising=False)
            gpus = [FakeGpu(uuid=f"GPU-{i}0000000-0000-0000-0000-000000000000",
                            memory_used=int(0.4 * GIB), power_mw=60_000) for i in range(4)]
            fake_pynvml.install(patch, gpus)
            load = Load(gpus)
            load.start()
        try:
            code = cli.main(["run", str(path)])
        finally:
            if load is not None:
                load.stop.set()
                load.join()
        if code != 0:
            sys.exit(f"sweep run exited {code}")
        page = folder / f"report-{kind}.html"
        if cli.main(["report", str(path), "-o", str(page)]) != 0:
            sys.exit("sweep report failed")
    screenshot(page, out / f"report-{kind}.png")
    print(f"wrote {out / f'report-{kind}.png'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    p.add_argument("--kind", choices=["simulated", "nvml", "both"], default="both")
    args: Any = p.parse_args(argv)
    out = args.out.resolve()
    for kind in (["simulated", "nvml"] if args.kind == "both" else [args.kind]):
        with tempfile.TemporaryDirectory(prefix=f"sweep-{kind}-") as tmp:
            os.chdir(tmp)  # the trainers' working directory
            make(kind, out, Path(tmp))
            os.chdir(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
