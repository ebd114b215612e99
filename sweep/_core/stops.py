"""The stop signals outside the driver's loop (which routes them itself, `runner.clock`):
SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 end a command as Ctrl-C does (exit 130), from
the first instant to the last.

Until the command has returned, `interrupt` raises KeyboardInterrupt (inside `deferred`, at
the block's end: a process started there is the caller's to stop before it). Once it has
(`STATE.returned`, set by `sweep.__main__`), while Python shuts down (threads joined, exit
hooks run), a signal is only noted: raised there it printed a traceback and was lost (exit
0), and once Python had put its default handlers back it killed the process (exit -15).
`last_exit_hook`, run after every other exit hook, ends the process: exit 130 if one came.
Imports nothing of sweep but `terminal` (lazily).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class State:
    """Whether the command has returned, and the stop signals that came after it did (no
    dataclass: this module loads before anything else, and `dataclasses` takes long)."""

    def __init__(self) -> None:
        self.returned = False
        self.noted: list[int] = []
        self.code: int | None = None  # the command's exit code, once it returned
        self.deferring = 0  # `deferred` blocks the main thread is in
        self.deferred: int | None = None  # a stop signal that came in one


STATE = State()


def interrupt(signum: int, frame: Any) -> None:
    """The handler of every stop signal outside a run: KeyboardInterrupt, or once the
    command has returned, a note. SIGHUP first points a dead terminal at /dev/null."""
    if signum == signal.SIGHUP:  # the terminal may be gone: what is printed goes nowhere
        from sweep._core.terminal import release_dead_terminal

        release_dead_terminal()
    if STATE.returned:
        STATE.noted.append(signum)
        return
    if STATE.deferring:
        STATE.deferred = signum
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signal that comes inside the block raises KeyboardInterrupt at its end, not in
    the middle: `proc = subprocess.Popen(...)` in it has bound `proc` (the child's pid)
    before the interruption, so the caller's `finally` can stop the child. Python's Popen,
    interrupted while it waits for the child's exec, loses the child, which runs on.

    The stop wins over an error the block raises (it is raised in the error's place, not kept
    for a later block). Outside the main thread the block defers nothing: Python runs signal
    handlers in the main thread only, whose stops are its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STATE.deferring += 1
    try:
        yield
    finally:
        STATE.deferring -= 1
        if not STATE.deferring and STATE.deferred is not None:
            STATE.deferred = None
            raise KeyboardInterrupt  # in place of what the block raised, if it did


def catch() -> None:
    """Route every stop signal to `interrupt` (in the main thread; elsewhere Python cannot).
    A SIGHUP ignored (`nohup`) stays ignored. The command has not returned (again)."""
    if threading.current_thread() is not threading.main_thread():
        return
    STATE.returned, STATE.code, STATE.deferred = False, None, None
    STATE.noted.clear()
    for signum in STOPS:
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, interrupt)


def last_exit_hook() -> None:
    """Meant to be registered before any other exit hook, so it runs after them all: the
    process ends here, with exit 130 if a stop signal came since the command returned (noted,
    or still pending: they are blocked first), else with the command's exit code
    (`STATE.code`), its standard streams flushed. What Python would do after this hook (free
    its objects, put the default handlers back: a SIGTERM then killed it, exit -15) is left
    undone. Without a code (the command never returned) it only ends the process on a
    noted signal."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if STATE.noted or set(signal.sigpending()) & set(STOPS):
        os._exit(130)
    if STATE.code is not None:
        os._exit(STATE.code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
