"""What the driver tells a progress display: a trial started, a trial finished, a message."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

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
    state: str
    values: list[float] | None
    gpu: int
    seconds: float
    fail_reason: str | None
    gpus: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        return where(self.gpu, self.gpus)


def where(gpu: int, gpus: tuple[int, ...]) -> str:
    return f"GPUs {','.join(map(str, gpus))}" if len(gpus) > 1 else f"GPU {gpu}"


class Events:
    """Hooks for a progress display; the default only logs messages."""

    def started(self, trial: Started) -> None: ...
    def finished(self, done: Finished) -> None: ...
    def tick(self, view: Any) -> None: ...
    def message(self, text: str) -> None:
        log.warning(text)
