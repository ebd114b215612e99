"""`sweep run --dry-run`: the commands of the next trials a run would start, each one shell
line that runs the trial when pasted, sampled in memory; nothing is written."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sweep import schedulers
from sweep.commands.assembly import make_pool, nvml_reader
from sweep.gpus import Device, Refusal, hostlock
from sweep.launch import make as launchers
from sweep.runner import Starter
from sweep.spec import Spec, searchspace
from sweep.study import FINISHED, Asked, Found, check_stored, host_name, sample
from sweep.trial import Lineage, command_script, folders, launch_plan


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
    decide = schedulers.decisions(spec)
    configs = schedulers.configurations(trials)
    jobs = schedulers.jobs(decide, spec.study.n_trials, trials, spec.output_dir)
    promotable = 0 if isinstance(decide, schedulers.Pbt) else len(decide.promotable(
        schedulers.history.read(trials)))
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
