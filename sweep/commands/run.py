"""`sweep run`: run (or continue) a study to its budget, or print the commands of its next
trials (`--dry-run`); the run's last line says how it ended. `sweep.run` is
`assembly.run_file`."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from sweep.commands._args import Verbs, common, gpu_list


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep run STUDY [--dry-run] [--n-trials N] [--gpus I,J] [--report]`."""
    run = verbs.add_parser("run", help="run (or continue) a study to its budget")
    run.add_argument("study", help="the study YAML file")
    run.add_argument("--dry-run", action="store_true",
                     help="print the commands of the next trials and exit; writes nothing")
    run.add_argument("--n-trials", type=int, metavar="N", help="override study.n_trials")
    run.add_argument("--gpus", type=gpu_list, metavar="I,J",
                     help="override gpus.ids, e.g. 0,1")
    run.add_argument("--report", action="store_true",
                     help="write <output_dir>/report.html at the end (also study.report)")
    run.set_defaults(func=main)
    return common(run)


def main(args: argparse.Namespace) -> int:
    """Run the study, or print its dry run; its exit code."""
    from sweep.commands import assembly
    from sweep.commands._dry_run import dry_run
    from sweep.spec import config
    from sweep.study import find

    spec = config.load(args.study, n_trials=args.n_trials, gpus=args.gpus, storage=args.storage)
    with find(spec) as found:  # read once; the run goes on with it
        spent, devices = assembly.pool_for(spec, found, str(args.study))
        if args.dry_run:
            lines = dry_run(spec, devices, found) if devices is not None else [
                f"# dry run: {spent.message if spent else ''}"]
            print("\n".join(lines))
            return 0
        console = Console(stderr=True, soft_wrap=True)
        result = assembly.run(spec, devices, found, console, report=args.report)
    style = "green" if result.exit_code == 0 else "red"
    console.print(Text(f"{spec.study.name}: {result.message}", style=style))
    if result.exit_code == 0:
        console.print(Text(f"summary: python -m sweep summary {args.study}"))
    return result.exit_code

