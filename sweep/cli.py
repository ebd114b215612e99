"""The command line: `sweep run | summary | report | status | logs | rerun | gpus |
storage-proxy`.

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
from pathlib import Path

from rich.console import Console
from rich.text import Text

from sweep import __version__
from sweep._core import stops
from sweep._core.errors import SweepError


def _gpu_list(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of GPU indices: {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"not a list of GPU indices: {text!r}")
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"a GPU listed twice: {text!r}")
    return ids


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    from sweep.commands import assembly as app
    from sweep.spec import config
    from sweep.study.storage import find

    spec = config.load(args.study, n_trials=args.n_trials, gpus=args.gpus, storage=args.storage)
    with find(spec) as found:  # read once; the run goes on with it
        spent, devices = app.pool_for(spec, found, str(args.study))
        if args.dry_run:
            lines = app.dry_run(spec, devices, found) if devices is not None else [
                f"# dry run: {spent.message if spent else ''}"]
            print("\n".join(lines))
            return 0
        console = Console(stderr=True, soft_wrap=True)
        result = app.run(spec, devices, found, console, report=args.report)
    style = "green" if result.exit_code == 0 else "red"
    console.print(Text(f"{spec.study.name}: {result.message}", style=style))
    if result.exit_code == 0:
        console.print(Text(f"summary: python -m sweep summary {args.study}"))
    return result.exit_code


def _summary(args: argparse.Namespace) -> int:
    from sweep._core.errors import UsageError
    from sweep.analysis import summary

    s = summary.load(args.study, storage=args.storage)
    try:
        path: Path | None = s.save(Path(args.csv) if args.csv else None)
    except OSError as e:
        if args.csv:  # asked for by name: the user must know it is not there
            raise UsageError(f"{e.filename or args.csv}: cannot write the summary CSV there "
                             f"({e.strerror or e}); {_other_file(e, '--csv')}") from None
        path = None  # a colleague's read-only results: the table all the same
        print(f"sweep: the summary CSV is not written: {e.filename}: {e.strerror or e}; "
              f"{_other_file(e, '--csv')}", file=sys.stderr)
    console = Console()
    console.print(summary.render(s, args.top))
    if path is not None:
        console.print(f"CSV: {path}", highlight=False)
    return 0


def _report(args: argparse.Namespace) -> int:
    from sweep._core.errors import UsageError
    from sweep.analysis import report

    try:
        path = report.report_file(args.study, Path(args.output) if args.output else None,
                                  args.storage)
    except OSError as e:
        raise UsageError(f"{e.filename or args.output}: cannot write the report there "
                         f"({e.strerror or e}); {_other_file(e, '-o')}") from None
    print(f"report: {path}")
    return 0


def _other_file(e: OSError, flag: str) -> str:
    """What to do when a file for the user cannot be written: name another with `flag`."""
    from sweep._core.safefs import UnsafePath

    if isinstance(e, UnsafePath):
        return f"give {flag} another file's name (sweep writes over no file it did not write)"
    return f"give {flag} a file you can write"


def _gpus(args: argparse.Namespace) -> int:
    from rich.table import Table

    from sweep._core.errors import UsageError
    from sweep.commands.assembly import nvml_reader
    from sweep.gpus import health, placement, pool, sicklist
    from sweep.gpus.hostlock import file_key, held_slots, usable_lock_dir
    from sweep.gpus.monitor import NvmlProbe
    from sweep.study.ownership import host_name

    folder = usable_lock_dir(host_name())  # before NVML is opened: nothing to close
    devices = pool.discover()
    for wanted in args.clear:
        chosen = [d for d in devices if wanted in ("all", str(d.index), d.uuid)]
        if not chosen:
            raise UsageError(f"sweep gpus --clear: no device {wanted!r} in this pool (give an "
                             "id as `sweep gpus` lists it, or all)")
        for d in chosen:
            if sicklist.clear(folder, d.uuid or f"sim{d.index}"):
                Console().print(f"GPU {d.index}: its sick record is cleared")
    reader, nvml = nvml_reader(devices)
    probe = NvmlProbe(reader) if nvml is not None else None
    table = Table(title="GPU pool" + (" (simulated)" if devices and devices[0].simulated else ""))
    for col in ("id", "name", "memory MB", "used MB", "util %", "sweep takes it?", "held by"):
        table.add_column(col)
    taken_out = sicklist.marks(folder)
    try:
        for d in devices:
            reading = reader.read(d.index)
            slots = held_slots(folder, d.uuid or f"sim{d.index}")
            holders = [f"{slots} sweep slot{'s' * (slots != 1)}"] if slots else []
            state = "yes (no NVML: nothing known)" if probe is None else "yes"
            look = probe.look(d.index) if probe is not None else None
            if look is not None:
                sweeps, visible = probe.sweep_pids(look.processes)  # type: ignore[union-attr]
                busy = placement.in_use_by_others(
                    look, sweeps, slots > 0, args.busy_memory_mb, visible)
                state = f"no: {busy}" if busy else "yes"
                holders += [_who(pid, mb, pid in sweeps) for pid, mb in look.processes.items()]
            counters = getattr(reader, "counters", None)  # NVML's; nothing on a simulated pool
            sick = health.counters_verdict(counters(d.index)) if counters else None
            if sick is not None:
                state = f"no: sick: {sick}"
            mark = taken_out.get(file_key(d.uuid or f"sim{d.index}"))
            if mark is not None:
                state += f"; {sicklist.shown(mark)}"
            total = d.memory_total_mb
            table.add_row(
                str(d.index), d.name, f"{total:.0f}" if total else "-",
                _num(reading.mem_used_mb), _num(reading.util_gpu), state,
                "; ".join(holders) or "-",
            )
    finally:
        if nvml is not None:
            nvml.close()
    Console().print(table)
    return 0


def _who(pid: int, mb: float | None, sweep: bool) -> str:
    """One process on a device: pid, user, name, memory."""
    import psutil

    try:
        proc = psutil.Process(pid)
        who = f"{proc.username()} {proc.name()}"
    except psutil.Error:
        who = "not visible here"
    used = "" if mb is None else f", {mb:.0f} MB"
    return f"pid {pid} ({who}{', a sweep trial' if sweep else ''}{used})"


def _num(value: float) -> str:
    return "-" if value != value else f"{value:.0f}"


def _status(args: argparse.Namespace) -> int:
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


def _logs(args: argparse.Namespace) -> int:
    from sweep.analysis import logs

    for chunk in logs.trial_log(args.study, args.number, args.stderr, args.follow, args.storage):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def _rerun(args: argparse.Namespace) -> int:
    from sweep.commands import assembly as app

    print(app.rerun(args.study, args.number, args.storage))
    return 0


def _storage_proxy(args: argparse.Namespace) -> int:
    import os

    from sweep._core.errors import UsageError
    from sweep.spec import config
    from sweep.spec.storageurl import StorageUrl, StorageUrlError
    from sweep.study import proxy

    url = args.storage or os.environ.get(config.STORAGE_ENV)
    if not url:
        raise UsageError("storage-proxy: give --storage URL (or set $SWEEP_STORAGE)")
    try:
        storage = StorageUrl.parse(url)
    except StorageUrlError as e:
        given = "--storage" if args.storage else f"${config.STORAGE_ENV}"
        raise UsageError(f"{given}: {e}") from None
    return proxy.serve(storage, args.host, args.port, args.threads)


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
                     help="print the commands of the next trials and exit; writes nothing")
    run.add_argument("--n-trials", type=int, metavar="N", help="override study.n_trials")
    run.add_argument("--gpus", type=_gpu_list, metavar="I,J",
                     help="override gpus.ids, e.g. 0,1")
    run.add_argument("--report", action="store_true",
                     help="write <output_dir>/report.html at the end (also study.report)")
    run.set_defaults(func=_run)

    summ = verbs.add_parser("summary", help="trials versus GPU use: table and summary.csv")
    summ.add_argument("study", help="the study YAML file")
    summ.add_argument("--csv", help="where to write the CSV (default <output_dir>/summary.csv)")
    summ.add_argument("--top", type=_count, default=5, help="how many best trials to show")
    summ.set_defaults(func=_summary)

    rep = verbs.add_parser("report", help="one HTML file of the study's figures, for a browser")
    rep.add_argument("study", help="the study YAML file")
    rep.add_argument("-o", "--output", metavar="FILE",
                     help="where to write it (default <output_dir>/report.html)")
    rep.set_defaults(func=_report)

    gpus = verbs.add_parser(
        "gpus", help="the GPU pool this shell would use: which devices a sweep would take")
    gpus.add_argument("--busy-memory-mb", type=_positive, default=1024.0, metavar="MB",
                      help="memory in use that makes a card busy (gpus.busy_memory_mb)")
    gpus.add_argument("--clear", metavar="ID", action="append", default=[],
                      help="give a device taken out as sick back: forget its record (an id "
                      "as listed, or all)")
    gpus.set_defaults(func=_gpus)

    status = verbs.add_parser("status", help="trial counts by state and what is running")
    status.add_argument("study", help="the study YAML file")
    status.set_defaults(func=_status)

    logs = verbs.add_parser("logs", help="print a trial's output")
    logs.add_argument("study", help="the study YAML file")
    logs.add_argument("number", type=int, help="the trial number")
    logs.add_argument("--stderr", action="store_true", help="its stderr (default stdout)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing while the trial runs")
    logs.set_defaults(func=_logs)

    rerun = verbs.add_parser("rerun", help="queue a trial's params again as a new trial")
    rerun.add_argument("study", help="the study YAML file")
    rerun.add_argument("number", type=int, help="the trial number to run again")
    rerun.set_defaults(func=_rerun)
    prox = verbs.add_parser(
        "storage-proxy", help="serve a database to many drivers (they use grpc://host:port)")
    prox.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    prox.add_argument("--port", type=int, default=13000, help="port (default 13000; 0: any)")
    prox.add_argument("--threads", type=int, default=64,
                      help="server threads (default 64; about two per driver is plenty)")
    prox.set_defaults(func=_storage_proxy)
    for sub in (run, summ, rep, gpus, status, logs, rerun, prox):
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks and debug logs")
    for sub in (run, summ, rep, status, logs, rerun, prox):
        sub.add_argument("--storage", metavar="URL",
                         help="override study.storage (also $SWEEP_STORAGE)")
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
