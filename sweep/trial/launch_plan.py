"""A trial as a command: its argv, environment and files, decided from its inputs (pure).

`build_launch` decides everything about a trial's process from its inputs and is unit-tested;
each launcher of `sweep.launch` plans with it, and `sweep.trial.process` carries the
plan out.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep import protocol
from sweep._core import fill
from sweep.spec import Spec, TrainerSection, accelconfig, env_name
from sweep.spec import container as containerspec
from sweep.trial import lineage
from sweep.trial.folders import TrialPaths

ACCELERATE_CONFIG_NAME = "accelerate_config.yaml"
# sweep's own accelerate config, shipped in the package (so a command sweep prints names a file
# that exists wherever sweep is installed): one process, no distribution, so a user's
# default_config.yaml cannot turn a trial into a multi-GPU torchrun job.
ACCELERATE_CONFIG_FILE = Path(__file__).with_name(ACCELERATE_CONFIG_NAME)
ACCELERATE_CONFIG = ACCELERATE_CONFIG_FILE.read_text()


@dataclass(frozen=True)
class LaunchConfig:
    """The accelerate config file trials launch with, and its distributed type when it is a
    study's own (`trainer.accelerate.config_file` merged: see `accelconfig`); None: sweep's
    shipped one-process config, to which `--multi_gpu` adds several processes."""

    path: Path
    distributed: str | None = None


SWEEP_CONFIG = LaunchConfig(ACCELERATE_CONFIG_FILE)


def tracker_env(study: str, number: int, trainer_env: Mapping[str, Any]) -> dict[str, str]:
    """What experiment trackers read to group a study's trials: W&B's run group (the study)
    and run name (`trial-N`), each unless `trainer.env` sets it."""
    mine = {"WANDB_RUN_GROUP": study, "WANDB_NAME": f"trial-{number}"}
    return {k: v for k, v in mine.items() if k not in trainer_env}


def launch_config(spec: Spec) -> tuple[LaunchConfig, accelconfig.Merged | None]:
    """The config a run of `spec` launches with: sweep's own, or the study's config file
    merged with sweep's settings (reads the file; the merged one is written by the launcher
    into `<output_dir>/cache/`, named by its content)."""
    source = spec.trainer.accelerate.config_file
    if source is None:
        return SWEEP_CONFIG, None
    merged = accelconfig.merge(accelconfig.read(source), spec.trainer.gpus_per_trial)
    return LaunchConfig(accelconfig.merged_path(merged, spec.output_dir / "cache"),
                        merged.distributed_type), merged


@dataclass(frozen=True)
class LaunchPlan:
    """What to run for one trial: argv and the variables set on top of the driver's env."""

    argv: list[str]
    env: dict[str, str]
    paths: TrialPaths
    result: Path  # the JSON file the metrics are read from (paths.result unless trainer.result)
    # When the command is a launcher (`accelerate launch`): the argument that names the
    # trainer in its own command line (the script, or the module), so that the guard can tell
    # when the trainer itself ended. None: the command is the trainer.
    trainer: str | None = None
    cwd: Path | None = None  # where the trial runs (`trainer.workdir`); None: the driver's

    def command_line(self) -> str:
        """The exact command, as a shell line a user can paste to rerun the trial by hand."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}"


def format_value(value: Any) -> str:
    """How a param value appears on the trainer's command line.

    Strings as they are; booleans `true`/`false`; None `null`; numbers in Python's shortest
    round-trip form; lists and mappings as JSON.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return json.dumps(value)


def param_args(
    params: Mapping[str, Any], passing: Mapping[str, Any] | None = None, prefix: str = "--"
) -> list[str]:
    """The params as the script's argv, in the order given.

    `--name value` (two elements) by default; a param's `arg` names its flag; prefix "" gives
    `name=value` (one element, Hydra style); a `flag` param gives `--name` when true and
    nothing when false.
    """
    out: list[str] = []
    for name, value in params.items():
        how = (passing or {}).get(name)
        own = how.prefix if how is not None and how.prefix is not None else prefix
        key = how.arg if how is not None and how.arg else f"{own}{name}"
        if getattr(how, "flag", False):
            out += [key] if value is True else []
        elif own == "":
            out.append(f"{key}={format_value(value)}")
        else:
            out += [key, format_value(value)]
    return out


