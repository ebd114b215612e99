"""`Launcher`: the contract every launcher keeps, whatever `trainer.launcher` names.

A launcher plans a trial (argv, environment and files, from the spec and the trial's inputs:
`plan`, pure once the launcher is ready), spawns it under its guard (`spawn`, a
`process.Process`) and ends what it holds (`close`). The driver and the dry run only call
these; which launcher a run has is decided in `sweep.launch.make`, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sweep.trial import LaunchPlan, Process, Start

Say = Callable[[str], None]  # tells the user one line
Abort = Callable[[], bool]  # true once the run is stopping: waits end


class Launcher(Protocol):
    """How the trials of one run start (`make.make` picks the one the study names)."""

    def prepare(self) -> None:
        """Before the first trial is asked: what a run needs once (a few seconds at most,
        e.g. the study's merged accelerate config written)."""
        ...

    def get_ready(self) -> None:
        """Before each trial is asked: a launcher still getting ready may wait here (warm: for
        its server's imports, until the run is asked to stop)."""
        ...

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """Trial `number`'s argv, environment and files (pure once the launcher is ready: the
        same inputs give the same plan); `start`: what it gets from its lineage
        (`lineage.prepare`)."""
        ...

    def note(self, params: Mapping[str, Any]) -> str | None:
        """For a dry run: what the printed command of a trial of `params` leaves out."""
        ...

    def header(self) -> list[str]:
        """For a dry run: how the printed commands run."""
        ...

    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process:
        """Start `plan` under its guard; `hold`: descriptors the guard keeps while the tree
        lives; `on_change` is called as the command exits and as its tree ends."""
        ...

    def close(self) -> None:
        """End what the launcher holds (running trials are the driver's to end)."""
        ...
