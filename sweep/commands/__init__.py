"""The verbs of the command line, one module each: its arguments (`add_parser`) and its work
(`main`, given the parsed arguments, returns the exit code). `COMMANDS` lists them as
`sweep --help` does. A module imports what its work needs when it runs, so that the command
line starts fast; `assembly` puts a run together around the driver (also `sweep.run`).

Imports _core, spec, gpus, trial, launch, study, schedulers, runner and analysis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face
from sweep.commands import gpus, logs, report, rerun, run, status, storage_proxy, summary

if TYPE_CHECKING:
    from sweep.commands.assembly import run_file

COMMANDS = (run, summary, report, gpus, status, logs, rerun, storage_proxy)

__all__, _face = face(__name__)
__all__ = ["COMMANDS", *__all__]
if not TYPE_CHECKING:
    __getattr__ = _face
