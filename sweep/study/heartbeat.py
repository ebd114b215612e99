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
    """What the heartbeat beats through (a `store.Store`); `lost`: the storage is known to be
    gone for this run (its one line is the run's last), so failed beats say nothing more."""

    lost: str | None

    def beat(self, trial: optuna.Trial) -> None: ...


class Streak:
    """When failing heartbeat passes are worth a line (pure): a pass where some beat failed
    is said once it follows another such pass (one missed beat is a hiccup the next beat
    repairs), and a streak is said once; a pass where every beat went through ends it."""

    def __init__(self) -> None:
        self.failed_passes = 0

    def failed(self) -> bool:
        """A pass had failed beats: whether to say so."""
        self.failed_passes += 1
        return self.failed_passes == 2

    def succeeded(self) -> bool:
        """Every beat of a pass went through: whether a streak that was said has ended."""
        said, self.failed_passes = self.failed_passes >= 2, 0
        return said


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
        streak = Streak()
        while not self._stop.wait(self.interval):
            with self._lock:
                trials = list(self._trials.values())
            failed: list[int] = []
            cause = ""
            for trial in trials:
                try:
                    self.store.beat(trial)
                except optuna.exceptions.UpdateFinishedTrialError:
                    self.discard(trial.number)  # told between the copy and the beat
                except Exception as e:  # a storage hiccup: the next beat may go through
                    failed.append(trial.number)
                    cause = describe(e)
                    log.debug("heartbeat of trial %d failed: %s", trial.number, cause)
            self._said(streak, failed, len(trials), cause)

    def _said(self, streak: Streak, failed: list[int], beats: int, cause: str) -> None:
        """One line for a streak of failed passes (none once the storage is known lost)."""
        if not failed:
            if streak.succeeded():
                log.warning("heartbeats recorded again")
            return
        if streak.failed() and self.store.lost is None:
            log.warning("heartbeats of %d of %d running trials failed twice in a row (%s): "
                        "other drivers take a trial for dead after study.reclaim_after; "
                        "sweep keeps trying every %g s", len(failed), beats, cause,
                        self.interval)


# ---- the private Optuna APIs sweep relies on (see tests/study/test_store.py's contract test) --
