"""The launchers that start each trial as a new interpreter (`accelerate`, `python`,
`direct`), and `Launcher`, the contract every launcher keeps.

`sweep.launch.make` says what each launcher does and chooses one per run (`make`); the
`warm` launcher builds on `DirectLauncher` there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sweep.launch import engine
from sweep.launch.direct import AccelerateEnv
from sweep.spec import accelconfig, interpreter
from sweep.spec import container as containerspec
from sweep.spec.schema import Spec
from sweep.trial import launch_plan, process
from sweep.trial.launch_plan import LaunchPlan
from sweep.trial.lineage import Start
from sweep.trial.process import Process, Spawn


class Launcher(Protocol):
    """How the trials of one run start (`launchers.make` picks the one the study names); each
    method's contract is on `BaseLauncher`'s."""

    def prepare(self) -> None: ...
    def get_ready(self) -> None: ...
    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan: ...
    def note(self, params: Mapping[str, Any]) -> str | None: ...
    def header(self) -> list[str]: ...
    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process: ...
    def close(self) -> None: ...


class BaseLauncher:
    """What the launchers share: a plan by `launch_plan.plan_trial`, a spawn by the run's `spawn`
    (`process.TrialProcess`: a guard, then the command, new interpreters both)."""

    through_accelerate = False  # the trial's command is `accelerate launch ...`

    def __init__(self, spec: Spec, spawn: Spawn = process.TrialProcess) -> None:
        self.spec = spec
        self._spawn = spawn
        # the accelerate config trials launch with (the study's own, merged: written once)
        self.config, self.merged = launch_plan.launch_config(spec)

    def prepare(self) -> None:
        """Before the first trial is asked: what a run needs once (a few seconds at most):
        the study's merged accelerate config is written."""
        if self.merged is not None:
            accelconfig.write(self.merged, self.config.path.parent)

    def get_ready(self) -> None:
        """Before each trial is asked: a launcher still getting ready may wait here (warm: for
        its server's imports, until the run is asked to stop)."""

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """Trial `number`'s argv, environment and files (pure: the same inputs give the same
        plan); `start`: what it gets from its lineage (`lineage.prepare`)."""
        return launch_plan.plan_trial(self.spec, number, params, device, pin, port,
                                 through_accelerate=self.through_accelerate,
                                 config=self.config, start=start)

    def note(self, params: Mapping[str, Any]) -> str | None:
        """For a dry run: what the printed command of a trial of `params` leaves out."""
        return None

    def header(self) -> list[str]:
        """For a dry run: how the printed commands run."""
        if self.merged is None:
            return []
        return [f"# accelerate config: {self.config.path}: trainer.accelerate.config_file with "
                "sweep's settings on top, written at the run's start"]

    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process:
        """Start `plan` under its guard; `hold`: descriptors the guard keeps while the tree
        lives."""
        return self._spawn(plan, grace, on_change, hold=hold)

    def close(self) -> None:
        """End what the launcher holds (running trials are the driver's to end)."""


class AccelerateLauncher(BaseLauncher):
    """The default: `accelerate launch` as a new process per trial, the command a user would
    type (sweep's accelerate config, the device, the options)."""

    through_accelerate = True


class PythonLauncher(BaseLauncher):
    """`python script.py`: the device and sweep's variables, nothing of accelerate."""


class DirectLauncher(BaseLauncher):
    """The script in one interpreter, with the variables `accelerate launch` would set."""

    def __init__(self, spec: Spec, host: str, spawn: Spawn = process.TrialProcess,
                 dry: bool = False) -> None:
        """`dry`: for a dry run, which computes nothing: the variables come from the cache
        alone."""
        super().__init__(spec, spawn)
        python, inside = spec.trainer.python, spec.trainer.container
        # in a container: accelerate's variables are asked of the image's accelerate, by
        # image ID (the tag may move), with the config file the options name mounted
        prefix: list[str] = []
        if inside is not None:
            pinned = inside if inside.engine == "apptainer" else inside.model_copy(
                update={"image": engine.pin(inside, spec.source.parent).id})
            prefix = containerspec.probe_prefix(pinned, spec.source.parent, [self.config.path])
            python = launch_plan.trial_python(spec)
        version = None if python is None else interpreter.probe(
            python, prefix=prefix).packages.get("accelerate")
        self.accelerate_env = AccelerateEnv(spec.output_dir / "cache", host,
                                            python or sys.executable, version=version,
                                            prefix=prefix)
        self._dry = dry

    def prepare(self) -> None:
        super().prepare()
        if all(p.where == "script" for p in self.spec.params.values()):
            self.accelerate_env.get(launch_plan.direct_settings(self.spec, {}, self.config))

    def _variables(self, params: Mapping[str, Any]) -> dict[str, str] | None:
        options = launch_plan.direct_settings(self.spec, params, self.config)
        return self.accelerate_env.cached(options) if self._dry else \
            self.accelerate_env.get(options)

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """As the base's, with accelerate's variables beneath sweep's: for launch options not
        seen before (a searched `where: accelerate` param) they are asked of accelerate once
        (a few seconds) and cached; then the plan is pure again."""
        return launch_plan.plan_trial(self.spec, number, params, device, pin, port,
                                 self._variables(params), through_accelerate=False,
                                 config=self.config, start=start)

    def note(self, params: Mapping[str, Any]) -> str | None:
        if self._variables(params) is None:
            return ("# plus the variables `accelerate launch` would set: computed and cached "
                    "at the first run")
        return None
