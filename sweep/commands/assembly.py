"""A sweep put together: its study opened once, its output folder claimed, then storage,
pool, monitor and progress around the driver.

`run`, `dry_run` and `rerun` are what the verbs do; the command line only parses
and reports. `run_file` is `sweep.run` from Python.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from sweep._core.errors import SweepError, UsageError
from sweep._core.safefs import UnsafePath
from sweep.gpus import hostlock, pool
from sweep.gpus.hostlock import HostSlots, lock_dir
from sweep.gpus.monitor import SAMPLES_NAME, Monitor, NoReader, NvmlProbe, SampleReader
from sweep.gpus.nvml import Nvml, NvmlUnavailable
from sweep.gpus.placement import Refusal
from sweep.gpus.pool import Device, Pool, Rules
from sweep.runner import schedule_budget
from sweep.runner.driver import Driver
from sweep.runner.policy import EXIT_INTERRUPTED, EXIT_OK, RunResult
from sweep.runner.progress import Progress
from sweep.runner.schedulers import Pbt
from sweep.runner.starter import Starter
from sweep.spec import config, schema, searchspace
from sweep.spec.schema import Spec
from sweep.study import lineages
from sweep.study.attrs import RERUN_OF, Owner, OwnerRecord
from sweep.study.connect import check_not_moved, connect
from sweep.study.opening import check_stored, sample
from sweep.study.ownership import host_name
from sweep.study.storage import (
    Found,
    describe,
    find,
    reading,
    storage_errors,
    storage_lost_errors,
    unreachable,
)
from sweep.study.store import FINISHED, Asked
from sweep.trial import command_script, folders, launch_plan, launchers, provenance
from sweep.trial.lineage import Lineage


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
    scheduler, its jobs (`schedule_budget.jobs`: a lineage carried on runs whatever the budget,
    and `n_trials` counts configurations); else the budget less the finished trials."""
    if spec.study.scheduler is not None:
        return schedule_budget.jobs(schedule_budget.decisions(spec), spec.study.n_trials, trials,
                               spec.output_dir)
    return spec.study.n_trials - sum(t.state in FINISHED for t in trials)


