"""The study's trial counts, as the budget and the policy read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    """The study's trials as storage has them, every driver's included."""

    finished: int  # COMPLETE or PRUNED
    running: int
    grid_started: int = 0  # distinct grid points started (grid sampler only)
    waiting: int = 0  # queued (enqueue, rerun, retries), not started yet
