"""Whether a running trial is hung: silent for `trainer.hang_after` s with its GPUs idle.

`judge` is the rule, a pure function of when the trial last wrote anything, the utilisation
samples of its devices, and now. `OutputWatch` measures the silence cheaply: at each look it
compares the size and modification time of the trial's stdout, stderr, report file and result
file with the last look's (four `stat` calls, no log is read); a change seen is output at the
time of that look.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOKS_PER_WINDOW = 20  # looks at a trial's files per hang_after (at least every `poll` s)
WATCHED = "stdout, stderr, reports, result"


@dataclass(frozen=True)
class Hang:
    """A trial found hung: silent for `silent_s`, its GPUs at most `util_max` % meanwhile
    (None: no utilisation known, silence alone decided)."""

    silent_s: float
    util_max: float | None
    util_below: float

    def reason(self) -> str:
        """The trial's fail_reason."""
        gpu = ("GPU use not known (no NVML), so silence alone decided" if self.util_max is None
               else f"GPU use at most {self.util_max:.0f} % (below {self.util_below:g} %) "
               "meanwhile")
        return f"hung: no output ({WATCHED}) for {self.silent_s:.0f} s, {gpu}"


def judge(
    last_output: float, samples: Sequence[tuple[float, float]], now: float, hang_after: float,
    util_below: float,
) -> Hang | None:
    """The trial is hung when nothing was written for `hang_after` s (`now - last_output`) and
    every utilisation sample of its devices (time, % of the busiest) taken in that window is
    below `util_below`. NaN samples are unknown and left out; with no known sample in the
    window, silence alone decides. None: not hung."""
    silent = now - last_output
    if silent < hang_after:
        return None
    window = [u for t, u in samples if t >= now - hang_after and not math.isnan(u)]
    if window and max(window) >= util_below:
        return None
    return Hang(silent, max(window) if window else None, util_below)


def _mark(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


class OutputWatch:
    """When a trial last wrote any of `files`, or of the files `more()` names at each look
    (a `trainer.report` source's: a new file is output too), on the caller's clock, seen by
    `look`."""

    def __init__(self, files: Sequence[Path], started: float, hang_after: float,
                 poll: float, more: Callable[[], Sequence[Path]] = tuple) -> None:
        self.files, self.more = tuple(files), more
        self.last_output = started
        self.every = max(poll, hang_after / LOOKS_PER_WINDOW)
        self._marks = self._now()
        self._next = started + self.every

    def due(self, now: float) -> bool:
        return now >= self._next

    def next_look(self) -> float:
        return self._next

    def look(self, now: float) -> float:
        """Compare the files with the last look; the time output was last seen."""
        marks = self._now()
        if marks != self._marks:
            self._marks, self.last_output = marks, now
        self._next = now + self.every
        return self.last_output

    def silent_for(self, now: float) -> float:
        return now - self.last_output

    def _now(self) -> list[tuple[Path, tuple[int, int] | None]]:
        return [(f, _mark(f)) for f in (*self.files, *self.more())]


def silence(files: Sequence[Path], now: float) -> float | None:
    """Seconds since any of `files` was last modified, by their modification times against
    the wall clock `now` (for `sweep status`, which runs apart from the driver); None if none
    of them exists."""
    times = []
    for f in files:
        try:
            times.append(os.stat(f).st_mtime)
        except OSError:
            continue
    return max(0.0, now - max(times)) if times else None
