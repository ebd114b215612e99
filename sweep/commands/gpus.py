"""`sweep gpus`: the GPU pool this shell would use, which devices a sweep would take and who
holds them; `--clear` gives a device taken out as sick back."""

from __future__ import annotations

import argparse

from rich.console import Console

from sweep.commands._args import Verbs, common, positive


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep gpus [--busy-memory-mb MB] [--clear ID]...`."""
    gpus = verbs.add_parser(
        "gpus", help="the GPU pool this shell would use: which devices a sweep would take")
    gpus.add_argument("--busy-memory-mb", type=positive, default=1024.0, metavar="MB",
                      help="memory in use that makes a card busy (gpus.busy_memory_mb)")
    gpus.add_argument("--clear", metavar="ID", action="append", default=[],
                      help="give a device taken out as sick back: forget its record (an id "
                      "as listed, or all)")
    gpus.set_defaults(func=main)
    return common(gpus, storage=False)


def main(args: argparse.Namespace) -> int:
    """Clear what `--clear` names, then print the pool as a table."""
    from rich.table import Table

    from sweep._core import UsageError
    from sweep.commands.assembly import nvml_reader
    from sweep.gpus import (
        NvmlProbe,
        file_key,
        health,
        held_slots,
        placement,
        pool,
        sicklist,
        usable_lock_dir,
    )
    from sweep.study import host_name

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
