"""A trial as a process: the command and environment (pure), and the one place that spawns it.

`build_launch` decides everything about a trial's process from its inputs and is unit-tested;
`TrialProcess` only carries the decision out: it starts the command under `guard.py` in a new
session and stops its whole process tree with SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sweep import protocol
from sweep.config import TrainerSection

GUARD = Path(__file__).with_name("guard.py")

# sweep's own accelerate config: one process, no distribution, so a user's
# default_config.yaml cannot turn a trial into a multi-GPU torchrun job.
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
num_machines: 1
num_processes: 1
machine_rank: 0
mixed_precision: 'no'
use_cpu: false
"""


@dataclass(frozen=True)
class TrialPaths:
    """The files of one trial, all under `<output_dir>/trials/<number>/`."""

    dir: Path

    @classmethod
    def of(cls, output_dir: Path, number: int) -> TrialPaths:
        return cls(output_dir / "trials" / str(number))

    @property
    def params(self) -> Path:
        return self.dir / "params.json"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def reports(self) -> Path:
        return self.dir / "reports.jsonl"

    @property
    def stdout(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.dir / "stderr.log"

    @property
    def command(self) -> Path:
        return self.dir / "command.sh"


@dataclass(frozen=True)
class LaunchPlan:
    """What to run for one trial: argv and the variables set on top of the driver's env."""

    argv: list[str]
    env: dict[str, str]
    paths: TrialPaths

    def command_line(self) -> str:
        """The exact command, as a shell line a user can paste to rerun the trial by hand."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}"


def format_value(value: Any) -> str:
    """How a param value appears on the trainer's command line.

    Strings as they are; booleans `true`/`false`; None `null`; numbers in Python's shortest
    round-trip form; lists and mappings as JSON.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return json.dumps(value)


def param_args(params: Mapping[str, Any]) -> list[str]:
    """`--name value` pairs, one argv element each, in the order given."""
    out: list[str] = []
    for name, value in params.items():
        out += [f"--{name}", format_value(value)]
    return out


def build_launch(
    trainer: TrainerSection,
    number: int,
    params: Mapping[str, Any],
    device: int,
    paths: TrialPaths,
    accelerate_config: Path,
    python: str = sys.executable,
) -> LaunchPlan:
    """argv + env of one trial: `accelerate launch` pinned to `device` (or plain python)."""
    entry = ["-m", str(trainer.module)] if trainer.module else [str(trainer.script)]
    tail = [*entry, *trainer.args, *param_args(params)]
    if trainer.launcher == "accelerate":
        settings = [
            "--config_file", str(accelerate_config),
            "--num_processes", "1",
            "--num_machines", "1",
            "--gpu_ids", str(device),
        ]
        acc = trainer.accelerate
        if acc.mixed_precision is not None:
            settings += ["--mixed_precision", acc.mixed_precision]
        if acc.dynamo_backend is not None:
            settings += ["--dynamo_backend", acc.dynamo_backend]
        if trainer.module:
            tail = ["--module", *tail[1:]]
        argv = [python, "-m", "accelerate.commands.launch", *settings, *tail]
    else:
        argv = [python, *tail]
    env = {k: str(v) for k, v in trainer.env.items()}
    env.update({
        "CUDA_VISIBLE_DEVICES": str(device),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        protocol.TRIAL_NUMBER_ENV: str(number),
        protocol.TRIAL_DIR_ENV: str(paths.dir),
        protocol.PARAMS_ENV: str(paths.params),
        protocol.RESULT_ENV: str(paths.result),
        protocol.REPORT_ENV: str(paths.reports),
    })
    return LaunchPlan(argv, env, paths)


def prepare_trial_dir(plan: LaunchPlan, params: Mapping[str, Any]) -> None:
    """Create the trial directory afresh with params.json and command.sh."""
    paths = plan.paths
    paths.dir.mkdir(parents=True, exist_ok=True)
    for stale in (paths.result, paths.reports):
        stale.unlink(missing_ok=True)
    paths.params.write_text(json.dumps(dict(params), indent=2) + "\n")
    paths.command.write_text("#!/bin/sh\n" + plan.command_line() + "\n")


class TrialProcess:
    """One running trial: its guard, launcher and trainer in one new process group.

    `on_exit` is called from a waiter thread when the process ends (to wake the driver).
    """

    def __init__(
        self, plan: LaunchPlan, grace: float, on_exit: Callable[[], None] = lambda: None
    ) -> None:
        self.plan = plan
        read_end, self._lifeline = os.pipe()
        try:
            with open(plan.paths.stdout, "wb") as out, open(plan.paths.stderr, "wb") as err:
                self._popen = subprocess.Popen(
                    [sys.executable, str(GUARD), str(read_end), str(grace), "--", *plan.argv],
                    env={**os.environ, **plan.env},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True, pass_fds=(read_end,),
                )
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            os.close(read_end)
        self.pid = self._popen.pid
        self.started = time.time()
        self.exit_code: int | None = None
        self._seen_pids: set[int] = {self.pid}
        self._on_exit = on_exit
        self._done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        code = self._popen.wait()
        self.exit_code = 128 - code if code < 0 else code
        self._on_exit()
        self._done.set()  # after on_exit: once `running` is False, the callback has run

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the process to end; True if it did."""
        return self._done.wait(timeout)

    def tree_pids(self) -> set[int]:
        """The pids of the trial's live processes (also remembered for `seen_pids`)."""
        try:
            root = psutil.Process(self.pid)
            pids = {self.pid, *(c.pid for c in root.children(recursive=True))}
        except psutil.Error:
            pids = set()
        self._seen_pids |= pids
        return pids

    @property
    def seen_pids(self) -> set[int]:
        """Every pid ever seen in the trial's tree (to recognise its GPU processes)."""
        return set(self._seen_pids)

    def signal(self, sig: int) -> None:
        """Send `sig` to the process group and to any descendant that left it."""
        pids = self.tree_pids()
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids - {self.pid}:
            try:
                if os.getpgid(pid) != self.pid:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def close(self) -> None:
        """After the guard exited: kill any straggler of the group and close the lifeline."""
        self.kill()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
