"""`python -m sweep` and the `sweep` command: the command line (`sweep.cli`), with the stop
signals caught from the first instant, while its modules still import, to the last, while
Python shuts down: SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 then end it as Ctrl-C does
(exit 130), as they do while it runs (`sweep._core.stops`). Python's default would have
killed it (exit 138 for SIGUSR1, what Slurm sends before a time limit; -15 for a SIGTERM
as it exits)."""

from __future__ import annotations

import atexit
import sys

from sweep._core import stops


def main() -> int:
    """Run the command line; a stop signal at any moment, even while the handlers go in or
    once the command has returned, is exit 130 without a traceback."""
    code = 130
    try:
        stops.catch()
        atexit.register(stops.last_exit_hook)  # the first registered runs last
        from sweep import cli

        code = cli.main()
    except KeyboardInterrupt:
        pass
    finally:  # no signal can raise after this line: they are noted
        stops.STATE.returned = True
    stops.STATE.code = 130 if stops.STATE.noted else code
    return stops.STATE.code


if __name__ == "__main__":
    sys.exit(main())
