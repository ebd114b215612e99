"""The driver's clock and the signals that cut its wait short: a monotonic clock whose wait a
process event or a signal ends (`WallClock`), and the stop signals routed to the driver
(`signals_to`)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sweep._core import release_dead_terminal

# SIGHUP: the terminal closed; SIGUSR1/SIGUSR2: what Slurm (`--signal`) and submitit send
# before a time limit or a preemption
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # a repeat is dropped


@contextlib.contextmanager
def signals_to(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Route SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to `handler` inside the block;
    restore the old ones after. SIGHUP (a closed terminal, a dropped ssh session) is one more
    way to say stop; a terminal it left dead is first replaced by /dev/null
    (`terminal.release_dead_terminal`).
    A SIGHUP ignored when the block starts (`nohup`) stays ignored; one that comes after
    another signal is dropped (it asks to stop, never to hurry: a second Ctrl-C kills). So is
    a SIGTERM, SIGUSR1 or SIGUSR2 that came before (a scheduler sends one to every process
    of the job: the batch shell, srun, which forwards it, and the driver); a different one
    after it counts as a second signal.

    Outside the main thread (where Python cannot catch signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    routed = False
    seen: set[int] = set()

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal routed
        if signum == signal.SIGHUP:  # the terminal may be gone: what is printed goes nowhere
            release_dead_terminal()
            if routed:  # the terminal and the shell each send one: it asks to stop, once
                return
        if signum in SCHEDULER_SIGNALS and signum in seen:
            return  # a copy: Slurm signals srun and its tasks alike (srun forwards it)
        seen.add(signum)
        routed = True
        handler(signum, frame)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS
                if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class WallClock:
    """The driver's clock: monotonic time, and a wait that a process event or a signal cuts
    short (`wake` may be called from any thread or a signal handler)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._r, selectors.EVENT_READ)
        self._closing = threading.Lock()  # a reader thread may wake it as the run ends
        self._closed = False

    def now(self) -> float:
        return time.monotonic()

    def wait(self, timeout: float | None) -> None:
        """Sleep until `timeout` s have passed (None: until woken) or `wake` is called."""
        if self._selector.select(None if timeout is None else max(0.0, timeout)):
            try:
                os.read(self._r, 4096)
            except BlockingIOError:
                pass

    def wake(self) -> None:
        """Cut the current or next wait short. Safe from any thread, also after `close`, but
        not from a signal handler while `close` runs (the handlers are gone by then)."""
        if self._closed:
            return
        with self._closing:
            if self._closed:
                return
            try:
                os.write(self._w, b"x")
            except OSError:  # full: a wake is pending anyway
                pass

    def close(self) -> None:
        """Its pipe closed; again, nothing more."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._selector.close()
            os.close(self._r)
            os.close(self._w)
