"""The command line: `sweep run | summary | report | status | logs | rerun | gpus |
storage-proxy`, each verb a module of `sweep.commands`; here the parsing, the dispatch, and
how an error ends.

Every error a user can cause is one line on stderr (a study file's: one line per problem) and
exit code 2 (1 for a failed run, 130 when interrupted); `--debug` adds the traceback and keeps
the exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from sweep import __version__
from sweep._core import SweepError, stops
from sweep.commands import COMMANDS


def parser() -> argparse.ArgumentParser:
    """The command line: each verb's arguments from its module (`sweep.commands`)."""
    p = argparse.ArgumentParser(
        prog="sweep", description="Optuna sweeps where every trial gets its own GPU."
    )
    p.add_argument("--version", action="version", version=f"sweep {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for command in COMMANDS:
        command.add_parser(verbs)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # SIGINT, SIGTERM, SIGUSR1, SIGUSR2 or SIGHUP outside a running sweep (which handles them
    # itself) ends like Ctrl-C: exit 130. Under `nohup` (SIGHUP ignored) SIGHUP stays ignored.
    stops.catch()
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except SweepError as e:
        if args.debug:  # the traceback too, and the same exit code
            traceback.print_exc()
        for line in str(e).splitlines() or [""]:  # a study file's problems: one line each
            print(f"sweep: error: {line}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.debug:
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"sweep: error: {type(e).__name__}: {first} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
