"""A run: the driver's loop, the pure policy it asks, the events it tells and the live view.
Imports `_core`, `spec`, `gpus`, `trial`, `launch`, `study` and `schedulers`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.runner.clock import WallClock
    from sweep.runner.driver import Driver
    from sweep.runner.policy import EXIT_INTERRUPTED, EXIT_OK, RunResult
    from sweep.runner.progress import Progress
    from sweep.runner.starter import Starter

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
