"""What the driver tells a progress display: a trial started, a trial finished, a message,
and on each turn of its loop a `View` of the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

log = logging.getLogger("sweep")


@dataclass(frozen=True)
class Started:
    number: int
    gpu: int
    params: dict[str, Any]
    started: float  # epoch seconds
    gpus: tuple[int, ...] = ()  # all its devices, for a trial of several

    @property
    def where(self) -> str:
        """"GPU 1", or "GPUs 1,2" for a trial of several devices."""
        return where(self.gpu, self.gpus)


@dataclass(frozen=True)
class Finished:
    """What the driver told about one trial."""

    number: int
    state: TrialState  # COMPLETE, PRUNED or FAIL
    values: list[float] | None
    gpu: int
    seconds: float
    fail_reason: str | None
    gpus: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        return where(self.gpu, self.gpus)


@dataclass(frozen=True)
class Running:
    """One trial running now, as a display shows it."""

    number: int
    gpu: int
    params: Mapping[str, Any]
    elapsed: float  # seconds since it started, by the driver's monotonic clock


@dataclass(frozen=True)
class View:
    """The run at one moment, for a display: nothing in it changes the run.

    `best` reads the best trials from storage (a query over every finished trial: a display
    calls it every few seconds, not at every view)."""

    study: str
    n_trials: int
    finished: int
    running: tuple[Running, ...]
    devices: tuple[int, ...]
    quarantined: frozenset[int]
    best: Callable[[], list[tuple[int, list[float]]]] = lambda: []


def where(gpu: int, gpus: tuple[int, ...]) -> str:
    return f"GPUs {','.join(map(str, gpus))}" if len(gpus) > 1 else f"GPU {gpu}"


class Events:
    """Hooks for a progress display; the default only logs messages."""

    def started(self, trial: Started) -> None: ...
    def finished(self, done: Finished) -> None: ...
    def tick(self, view: View) -> None: ...
    def message(self, text: str) -> None:
        log.warning(text)
