"""sweep: Optuna hyperparameter sweeps where every trial runs on its own GPU.

    import sweep
    study = sweep.run("study.yaml", n_trials=20, gpus=[0, 1])   # an optuna.Study
    sweep.status("study.yaml")                                  # counts and running trials
    sweep.load("study.yaml").trials                             # a pandas DataFrame

Importing sweep is light (trainers import `sweep.protocol`); the rest loads on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.summary import Status, Summary

__version__ = "0.2.0"


def run(
    study: str | Path, *, n_trials: int | None = None, gpus: list[int] | None = None,
    storage: str | None = None,
) -> Any:
    """Run (or continue) the study file to its budget in this process; its `optuna.Study`.

    Keyword arguments override the file. Ctrl-C (KeyboardInterrupt) stops the trials as on
    the command line, then raises KeyboardInterrupt.
    """
    from sweep.app import run_file

    return run_file(study, n_trials=n_trials, gpus=gpus, storage=storage)


def load(study: str | Path, storage: str | None = None) -> Summary:
    """The study's trials, GPUs and samples as DataFrames (works while it runs)."""
    from sweep.summary import load as load_summary

    return load_summary(study, storage=storage)


def status(study: str | Path, storage: str | None = None) -> Status:
    """Trial counts by state, and the running trials with their elapsed time and last value."""
    from sweep.summary import status as read_status

    return read_status(study, storage=storage)
