"""A sweep put together: storage, pool, monitor and progress around the driver.

`run` and `dry_run` are what `sweep run` does; the command line only parses and reports.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from rich.console import Console

from sweep import config, launch
from sweep.config import Spec
from sweep.driver import Driver
from sweep.monitor import Monitor, NoReader, Reader
from sweep.nvml import Nvml, NvmlUnavailable
from sweep.policy import RunResult
from sweep.pool import Device, Pool
from sweep.progress import Progress
from sweep.store import FINISHED, Owner, Store, open_storage, open_study, read_study, unreachable

HOST_ENV = "SWEEP_HOST"


def host_name() -> str:
    """The host a driver records and judges ownership by: `$SWEEP_HOST`, else the hostname
    (containers that share one; tests that simulate several hosts on one machine)."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def open_store(spec: Spec, notes: list[str] | None = None) -> Store:
    """The study in its storage, opened by this process; an unreachable database is a usage
    error. What changed since earlier runs, and may, is added to `notes`."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    try:
        study = open_study(spec, open_storage(spec), notes)
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        raise unreachable(spec, e) from None
    return Store(study, Owner.me(host_name()), spec.study.reclaim_seconds,
                 grid=spec.study.sampler.type == "grid")


def nvml_reader(devices: list[Device]) -> tuple[Reader, Nvml | None]:
    """What the monitor reads devices with: NVML, or nothing for a simulated pool."""
    if not devices or devices[0].simulated:
        return NoReader(), None
    try:
        nvml = Nvml()
    except NvmlUnavailable:
        return NoReader(), None
    return nvml, nvml


def run(spec: Spec, devices: list[Device], console: Console | None = None) -> RunResult:
    """Run or continue the study to its budget on `devices`, with live progress."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    notes: list[str] = []
    store = open_store(spec, notes)
    lease = Pool(devices, spec.gpus.trials_per_gpu)
    reader, nvml = nvml_reader(devices)
    monitor = Monitor(reader, lease, spec.output_dir / "gpu_samples.csv",
                      spec.gpus.sample_interval)
    try:
        with Progress(console, monitor) as progress:
            for note in notes:
                progress.message(note)
            return Driver(spec, store, lease, monitor, progress).run()
    finally:
        if nvml is not None:
            nvml.close()


def dry_run(spec: Spec, devices: list[Device]) -> list[str]:
    """The commands of the next trials `run` would start, sampled in memory from a copy of the
    stored study (if there is one). Writes nothing, to storage or to disk."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=config.build_sampler(spec), directions=spec.study.objective_directions)
    for trial in _stored_trials(spec):
        study.add_trial(trial)
    for params in spec.study.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    trials = study.get_trials(deepcopy=False)
    started = sum(1 for t in trials if t.state in FINISHED or t.state.name == "RUNNING")
    lease = Pool(devices, spec.gpus.trials_per_gpu)
    n = max(0, min(lease.slots, spec.study.n_trials - started))
    lines = [f"# dry run: the next {n} of {spec.study.n_trials} trials ({started} done or "
             f"running in storage; params sampled in memory)"]
    dists = config.distributions(spec)
    for _ in range(n):
        trial = study.ask(dists)
        gpu = lease.lease(trial.number)
        plan = launch.plan_trial(spec, trial.number, {**trial.params, **spec.fixed}, gpu)
        lines.append(plan.command_line())
    return lines


def _stored_trials(spec: Spec) -> list[Any]:
    """The study's trials in storage, read without creating anything; [] if there are none."""
    study = read_study(spec)
    return [] if study is None else study.get_trials(deepcopy=False)
