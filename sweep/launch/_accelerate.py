"""Launchers `accelerate` (the default) and `python`: each trial a new interpreter under its
guard; and `BaseLauncher`, what every launcher of `sweep.launch` builds on (`direct` and `warm`
too): a plan by `launch_plan.plan_trial`, a spawn by the run's `spawn`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweep.spec import Spec, accelconfig
from sweep.trial import LaunchPlan, Process, Spawn, Start, launch_plan, process


class BaseLauncher:
    """A `Launcher` (each method's contract is there): a plan by `launch_plan.plan_trial`, a
    spawn by the run's `spawn` (`process.TrialProcess`: a guard, then the command, new
    interpreters both)."""

    through_accelerate = False  # the trial's command is `accelerate launch ...`

    def __init__(self, spec: Spec, spawn: Spawn = process.TrialProcess) -> None:
        self.spec = spec
        self._spawn = spawn
        # the accelerate config trials launch with (the study's own, merged: written once)
        self.config, self.merged = launch_plan.launch_config(spec)

    def prepare(self) -> None:
        """The study's merged accelerate config is written."""
        if self.merged is not None:
            accelconfig.write(self.merged, self.config.path.parent)

    def get_ready(self) -> None:
        """Ready from the start."""

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """`launch_plan.plan_trial` with this launcher's config (pure)."""
        return launch_plan.plan_trial(self.spec, number, params, device, pin, port,
                                      through_accelerate=self.through_accelerate,
                                      config=self.config, start=start)

    def note(self, params: Mapping[str, Any]) -> str | None:
        """Nothing left out."""
        return None

    def header(self) -> list[str]:
        """Where the merged accelerate config is written, if there is one."""
        if self.merged is None:
            return []
        return [f"# accelerate config: {self.config.path}: trainer.accelerate.config_file with "
                "sweep's settings on top, written at the run's start"]

    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process:
        """The run's `spawn`: a guard, then the command."""
        return self._spawn(plan, grace, on_change, hold=hold)

    def close(self) -> None:
        """Nothing held."""


class AccelerateLauncher(BaseLauncher):
    """The default: `accelerate launch` as a new process per trial, the command a user would
    type (sweep's accelerate config, the device, the options)."""

    through_accelerate = True


class PythonLauncher(BaseLauncher):
    """`python script.py`: the device and sweep's variables, nothing of accelerate."""
