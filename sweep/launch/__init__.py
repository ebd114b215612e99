"""How a trial starts: the `Launcher` a run has (`launcher.py` its contract, `make.py` the
choice by `trainer.launcher`: accelerate, python, direct, warm; any of them inside a container),
the warm fork server and its client, the container engine, and the record of what ran
(provenance). The trial's plan, files and processes are `sweep.trial`'s.
Imports `_core`, `protocol`, `spec`, `gpus` and `trial`; never Optuna.

Its face is lazy (`_core.faces`): `python -m sweep.launch.warm_server` imports this package
first, and the server must start with the standard library, `trial.guard` and `_imitation`
alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.launch.launcher import Launcher
    from sweep.launch.provenance import RunRecord, write_trial

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
