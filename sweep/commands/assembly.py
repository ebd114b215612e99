"""A run put together: its study opened once, its output folder claimed, then storage, pool,
monitor and progress around the driver.

`run` is what `sweep run` does, `run_file` what `sweep.run` does; `spent` says when a run has
nothing to do, before any device is looked for.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from sweep import schedulers
from sweep._core import SweepError, UnsafePath
from sweep.gpus import (
    SAMPLES_NAME,
    Device,
    HostSlots,
    Monitor,
    NoReader,
    Nvml,
    NvmlProbe,
    NvmlUnavailable,
    Pool,
    Rules,
    SampleReader,
    hostlock,
    lock_dir,
    pool,
)
from sweep.launch import make as launchers
from sweep.launch import provenance
from sweep.runner import EXIT_INTERRUPTED, EXIT_OK, Driver, Progress, RunResult, WallClock
from sweep.spec import Spec, config
from sweep.study import (
    FINISHED,
    Found,
    Owner,
    check_not_moved,
    check_stored,
    describe,
    find,
    host_name,
    storage_lost_errors,
)
from sweep.study.connect import connect
from sweep.trial import folders


def nvml_reader(devices: list[Device]) -> tuple[SampleReader, Nvml | None]:
    """What the monitor reads devices with: NVML, or nothing for a simulated pool."""
    if not devices or devices[0].simulated:
        return NoReader(), None
    try:
        nvml = Nvml()
    except NvmlUnavailable:
        return NoReader(), None
    return nvml, nvml


def run(spec: Spec, devices: list[Device] | None, found: Found,
        console: Console | None = None, report: bool = False) -> RunResult:
    """Run or continue the study to its budget on `devices`, with live progress (`None`
    where `spent` said the study has nothing left to run), going on with the storage `found`
    read; then, with `report` or `study.report`, refresh its report (`refresh_report`)."""
    result = execute(spec, devices, found, console)[0]
    if report or spec.study.report:
        refresh_report(spec, console)
    return result


def refresh_report(spec: Spec, console: Console | None = None) -> Path | None:
    """Write `<output_dir>/report.html` from what is stored now; a report that cannot be
    written is said in one line and does not change how the run ended."""
    from rich.text import Text

    from sweep.analysis import report

    console = console or Console(stderr=True, soft_wrap=True)
    try:
        summary, study = report.load_spec(spec)
        path = report.write(summary, study)
    except (OSError, SweepError) as e:
        elsewhere = ("; write it elsewhere: sweep report STUDY.yaml -o FILE"
                     if isinstance(e, UnsafePath) else "")
        console.print(Text(f"sweep: the report is not written: {e}{elsewhere}", style="red"))
        return None
    console.print(Text(f"report: {path}"))
    return path


def run_file(
    path: str | Path, *, n_trials: int | None = None, gpus: list[int] | None = None,
    storage: str | None = None, console: Console | None = None,
) -> Any:
    """`sweep.run`: run a study file in this process and return its `optuna.Study`.

    Ctrl-C (KeyboardInterrupt in a notebook) stops the trials as SIGINT does on the command
    line, then raises KeyboardInterrupt; a run that gives up raises SweepError.
    """
    spec = config.load(path, n_trials=n_trials, gpus=gpus, storage=storage)
    with find(spec) as found:
        result, study = execute(spec, pool_for(spec, found, str(path))[1], found, console)
    if spec.study.report:
        refresh_report(spec, console)
    if result.exit_code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt(result.message)
    if result.exit_code != 0:
        raise SweepError(result.message)
    return study


def pool_for(spec: Spec, found: Found, file: str) -> tuple[RunResult | None, list[Device] | None]:
    """What a run says when the study `found` has nothing left to run (`spent`), or else
    the devices it runs on (`gpus.ids` of the pool; a problem names `file`)."""
    said = spent(spec, found)
    return said, None if said else pool.select(pool.discover(), spec.gpus.ids, file)


def spent(spec: Spec, found: Found) -> RunResult | None:
    """What a run says when the stored study `found` has nothing left to run (its finished
    trials meet the budget, or under a scheduler its configurations do with nothing to carry
    on, and none is running), read without writing anything; None when it may have. Such a
    run needs no device pool."""
    if found.study is None:
        return None
    check_stored(spec, found.study)  # a file the stored study refuses is refused here too
    trials = found.trials()
    if any(t.state.name == "RUNNING" for t in trials) or _room(spec, trials) > 0:
        return None
    return _spent(spec, trials)


def _room(spec: Spec, trials: Sequence[Any]) -> int:
    """How many trials may start on the stored `trials`, as the driver counts them: under a
    scheduler, its jobs (`schedulers.jobs`: a lineage carried on runs whatever the budget,
    and `n_trials` counts configurations); else the budget less the finished trials."""
    if spec.study.scheduler is not None:
        return schedulers.jobs(schedulers.decisions(spec), spec.study.n_trials, trials,
                               spec.output_dir)
    return spec.study.n_trials - sum(t.state in FINISHED for t in trials)


def _spent(spec: Spec, trials: Sequence[Any]) -> RunResult:
    n = spec.study.n_trials
    why = None if spec.study.scheduler is None else schedulers.short_of(
        schedulers.decisions(spec), n, trials)
    if why is not None:  # pbt: configurations come from exploits only, and none can come
        return RunResult(EXIT_OK, f"nothing to run ({schedulers.configurations(trials)}/{n} "
                                  f"configurations): {why}")
    counted = (f"{schedulers.configurations(trials)}/{n} configurations"
               if spec.study.scheduler is not None else
               f"{sum(t.state in FINISHED for t in trials)}/{n} trials finished")
    return RunResult(EXIT_OK, f"the budget is spent ({counted}): nothing to run; raise "
                              "study.n_trials (or --n-trials) to run more")


def execute(
    spec: Spec, devices: list[Device] | None, found: Found, console: Console | None = None
) -> tuple[RunResult, Any]:
    """`run`, returning the `optuna.Study` too. Without `devices` (`spent` said the budget is
    spent) the study is checked against the file as for a run, and nothing runs. The study
    is opened once: the storage `found` read is gone on with where it can be."""
    import optuna

    # Optuna's warnings are about what sweep handles itself (e.g. a journal lock it waited for)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # before storage is touched: output_dir can be made, is this user's and this study's,
    # and so are the driver's folder and trials/; the host's lock folder can be trusted
    if devices is not None and found.study is not None and folders.read_marker(
            spec.output_dir) is None:  # a new folder: a study already run elsewhere stays
        check_not_moved(spec, found.trials(), host_name())
    folders.claim_output_dir(spec.output_dir, folders.owner_of(spec), spec.source)
    hostlock.usable_lock_dir(host_name())
    if devices is not None:  # the driver's folder and trials/ too: a link there is refused
        folders.make_driver_dirs(
            spec.output_dir, folders.driver_dir(spec.output_dir, host_name(), os.getpid()),
            spec.source)
    notes: list[str] = []
    store = connect(spec, Owner.me(host_name()), notes=notes, found=found)
    if devices is None:
        try:  # its finished trials (configurations) only grow: the budget stays spent
            return _spent(spec, store.study.get_trials(deepcopy=False)), store.study
        finally:
            store.close()
    reader, nvml = nvml_reader(devices)
    lease = make_pool(spec, devices, reader, nvml is not None, notes, host=True)
    own = folders.driver_dir(spec.output_dir, store.owner.host, store.owner.pid)
    clock = WallClock()  # the driver's; the monitor's samples on it, a sick device wakes it
    monitor = Monitor(reader, lease, own / SAMPLES_NAME, spec.gpus.sample_interval,
                      host=store.owner.host, history_s=spec.trainer.hang_after or 3600.0,
                      clock=clock.now, on_sick=clock.wake)
    # What is loaded now (the modules, the study's trials: Optuna caches them all) lives
    # through the run: kept out of the collector's passes, whose cost grows with the study
    # (at 10,000 trials, about 3 ms of every trial); given back after (a notebook's process).
    gc.freeze()
    try:
        with Progress(console, monitor) as progress:
            for note in notes:
                progress.message(note)
            record = provenance.RunRecord.find(
                spec, launchers.accelerate_record(spec),
                {d.index: {"name": d.name, "uuid": d.uuid} for d in devices},
                store.owner.host, nvml.system() if nvml is not None else (None, None))
            return Driver(spec, store, lease, monitor, progress, clock=clock,
                          record=record).run(), store.study
    except storage_lost_errors() as e:
        raise SweepError(lost_line(spec, store.lost or describe(e), store.untold)) from e
    finally:
        gc.unfreeze()
        clock.close()
        store.close()
        if nvml is not None:
            nvml.close()


def lost_line(spec: Spec, cause: str, untold: Sequence[int]) -> str:
    """The one line of a run that lost its storage: what happened, which trials it could not
    tell, and what to do."""
    left = ""
    if untold:
        shown = ", ".join(map(str, untold[:10])) + (", ..." if len(untold) > 10 else "")
        left = f"; {len(untold)} trial{'s' if len(untold) > 1 else ''} not told ({shown})"
    return (f"{spec.source}: lost the storage {spec.storage.shown} during the run "
            f"({spec.storage.redact(cause)}){left}; once it is back, run again: trials left "
            "RUNNING are reclaimed")


def make_pool(spec: Spec, devices: list[Device], reader: SampleReader, nvml: bool,
              notes: list[str] | None = None, host: bool = False) -> Pool:
    """The pool a run places its trials with: its slots per device, its rules, NVML (if
    `nvml`) and, with `host`, the slots shared by every sweep of this host."""
    capacity = spec.trials_per_gpu
    if spec.trainer.gpu_memory_gb is not None and not nvml:
        if notes is not None:
            notes.append("trainer.gpu_memory_gb needs NVML: on this simulated pool each "
                         f"device takes gpus.trials_per_gpu ({spec.gpus.trials_per_gpu}) "
                         "trials")
        capacity = spec.gpus.trials_per_gpu
    memory = spec.trainer.gpu_memory_gb
    rules = Rules(skip_busy=spec.gpus.skip_busy, busy_memory_mb=spec.gpus.busy_memory_mb,
                  want_mb=memory * 1024 if isinstance(memory, float) else None)
    slots = HostSlots(lock_dir(host_name()), capacity) if host else None
    return Pool(devices, capacity, host=slots, rules=rules,
                probe=NvmlProbe(reader) if nvml else None, width=spec.trainer.gpus_per_trial)