def _spent(spec: Spec, trials: Sequence[Any]) -> RunResult:
    n = spec.study.n_trials
    why = None if spec.study.scheduler is None else schedule_budget.short_of(
        schedule_budget.decisions(spec), n, trials)
    if why is not None:  # pbt: configurations come from exploits only, and none can come
        return RunResult(EXIT_OK, f"nothing to run ({schedule_budget.configurations(trials)}/{n} "
                                  f"configurations): {why}")
    counted = (f"{schedule_budget.configurations(trials)}/{n} configurations"
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
    monitor = Monitor(reader, lease, own / SAMPLES_NAME, spec.gpus.sample_interval,
                      host=store.owner.host, history_s=spec.trainer.hang_after or 3600.0)
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
            return Driver(spec, store, lease, monitor, progress, record=record).run(), \
                store.study
    except storage_lost_errors() as e:
        raise SweepError(lost_line(spec, store.lost or describe(e), store.untold)) from e
    finally:
        gc.unfreeze()
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


def dry_run(spec: Spec, devices: list[Device], found: Found) -> list[str]:
    """The commands of the next trials `run` would start, sampled in memory from a copy of the
    stored study `found` (if there is one), each a shell line that runs the trial when pasted (see
    `runnable`), each trial built by the run's own `Starter` (dry: it writes nothing and spawns
    nothing). Writes nothing, to storage or to disk. Refuses, as `run` would, an output_dir
    that holds another study's trials."""
    import optuna

    folders.check_belongs(spec.output_dir, folders.owner_of(spec), spec.source)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=searchspace.build_sampler(spec.study.sampler, spec.searched, str(spec.source)),
        directions=spec.study.objective_directions)
    if found.study is not None:  # checked against the file as `run` checks it
        check_stored(spec, found.study)
    for stored in found.trials():
        study.add_trial(stored)
    for params in spec.study.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    trials = study.get_trials(deepcopy=False)
    started = sum(1 for t in trials if t.state in FINISHED or t.state.name == "RUNNING")
    reader, nvml = nvml_reader(devices)
    try:  # placed as a run would (its rules, NVLink first), other sweeps aside
        lease = make_pool(spec, devices, reader, nvml is not None)
        if spec.study.scheduler is None:
            n = max(0, min(lease.slots, spec.study.n_trials - started))
            lines = [f"# dry run: the next {n} of {spec.study.n_trials} trials ({started} "
                     "done or running in storage; params sampled in memory)"]
        else:  # n_trials counts configurations; queued continuations run whatever it says
            n, header = _scheduled_dry(spec, trials, lease.slots)
            lines = [header]
        if lease.slots == 0:
            lines.append(f"# no trial can start: {lease.acquire()}")
        ports = iter(hostlock.PORTS)  # the run leases free ones
        own = folders.driver_dir(spec.output_dir, host_name(), os.getpid())  # as a run would
        launcher = launchers.make(spec, host_name(), own, dry=True)
        starter = Starter(spec, launcher, own, time.monotonic, lambda: None, dry=True)
        lines += launcher.header()
        hidden = command_script.arg_secrets(spec.trainer.args, os.environ)
        for _ in range(n):
            held = lease.acquire()
            if isinstance(held, Refusal):
                shown = held.text if held.kind.ends_run else "devices full"
                lines.append(f"# no room for more now: {shown}")
                break
            trial = study.ask()
            params = sample(study, trial, spec.searched, (lambda n: searchspace.build_sampler(
                spec.study.sampler, spec.searched, str(spec.source), n))
                if searchspace.reseeds(spec.study.sampler) else None)
            held.bind(trial.number)
            port = next(ports) if spec.trainer.gpus_per_trial > 1 else None
            note = launcher.note({**params, **spec.fixed})
            if note is not None:
                lines.append(note)
            run = starter.start(Asked(trial, trial.number, params,
                                      Lineage.of(trial.user_attrs, trial.number)), held, port)
            plan, params = run.process.plan, run.params
            line = runnable(plan, launch_plan.script_params(params, spec.params), hidden)
            if line != runnable(plan, launch_plan.script_params(params, spec.params)) and (
                    LEFT_OUT not in lines):
                lines.append(LEFT_OUT)
            lines.append(line)
    finally:
        if nvml is not None:
            nvml.close()
    return lines


def _scheduled_dry(spec: Spec, trials: Sequence[Any], slots: int) -> tuple[int, str]:
    """How many trials a scheduler's dry run shows (queued attempts, then new configurations:
    a promotion is decided by the run, so it is counted, not shown), and its first line."""
    decide = schedule_budget.decisions(spec)
    configs = schedule_budget.configurations(trials)
    jobs = schedule_budget.jobs(decide, spec.study.n_trials, trials, spec.output_dir)
    promotable = 0 if isinstance(decide, Pbt) else len(decide.promotable(lineages.read(trials)))
    n = max(0, min(slots, jobs - promotable))
    return n, (f"# dry run: the next {n} trials ({configs}/{spec.study.n_trials} "
               "configurations in storage; queued continuations first; params sampled in "
               "memory)" + (f"; {promotable} paused trial{'s' if promotable > 1 else ''} "
                            "promotable, not shown" if promotable else ""))


LEFT_OUT = ("# secrets are left out of these lines, as of command.sh: set the variables they "
            "name in your environment, and put back what is written as ***")


def runnable(plan: launch_plan.LaunchPlan, params: Mapping[str, Any],
             secrets: Mapping[str, str] | None = None) -> str:
    """A trial's command as a dry run prints it: one shell line that runs when pasted, its
    trial folder and params.json made first (a run makes them; a dry run writes nothing).
    With `secrets` (`command_script.arg_secrets`), secrets are left out as command.sh leaves them
    out: a variable's value by a reference to it, a password or token in an argument as
    `***`."""
    folder, file = shlex.quote(str(plan.paths.dir)), shlex.quote(str(plan.paths.params))
    text = shlex.quote(json.dumps(dict(params)))
    cwd = "" if plan.cwd is None else (  # `trainer.workdir`: made, and run in
        f"mkdir -p {shlex.quote(str(plan.cwd))} && cd {shlex.quote(str(plan.cwd))} && ")
    command = (plan.command_line() if secrets is None else
               command_script.command_script(plan, secrets).rstrip("\n").splitlines()[-1])
    return f"mkdir -p {folder} && printf '%s\\n' {text} > {file} && {cwd}{command}"