def script_params(
    params: Mapping[str, Any], passing: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The params that go to the script: all but those `where: accelerate`."""
    return {k: v for k, v in params.items()
            if getattr((passing or {}).get(k), "where", "script") != "accelerate"}


def _env_text(value: Any) -> str:
    """An env value from the study file as text; YAML's booleans as `true` / `false`."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def build_launch(
    trainer: TrainerSection,
    number: int,
    params: Mapping[str, Any],
    device: int,
    paths: TrialPaths,
    accelerate_config: Path,
    python: str = sys.executable,
    passing: Mapping[str, Any] | None = None,
    places: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    pin: str | None = None,
    port: int | None = None,
    launcher_env: Mapping[str, str] | None = None,
    through_accelerate: bool = True,
    start: lineage.Start | None = None,
    study: str | None = None,
    distributed: str | None = None,
) -> LaunchPlan:
    """argv + env of one trial: `accelerate launch` pinned to `device` (or, not
    `through_accelerate`, plain python, with `launcher_env` beneath sweep's variables: the
    variables accelerate would set, for `direct`), by `pin` (its UUID; "a,b" for a trial of
    several devices) when given, else by its index.
    A trial of `trainer.gpus_per_trial` > 1 devices runs `--multi_gpu` with that many
    processes, its rendezvous on `port`.

    `passing` holds each param's `arg`/`prefix`/`flag`; `places` the placeholders of args,
    env and the result file besides {trial_dir} and {trial_number}; `environ` the driver's
    environment, for `$VAR` in args; `study` its name, for trackers (`tracker_env`);
    `distributed` the distributed type of `accelerate_config` when it is the study's own
    (`LaunchConfig`). The trial runs in `trainer.workdir` (relative to {study_dir}) when set.
    `start` is what the trial gets from its lineage (its checkpoint folder,
    `trainer.resume_args` when it resumes; default: a new lineage's).
    """
    start = start or lineage.Start(lineage.checkpoint_dir(paths.dir.parent.parent, number))
    places = {**(places or {}), "trial_dir": str(paths.dir), "trial_number": str(number),
              **lineage.places(start)}
    mine = script_params(params, passing)
    to_launcher = {k: v for k, v in params.items() if k not in mine}
    params = mine
    env = tracker_env(study, number, trainer.env) if study is not None else {}
    env.update({k: fill(_env_text(v), places) for k, v in trainer.env.items()})
    env.update({
        "CUDA_VISIBLE_DEVICES": pin or str(device),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        protocol.TRIAL_NUMBER_ENV: str(number),
        protocol.TRIAL_DIR_ENV: str(paths.dir),
        protocol.PARAMS_ENV: str(paths.params),
        protocol.RESULT_ENV: str(paths.result),
        protocol.REPORT_ENV: str(paths.reports),
    })
    env.update(lineage.env(start, trainer.env))
    if trainer.report is not None and trainer.report.stream is not None:
        env.setdefault("PYTHONUNBUFFERED", "1")  # each line reaches the log as it is printed
    if port is not None:
        env[protocol.PORT_ENV] = str(port)
    if trainer.pass_params == "env":
        env.update({env_name(k): format_value(v) for k, v in params.items()})
    trial_env = {**(environ if environ is not None else os.environ), **env}
    args = [fill(a, places, trial_env) for a in trainer.args]
    args += lineage.resume_args(trainer.resume_args, start, places, trial_env)
    if trainer.pass_params == "args":
        args += param_args(params, passing, trainer.prefix)
    entry = ["-m", str(trainer.module)] if trainer.module else [str(trainer.script)]
    tail = [*entry, *args]
    if through_accelerate:
        settings = accelerate_settings(trainer, accelerate_config, pin or str(device), port,
                                       to_launcher, distributed)
        if trainer.module:
            tail = ["--module", *tail[1:]]
        argv = [python, "-m", "accelerate.commands.launch", *settings, *tail]
    else:
        argv = [python, *tail]
        env = {**(launcher_env or {}), **env}  # what `accelerate launch` would set, then ours
    cwd = trial_cwd(trainer, places)
    result = result_path(trainer, paths, places, cwd)
    return LaunchPlan(argv, env, paths, result, entry[-1] if through_accelerate else None, cwd)


