"""`sweep report`: one offline HTML file of the study's figures, for a browser."""

from __future__ import annotations

import argparse
from pathlib import Path

from sweep.commands._args import Verbs, common, other_file


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep report STUDY [-o FILE]`."""
    rep = verbs.add_parser("report", help="one HTML file of the study's figures, for a browser")
    rep.add_argument("study", help="the study YAML file")
    rep.add_argument("-o", "--output", metavar="FILE",
                     help="where to write it (default <output_dir>/report.html)")
    rep.set_defaults(func=main)
    return common(rep)


def main(args: argparse.Namespace) -> int:
    """Write the report; say where."""
    from sweep._core import UsageError
    from sweep.analysis import report

    try:
        path = report.report_file(args.study, Path(args.output) if args.output else None,
                                  args.storage)
    except OSError as e:
        raise UsageError(f"{e.filename or args.output}: cannot write the report there "
                         f"({e.strerror or e}); {other_file(e, '-o')}") from None
    print(f"report: {path}")
    return 0