def _same_params(path: str | Path, number: int, params: Mapping[str, Any],
                 spec: schema.Spec) -> None:
    """UsageError unless the study file searches exactly the params trial `number` ran with:
    a param it no longer has, has fixed to a value, or has newly would make the rerun run
    something else than that trial."""
    for name, value in params.items():
        if name in spec.fixed and spec.fixed[name] != value:
            raise UsageError(
                f"{path}: params.{name}: trial {number} ran {name}={value!r}, the file now "
                f"fixes it at {spec.fixed[name]!r}: a rerun would not run trial {number}; "
                f"search params.{name} again to rerun it")
        if name not in spec.params:
            raise UsageError(
                f"{path}: params.{name}: trial {number} ran {name}={value!r}, the file no "
                f"longer has it: a rerun would not run trial {number}; put params.{name} back "
                "to rerun it")
    new = sorted(set(spec.searched) - set(params))
    if new and params:
        raise UsageError(
            f"{path}: params.{new[0]}: trial {number} had no {new[0]} (the file searches it "
            f"since): a rerun would sample it anew; make it `type: fixed` or remove it to "
            f"rerun trial {number}")


def rerun(path: str | Path, number: int, storage: str | None = None) -> str:
    """Queue trial `number`'s params as a new trial (recorded as `rerun_of`); what to say."""
    spec = config.load(path, runnable=False, storage=storage)
    with reading(spec) as study:
        trials = study.get_trials(deepcopy=False) if study is not None else []
        if study is None or number < 0 or number >= len(trials):
            raise UsageError(f"{path}: no trial {number} in study {spec.study.name!r}")
        check_stored(spec, study)
        old = trials[number]
        if not old.params and spec.searched:
            raise UsageError(f"{path}: trial {number} has no params yet ({old.state.name})")
        _same_params(path, number, old.params, spec)
        for name, value in old.params.items():
            param = spec.searched.get(name)
            problem = None if param is None else searchspace.outside(param, value)
            if problem is not None:
                raise UsageError(
                    f"{path}: params.{name}: trial {number}'s value {problem}: the file no "
                    f"longer searches it; widen params.{name} to rerun this trial")
        try:
            study.enqueue_trial(dict(old.params), user_attrs={RERUN_OF: number},
                                skip_if_exists=False)
        except storage_errors() as e:  # a read-only database, one gone: its own words
            raise unreachable(spec, e, "write to") from None
    # the budget once every trial that is running or queued (this one too) has run
    needed = 1 + sum(1 for t in trials
                     if t.state in FINISHED or t.state.name in ("RUNNING", "WAITING"))
    budget = spec.study.n_trials
    if spec.study.scheduler is not None:  # a queued trial runs whatever n_trials says
        made = schedule_budget.configurations(trials) + 1
        note = "it runs at the next `sweep run`, before new configurations" + (
            "" if made <= budget else f", {made - budget} more than study.n_trials "
            f"({made} configurations of {budget}: a queued trial runs whatever the budget "
            "says)")
    elif needed <= budget:
        note = "it runs at the next `sweep run`, before new trials"
    else:
        note = (f"the budget of {budget} leaves no room for it: `sweep run {path} "
                f"--n-trials {needed}` runs it (and what is running or queued before it)")
    now = provenance.RunRecord.find(spec, launchers.accelerate_record(spec))
    record = OwnerRecord.of(old.user_attrs)
    then = provenance.recorded(old.user_attrs, record.dir if record else None)
    changed = provenance.differences(then, now.versions())
    told = f"queued trial {number}'s params again; {note}"
    return told if changed is None else f"{told} (note: since trial {number} ran, {changed})"
