"""`python -m sweep` and the `sweep` command: the command line (`sweep.cli`), with the stop
signals caught from the first instant, while its modules still import: SIGTERM, SIGHUP,
SIGUSR1 and SIGUSR2 then end it as Ctrl-C does (exit 130), as they do once it runs; Python's
default would have killed it (exit 138 for SIGUSR1, what Slurm sends before a time limit)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

EARLY = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _catch_stops() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in EARLY:
            signal.signal(signum, _interrupt)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # `nohup`: stays ignored
            signal.signal(signal.SIGHUP, _interrupt)


def main() -> int:
    """Run the command line; a stop signal at any moment before it handles them itself,
    even while the handlers go in, is exit 130 without a traceback."""
    try:
        _catch_stops()
        from sweep import cli

        return cli.main()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
