"""The driver's heartbeat thread: it records that the driver's running trials are alive, every
`heartbeat_interval` s, so a busy loop never makes a live trial look dead.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import optuna

from sweep.study.storage import describe

log = logging.getLogger("sweep")


class Beating(Protocol):
    """What the heartbeat beats through (a `store.Store`)."""

    def beat(self, trial: optuna.Trial) -> None: ...


class Heartbeat:
    """Records the heartbeat of the driver's trials every `interval` s, in its own thread, so
    a busy loop never makes a live trial look dead."""

    def __init__(self, store: Beating, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._trials: dict[int, optuna.Trial] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-heartbeat", daemon=True)

    def add(self, trial: optuna.Trial) -> None:
        with self._lock:
            self._trials[trial.number] = trial

    def discard(self, number: int) -> None:
        with self._lock:
            self._trials.pop(number, None)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                trials = list(self._trials.values())
            for trial in trials:
                try:
                    self.store.beat(trial)
                except optuna.exceptions.UpdateFinishedTrialError:
                    self.discard(trial.number)  # told between the copy and the beat
                except Exception as e:  # a storage hiccup: the next beat may go through
                    log.warning("heartbeat of trial %d failed: %s", trial.number, describe(e))


# ---- the private Optuna APIs sweep relies on (see tests/test_store.py's contract test) ------
