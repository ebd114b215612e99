"""The command line: `sweep run | summary | gpus | status`.

Every error a user can cause is one line on stderr and exit code 2 (1 for a failed run, 130
when interrupted); the traceback is shown only with `--debug`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from sweep import __version__
from sweep.errors import SweepError, UsageError


def _run(args: argparse.Namespace) -> int:
    from sweep import config, pool

    spec = config.load(args.study)
    devices = pool.select(pool.discover(), spec.gpus.ids, str(args.study))
    if args.dry_run:
        return _dry_run(spec, devices)

    import optuna

    from sweep.driver import Driver, open_storage, open_study
    from sweep.monitor import Monitor
    from sweep.progress import Progress

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(spec, _storage(spec, open_storage))
    lease = pool.Pool(devices, spec.gpus.trials_per_gpu)
    reader, nvml = _reader(devices)
    driver: Driver | None = None
    monitor = Monitor(
        reader, [d.index for d in devices], spec.output_dir / "gpu_samples.csv",
        spec.gpus.sample_interval,
        pids_of=lambda n: _trial_pids(driver, n),
    )
    console = Console(stderr=True, soft_wrap=True)
    try:
        with Progress(console, monitor) as progress:
            driver = Driver(spec, study, lease, monitor, progress)
            result = driver.run()
    finally:
        if nvml is not None:
            nvml.close()
    style = "green" if result.exit_code == 0 else "red"
    console.print(f"[{style}]{spec.study.name}: {result.message}[/]", highlight=False)
    if result.exit_code == 0:
        console.print(f"summary: python -m sweep summary {args.study}", highlight=False)
    return result.exit_code


def _trial_pids(driver, number: int) -> set[int]:
    """The process tree of a running trial (called from the monitor's thread)."""
    run = driver.running.get(number) if driver is not None else None
    return run.process.tree_pids() if run is not None else set()


def _storage(spec, open_storage):
    """Open the study's storage; a database that cannot be reached is a usage error."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return open_storage(spec)
    except SQLAlchemyError as e:
        shown = make_url(spec.storage_url).render_as_string(hide_password=True)
        cause = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise UsageError(f"{spec.source}: study.storage: cannot open {shown}: {cause}") from None


def _reader(devices: list) -> tuple[object, object]:
    from sweep.monitor import NoReader
    from sweep.nvml import Nvml, NvmlUnavailable

    if not devices or devices[0].simulated:
        return NoReader(), None
    try:
        nvml = Nvml()
    except NvmlUnavailable:
        return NoReader(), None
    return nvml, nvml


def _dry_run(spec, devices) -> int:
    """Print the commands of the first trials, sampled in memory: storage is not touched."""
    import optuna

    from sweep import config, launch, pool

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=config.build_sampler(spec), directions=spec.study.objective_directions
    )
    for params in spec.study.enqueue:
        study.enqueue_trial(params)
    lease = pool.Pool(devices, spec.gpus.trials_per_gpu)
    dists = config.distributions(spec)
    n = min(lease.slots, spec.study.n_trials)
    print(f"# dry run: the first {n} of {spec.study.n_trials} trials (params sampled in memory)")
    for _ in range(n):
        trial = study.ask(dists)
        gpu = lease.lease(trial.number)
        paths = launch.TrialPaths.of(spec.output_dir, trial.number)
        plan = launch.build_launch(
            spec.trainer, trial.number, {**trial.params, **spec.fixed}, gpu, paths,
            spec.output_dir / "accelerate_config.yaml",
        )
        print(plan.command_line())
    return 0


def _summary(args: argparse.Namespace) -> int:
    from sweep import summary

    s = summary.load(args.study)
    path = s.save(Path(args.csv) if args.csv else None)
    console = Console()
    console.print(summary.render(s, args.top))
    console.print(f"CSV: {path}", highlight=False)
    return 0


def _gpus(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sweep import pool
    from sweep.monitor import NoReader

    devices = pool.discover()
    reader, nvml = _reader(devices)
    table = Table(title="GPU pool" + (" (simulated)" if devices and devices[0].simulated else ""))
    for col in ("id", "name", "memory MB", "used MB", "util %", "state"):
        table.add_column(col)
    try:
        for d in devices:
            reading = reader.read(d.index)
            procs = reader.compute_processes(d.index)
            state = "unknown" if isinstance(reader, NoReader) else ("busy" if procs else "free")
            total = d.memory_total_mb
            table.add_row(
                str(d.index), d.name, f"{total:.0f}" if total else "-",
                _num(reading.mem_used_mb), _num(reading.util_gpu), state,
            )
    finally:
        if nvml is not None:
            nvml.close()
    Console().print(table)
    return 0


def _num(value: float) -> str:
    return "-" if value != value else f"{value:.0f}"


def _status(args: argparse.Namespace) -> int:
    from sweep import summary

    s = summary.load(args.study)
    t = s.trials
    console = Console()
    if t.empty:
        console.print("no trials yet")
        return 0
    console.print(t["state"].value_counts().to_string(), highlight=False)
    running = t[t["state"] == "RUNNING"]
    for _, row in running.iterrows():
        console.print(
            f"trial {row['number']} RUNNING on GPU {row['gpu']} ({row['host']})", highlight=False
        )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sweep", description="Optuna sweeps where every trial gets its own GPU."
    )
    p.add_argument("--version", action="version", version=f"sweep {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser("run", help="run (or continue) a study to its budget")
    run.add_argument("study", help="the study YAML file")
    run.add_argument("--dry-run", action="store_true",
                     help="print the commands of the first trials and exit; writes nothing")
    run.set_defaults(func=_run)

    summ = verbs.add_parser("summary", help="trials versus GPU use: table and summary.csv")
    summ.add_argument("study", help="the study YAML file")
    summ.add_argument("--csv", help="where to write the CSV (default <output_dir>/summary.csv)")
    summ.add_argument("--top", type=int, default=5, help="how many best trials to show")
    summ.set_defaults(func=_summary)

    gpus = verbs.add_parser("gpus", help="list the GPU pool this shell would use")
    gpus.set_defaults(func=_gpus)

    status = verbs.add_parser("status", help="trial counts by state and what is running")
    status.add_argument("study", help="the study YAML file")
    status.set_defaults(func=_status)
    for sub in (run, summ, gpus, status):
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks and debug logs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except SweepError as e:
        if args.debug:
            raise
        print(f"sweep: error: {e}", file=sys.stderr)
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