def accelerate_settings(
    trainer: TrainerSection, accelerate_config: Path, gpu_ids: str, port: int | None = None,
    to_launcher: Mapping[str, Any] | None = None, distributed: str | None = None,
) -> list[str]:
    """The options sweep gives `accelerate launch` for one trial (before the script).
    `distributed`: the distributed type of a study's own config (`LaunchConfig`): then
    `--multi_gpu` is given only for MULTI_GPU (the flag would make accelerate ignore the
    file's FSDP or DeepSpeed)."""
    width = trainer.gpus_per_trial
    multi = width > 1 and distributed in (None, "MULTI_GPU")
    settings = [
        "--config_file", str(accelerate_config),
        *(["--multi_gpu"] if multi else []),
        "--num_processes", str(width),
        "--num_machines", "1",
        "--gpu_ids", gpu_ids,
        *(["--main_process_port", str(port)] if port is not None else []),
    ]
    for name, value in (to_launcher or {}).items():
        flag = isinstance(value, bool)
        settings += ([f"--{name}"] if value else []) if flag else [
            f"--{name}", format_value(value)]
    acc = trainer.accelerate
    if acc.mixed_precision is not None:
        settings += ["--mixed_precision", acc.mixed_precision]
    if acc.dynamo_backend is not None:
        settings += ["--dynamo_backend", acc.dynamo_backend]
    return settings


def direct_settings(spec: Spec, params: Mapping[str, Any],
                    config: LaunchConfig = SWEEP_CONFIG) -> list[str]:
    """The `accelerate launch` options whose environment `launcher: direct` gives a trial of
    `params` with `config` (the device is sweep's to set: a stand-in here)."""
    to_launcher = {k: v for k, v in params.items()
                   if k not in script_params(params, spec.params)}
    return accelerate_settings(spec.trainer, config.path, "0", None, to_launcher,
                               config.distributed)


def plan_trial(
    spec: Spec, number: int, params: Mapping[str, Any], device: int,
    pin: str | None = None, port: int | None = None,
    launcher_env: Mapping[str, str] | None = None, through_accelerate: bool = True,
    start: lineage.Start | None = None,
    config: LaunchConfig = SWEEP_CONFIG,
) -> LaunchPlan:
    """`build_launch` for trial `number` of `spec`, with its files under `output_dir`, its
    interpreter (`trial_python`) and accelerate `config` (sweep's
    shipped `ACCELERATE_CONFIG_FILE` unless the study has its own: `launch_config`)."""
    return build_launch(spec.trainer, number, params, device,
                        TrialPaths.of(spec.output_dir, number), config.path,
                        python=trial_python(spec),
                        passing=spec.params, places=spec_places(spec), pin=pin, port=port,
                        launcher_env=launcher_env, through_accelerate=through_accelerate,
                        study=spec.study.name, distributed=config.distributed,
                        start=start)


def trial_python(spec: Spec) -> str:
    """The interpreter trials of `spec` run with: `trainer.python`, else the driver's own,
    or, in a container (`trainer.container`), the image's `python3`."""
    if spec.trainer.python:
        return spec.trainer.python
    return containerspec.DEFAULT_PYTHON if spec.trainer.container is not None else sys.executable


def trial_cwd(trainer: TrainerSection, places: Mapping[str, str]) -> Path | None:
    """Where a trial runs: `trainer.workdir` filled, from the study's folder; None: the
    driver's working directory."""
    if trainer.workdir is None:
        return None
    return Path(places.get("study_dir", ".")) / fill(trainer.workdir, places)


def result_path(trainer: TrainerSection, paths: TrialPaths, places: Mapping[str, str],
                cwd: Path | None) -> Path:
    """The trial's result file: `result.file` filled, from its `cwd`; else the one of
    `$SWEEP_RESULT_FILE` in its folder."""
    if trainer.result is None or trainer.result.file is None:
        return paths.result
    filled = Path(fill(trainer.result.file, places))
    return (cwd / filled if cwd is not None else filled).absolute()


def spec_places(spec: Spec) -> dict[str, str]:
    """The placeholders every trial of `spec` shares."""
    return {"study_dir": str(spec.source.parent), "output_dir": str(spec.output_dir)}
