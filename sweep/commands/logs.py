"""`sweep logs`: a trial's stdout (or stderr), followed while it runs with `--follow`."""

from __future__ import annotations

import argparse
import sys

from sweep.commands._args import Verbs, common


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep logs STUDY NUMBER [--stderr] [--follow]`."""
    logs = verbs.add_parser("logs", help="print a trial's output")
    logs.add_argument("study", help="the study YAML file")
    logs.add_argument("number", type=int, help="the trial number")
    logs.add_argument("--stderr", action="store_true", help="its stderr (default stdout)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing while the trial runs")
    logs.set_defaults(func=main)
    return common(logs)


def main(args: argparse.Namespace) -> int:
    """Print the log as it comes."""
    from sweep.analysis import logs

    for chunk in logs.trial_log(args.study, args.number, args.stderr, args.follow, args.storage):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0
