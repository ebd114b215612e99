"""`sweep summary`: trials versus GPU use, as a table on the terminal and a CSV file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from sweep.commands._args import Verbs, common, count, other_file


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep summary STUDY [--csv FILE] [--top N]`."""
    summ = verbs.add_parser("summary", help="trials versus GPU use: table and summary.csv")
    summ.add_argument("study", help="the study YAML file")
    summ.add_argument("--csv", help="where to write the CSV (default <output_dir>/summary.csv)")
    summ.add_argument("--top", type=count, default=5, help="how many best trials to show")
    summ.set_defaults(func=main)
    return common(summ)


def main(args: argparse.Namespace) -> int:
    """Write the CSV (where it can be: one asked for by name must be) and show the table."""
    from sweep._core import UsageError
    from sweep.analysis import summary

    s = summary.load(args.study, storage=args.storage)
    try:
        path: Path | None = s.save(Path(args.csv) if args.csv else None)
    except OSError as e:
        if args.csv:  # asked for by name: the user must know it is not there
            raise UsageError(f"{e.filename or args.csv}: cannot write the summary CSV there "
                             f"({e.strerror or e}); {other_file(e, '--csv')}") from None
        path = None  # a colleague's read-only results: the table all the same
        print(f"sweep: the summary CSV is not written: {e.filename}: {e.strerror or e}; "
              f"{other_file(e, '--csv')}", file=sys.stderr)
    console = Console()
    console.print(summary.render(s, args.top))
    if path is not None:
        console.print(f"CSV: {path}", highlight=False)
    return 0
