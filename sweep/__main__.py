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


def main() -> int:
    if threading.current_thread() is threading.main_thread():
        for signum in EARLY:
            signal.signal(signum, _interrupt)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # `nohup`: stays ignored
            signal.signal(signal.SIGHUP, _interrupt)
    try:
        from sweep import cli
    except KeyboardInterrupt:
        return 130
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
