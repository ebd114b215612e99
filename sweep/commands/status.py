"""`sweep status`: the study's trial counts by state, and each running trial: where, for how
long, its last value, and whether its driver is gone."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from sweep.commands._args import Verbs, common


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep status STUDY`."""
    status = verbs.add_parser("status", help="trial counts by state and what is running")
    status.add_argument("study", help="the study YAML file")
    status.set_defaults(func=main)
    return common(status)


def main(args: argparse.Namespace) -> int:
    """Print the counts, then one line per running trial."""
    from sweep.analysis import status

    now = status.status(args.study, storage=args.storage)
    console = Console()
    if not now.counts:
        console.print("no trials yet")
        return 0
    console.print(Text(", ".join(f"{n} {s}" for s, n in sorted(now.counts.items()))))
    for row in now.running.itertuples():
        if row.host is None or row.host != row.host:  # no owner on record yet
            console.print(Text(f"trial {row.number} RUNNING for {row.elapsed_s:.0f} s: asked, "
                               "no driver on record yet (one that died right after asking is "
                               "found out after study.reclaim_after)"))
            continue
        last = "" if row.last_step is None or row.last_step != row.last_step else (
            f", step {int(row.last_step)}: {row.last_value:.4g}")
        gone = "" if row.driver != "gone" else " (its driver is gone: the next run reclaims it)"
        place = f"GPUs {row.gpu}" if "," in str(row.gpu) else f"GPU {row.gpu}"
        silent = "" if row.silent_s != row.silent_s else f", silent for {row.silent_s:.0f} s"
        console.print(Text(f"trial {row.number} RUNNING on {place} ({row.host}) for "
                           f"{row.elapsed_s:.0f} s{last}{silent}{gone}"))
    return 0
