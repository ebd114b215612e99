"""sweep: Optuna hyperparameter sweeps where every trial runs on its own GPU.

    import sweep
    study = sweep.run("study.yaml", n_trials=20, gpus=[0, 1])   # an optuna.Study
    sweep.status("study.yaml")                                  # counts and running trials
    sweep.load("study.yaml").trials                             # a pandas DataFrame

Importing sweep is light (trainers import `sweep.protocol`); the rest loads on first use.

Public: `run`, `load`, `status` here; `sweep.protocol` (the trainer's side of the trial
contract); `sweep.analysis.summary` and `sweep.analysis.figures` (also as `sweep.summary` and
`sweep.figures`); `sweep.testing` (fakes for tests). Every other module may change.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.analysis import Status, Summary

__version__ = "0.2.0"
__all__ = ["__version__", "load", "run", "status"]
_ANALYSIS = ("figures", "report", "summary")  # `from sweep import figures` works as before


def __getattr__(name: str) -> Any:
    if name in _ANALYSIS:
        import importlib

        return importlib.import_module(f"sweep.analysis.{name}")
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")


def run(
    study: str | Path, *, n_trials: int | None = None, gpus: list[int] | None = None,
    storage: str | None = None,
) -> Any:
    """Run (or continue) the study file to its budget in this process; its `optuna.Study`.

    Keyword arguments override the file. Ctrl-C (KeyboardInterrupt) stops the trials as on
    the command line, then raises KeyboardInterrupt.
    """
    from sweep.commands import run_file

    return run_file(study, n_trials=n_trials, gpus=gpus, storage=storage)


def load(study: str | Path, storage: str | None = None) -> Summary:
    """The study's trials, GPUs and samples as DataFrames (works while it runs)."""
    from sweep.analysis import load as load_summary

    return load_summary(study, storage=storage)


def status(study: str | Path, storage: str | None = None) -> Status:
    """Trial counts by state, and the running trials with their elapsed time and last value."""
    from sweep.analysis.status import status as read_status

    return read_status(study, storage=storage)
