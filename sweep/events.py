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


@dataclass(frozen=True)
class Finished:
    """What the driver told about one trial."""

    number: int
    state: str
    values: list[float] | None
    gpu: int
    seconds: float
    fail_reason: str | None


class Events:
    """Hooks for a progress display; the default only logs messages."""

    def started(self, trial: Started) -> None: ...
    def finished(self, done: Finished) -> None: ...
    def tick(self, view: Any) -> None: ...
    def message(self, text: str) -> None:
        log.warning(text)
