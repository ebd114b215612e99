"""One trial as files and processes: its launch plan and command script, the guard and its
process, the running record, the verdict on its files, its intermediate values, hang and stacks,
its lineage and checkpoint folder, its trial folder. How a trial starts (the launchers) is
`sweep.launch`'s.
Imports `_core`, `protocol`, `spec` and `gpus`; of Optuna only `TrialState`, the state a
verdict tells (`outcome`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.trial.launch_plan import LaunchPlan
    from sweep.trial.lineage import Lineage, Start
    from sweep.trial.lineage_lock import LineageBusy
    from sweep.trial.outcome import Outcome
    from sweep.trial.process import GUARD_MARGIN, Process, Spawn
    from sweep.trial.running import (
        HURRIED_DRAIN,
        MAX_DRAIN,
        MOVES,
        Phase,
        PhaseError,
        RunningTrial,
        Stop,
        stop_all,
        where_to_look,
    )

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
