"""The study's trial counts, as the budget and the policy read them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    """The study's trials as storage has them, every driver's included."""

    finished: int  # COMPLETE or PRUNED
    running: int
    grid_started: int = 0  # distinct grid points started (grid sampler only)
    waiting: int = 0  # queued (enqueue, rerun, retries), not started yet


class Tally:
    """One driver's view of the counts: as last read (`read`: under the budget lock before
    each ask, and every heartbeat interval), plus what this driver did since (`add`)."""

    def __init__(self, read: Callable[[], Counts], grid: bool = False) -> None:
        self.read, self.grid = read, grid
        self._counts: Counts | None = None
        self.adjusted = False  # what this driver did was added to them since the last read

    def get(self) -> Counts:
        """The counts, read again if they were forgotten."""
        if self._counts is None:
            self._counts = self.read()
            self.adjusted = False
        return self._counts

    def forget(self) -> None:
        """Others may have changed them: read them again when next asked."""
        self._counts = None

    def add(self, finished: int = 0, running: int = 0, waiting: int = 0) -> None:
        """What this driver just did to the study, added to the counts last read (with a grid
        sampler, forgotten instead: a grid point started is not known here)."""
        c = self._counts
        if c is None or self.grid:
            self._counts = None
            return
        self.adjusted = True
        self._counts = dataclasses.replace(
            c, finished=c.finished + finished, running=max(0, c.running + running),
            waiting=max(0, c.waiting + waiting))
