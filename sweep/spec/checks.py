"""What spans a study file's sections, checked once it is validated: paths resolved against
the study file, params given to `accelerate launch`, environment variables that clash, the
output_dir, and the `trainer.report` sources against the metrics (`resolve`)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sweep._core import ConfigError, Problem, compile_pattern, placeholders, short
from sweep.protocol import PER_TRIAL, RESULT_ENV
from sweep.spec import _container_checks, accelconfig, interpreter, searchspace, storageurl
from sweep.spec import container as containerspec
from sweep.spec import scheduler as scheduler_spec
from sweep.spec.schema import (
    ReportSection,
    Spec,
    TrainerSection,
)
from sweep.spec.searchspace import (
    BoolParam,
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
    Param,
)

# `accelerate launch` options a param may search (`where: accelerate`); the rest are sweep's
# own (num_processes, gpu_ids, config_file...) or no per-trial choice.
ACCELERATE_OPTIONS = ("mixed_precision", "dynamo_backend", "dynamo_mode",
                      "dynamo_use_fullgraph", "dynamo_use_dynamic",
                      "num_cpu_threads_per_process")
ACCELERATE_VALUES = {
    "mixed_precision": ("no", "fp16", "bf16"),
    "dynamo_mode": ("default", "reduce-overhead", "max-autotune",
                    "max-autotune-no-cudagraphs"),
}


def _accelerate_values(name: str, param: Param) -> str | None:
    """What is wrong with the values a `where: accelerate` param can take, or None."""
    if name in ("dynamo_use_fullgraph", "dynamo_use_dynamic"):
        if isinstance(param, BoolParam) or (
                isinstance(param, FixedParam) and isinstance(param.value, bool)):
            return None
        return "an accelerate flag: give it as type: bool"
    values: list[Any] = []
    if isinstance(param, CategoricalParam):
        values = list(param.choices)
    elif isinstance(param, FixedParam):
        values = [param.value]
    allowed = ACCELERATE_VALUES.get(name)
    if allowed is not None:
        if not isinstance(param, (CategoricalParam, FixedParam)):
            return f"one of {', '.join(allowed)}: give it as type: categorical"
        bad = [v for v in values if v not in allowed]
        if bad:
            return (f"accelerate takes {', '.join(allowed)}, not "
                    f"{short(', '.join(map(str, bad)), 40)}")
    if name == "num_cpu_threads_per_process":
        low = param.low if isinstance(param, IntParam) else None
        if isinstance(param, FloatParam) or (low is not None and low < 1) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            return "a whole number of threads, 1 or more"
    if name == "dynamo_backend" and (not values or not all(isinstance(v, str) for v in values)):
        return "backend names (e.g. inductor): give them as type: categorical"
    return None


MAX_ARG_BYTES = 120_000  # of one param's value as text: Linux takes 128 KB per argv or env string


def _text_size(value: Any) -> int:
    """Bytes of a param value as the trainer's command line or environment carries it."""
    return len((value if isinstance(value, str) else json.dumps(value, default=str)).encode())


def resolve(spec: Spec, path: Path, runnable: bool = True) -> Spec:
    """Make paths absolute, fill defaults that depend on the file's place, check what exists
    and what needs more than one section; every problem found is raised at once."""
    file, base = str(path), path.resolve().parent
    study, trainer = spec.study, spec.trainer
    problems: list[Problem] = []

    def bad(key: str, message: str) -> None:
        problems.append(Problem(file, key, message))

    def check(step: Any, *args: Any) -> None:
        try:
            step(*args)
        except ConfigError as e:
            problems.extend(e.problems)

    storage = study.storage or f"sqlite:///{base / (study.name + '.db')}"
    parsed: storageurl.StorageUrl | None = None
    try:
        parsed = storageurl.check(file, storage, spec.storage_from)
    except ConfigError as e:
        problems.extend(e.problems)
    output_dir = base / (study.output_dir or study.name)
    if runnable:
        check(_check_output_dir, file, output_dir)
    for i, arg in enumerate(trainer.args):
        check(placeholders.check, file, f"trainer.args.{i}", arg)
    if runnable:  # $NAME comes from the environment sweep runs in
        known = trial_variables(trainer, spec.params, os.environ)
        for key, args in (("args", trainer.args), ("resume_args", trainer.resume_args)):
            for i, arg in enumerate(args):
                check(placeholders.check_variables, file, f"trainer.{key}.{i}", arg, known)
    for name, value in trainer.env.items():
        check(placeholders.check, file, f"trainer.env.{short(name, 40)}", str(value))
    for i, arg in enumerate(trainer.resume_args):
        check(placeholders.check, file, f"trainer.resume_args.{i}", arg, ("last_checkpoint",))
    if trainer.result is not None and trainer.result.file is not None:
        check(placeholders.check, file, "trainer.result.file", trainer.result.file)
    if trainer.result is not None and trainer.result.patterns:
        groups = {g for p in trainer.result.patterns for g in compile_pattern(p).groupindex}
        for metric in study.objective_metrics:
            if metric not in groups:
                bad(f"trainer.result.{trainer.result.stream}", f"no named group for the "
                    f"metric {metric!r}: add (?P<{metric}>...) to a pattern")
    if trainer.report is not None:
        problems.extend(_report_problems(file, trainer.report, study.objective_metrics))
    problems.extend(_logged_params_problems(file, spec))
    for name, param in spec.params.items():
        if param.where != "accelerate":
            continue
        if trainer.launcher == "python":
            bad(f"params.{name}.where", "accelerate options need trainer.launcher: "
                "accelerate (or direct, warm)")
        elif name not in ACCELERATE_OPTIONS:
            bad(f"params.{name}.where", f"not an `accelerate launch` option sweep can search: "
                f"{short(name, 40)} (one of: {', '.join(ACCELERATE_OPTIONS)})")
        elif getattr(trainer.accelerate, name, None) is not None:
            bad(f"params.{name}", f"also set in trainer.accelerate.{name}; give it in one place")
        else:
            problem = _accelerate_values(name, param)
            if problem:
                bad(f"params.{name}", problem)
    if trainer.pass_params != "file":
        for name, param in spec.params.items():
            values = [param.value] if isinstance(param, FixedParam) else getattr(
                param, "choices", [])
            size = max((_text_size(v) for v in values), default=0)
            if size > MAX_ARG_BYTES:
                bad(f"params.{name}", f"a value of {size:,} bytes as text: sweep passes at "
                    f"most {MAX_ARG_BYTES:,} in one argument or environment variable (Linux "
                    "takes 128 KiB, less the name); use trainer.pass_params: file")
    if trainer.pass_params == "env":
        for key, message in _env_clashes(spec):
            bad(key, message)
    for name in trainer.env:
        if not ENV_NAME.match(name):
            bad(f"trainer.env.{short(name, 40)}", "not an environment variable name (letters, "
                "digits and _, not starting with a digit)")
        elif name in PER_TRIAL:
            bad(f"trainer.env.{name}", PER_TRIAL_WHY.get(name, "sweep sets it for each trial "
                "(its own value would be replaced): remove it from trainer.env"))
    script = None
    if trainer.script is not None:
        script = (base / trainer.script).resolve()
        if runnable and not script.is_file():
            bad("trainer.script", f"no such file: {script}")
    for i, params in enumerate(study.enqueue):
        unknown = sorted(set(params) - set(spec.searched))
        if unknown:
            bad(f"study.enqueue.{i}", f"not a searched param: {', '.join(unknown)}")
        for name, value in params.items():
            dim = spec.searched.get(name)
            problem = searchspace.outside(dim, value) if dim is not None else None
            if problem:
                bad(f"study.enqueue.{i}.{name}", problem)
    if study.pruner.type != "none" and study.directions is not None:
        bad("study.pruner", "Optuna cannot prune multi-objective studies")
    problems.extend(scheduler_spec.problems(file, study.scheduler, study.pruner,
                                            study.directions is not None, study.n_trials,
                                            spec.searched))
    fixed = None
    if trainer.workdir is not None:
        check(placeholders.check, file, "trainer.workdir", trainer.workdir)
        fixed = base / placeholders.fill(trainer.workdir, {}) if "{" not in trainer.workdir \
            else None  # the same folder for every trial: checked now
        if runnable and fixed is not None and fixed.exists() and not fixed.is_dir():
            bad("trainer.workdir", f"{fixed} is a file, not a folder: name a folder (made if "
                "missing) or a placeholder path such as \"{trial_dir}\"")
    probe = runnable  # the trainer's interpreter is asked about itself
    if trainer.container is not None:
        mounted = _container_checks.Mounted(
            base, output_dir, (("trainer.script", "the script", script),) if script else (),
            fixed)
        try:
            trainer = trainer.model_copy(update={"container": _container_checks.resolve(
                file, mounted, trainer.container, trainer.launcher, runnable)})
        except ConfigError as e:
            problems.extend(e.problems)
            probe = False  # nothing runs in an image that is not there
    python, config_file = _trainer_environment(file, base, trainer, probe, bad)
    accelerate = trainer.accelerate.model_copy(update={"config_file": config_file})
    resolved = spec.model_copy(
        update={
            "study": study.model_copy(update={"storage": storage, "output_dir": output_dir}),
            "trainer": trainer.model_copy(update={"script": script, "python": python,
                                                  "accelerate": accelerate}),
            "source": path.resolve(),
        }
    )
    if runnable:
        for key, build in (
            ("study.sampler", lambda: searchspace.build_sampler(
                study.sampler, spec.searched, file)),
            ("study.pruner", lambda: searchspace.build_pruner(study.pruner, file)),
        ):
            try:
                build()
            except ConfigError as e:
                problems.extend(e.problems)
            except (TypeError, ValueError) as e:
                bad(key, str(e).splitlines()[0])
    if problems or parsed is None:
        raise ConfigError.of(problems)
    return resolved.with_storage(parsed)


def _trainer_environment(file: str, base: Path, trainer: TrainerSection, runnable: bool,
                         bad: Callable[[str, str], None]) -> tuple[str | None, Path | None]:
    """`trainer.python` (absolute; a name without a slash is looked up on PATH) and
    `trainer.accelerate.config_file` (absolute), checked when `runnable`: the interpreter runs
    and has accelerate where the launcher needs it; the config file is one the trainer's
    accelerate takes and sweep can honour (`accelconfig.problems`)."""
    python = trainer.python
    inside = trainer.container  # then trainer.python is the image's, and is asked there
    if python is not None and inside is None:
        found = shutil.which(python) if "/" not in python else None
        python = found or os.path.abspath(base / python)  # a venv's link is not resolved
    config_file = trainer.accelerate.config_file
    if config_file is not None:
        config_file = (base / config_file).resolve()
        if trainer.launcher == "python":
            bad("trainer.accelerate.config_file", "launcher: python runs no accelerate; use "
                "launcher: accelerate (or direct, warm), or remove the config file")
            return python, config_file
    if not runnable or (python is None and config_file is None and inside is None):
        return python, config_file
    data = None
    if config_file is not None:  # read first: cheap, and bounded (never blocks)
        try:
            data = accelconfig.read(config_file)
        except accelconfig.ConfigFileError as e:
            bad("trainer.accelerate.config_file", str(e))
            if python is None:
                return python, config_file
    try:
        interp = interpreter.probe(python or interpreter.driver_python(),
                                   keys=data is not None) if inside is None else \
            interpreter.probe(python or containerspec.DEFAULT_PYTHON, keys=data is not None,
                              prefix=containerspec.probe_prefix(inside, base))
    except interpreter.InterpreterError as e:
        if inside is not None:
            bad("trainer.container", containerspec.probe_failure(
                inside, python or containerspec.DEFAULT_PYTHON, e.code,
                containerspec.engine_line(e.stderr), str(e)))
        else:
            bad("trainer.python" if python else "trainer.accelerate.config_file",
                f"{e}: give a working Python (e.g. your project's .venv/bin/python)")
        return python, config_file
    if (python is not None or inside is not None) and trainer.launcher != "python" \
            and not interp.has("accelerate"):
        there = f" in the image {short(inside.image, 80)}" if inside is not None else ""
        bad("trainer.python", f"{python or containerspec.DEFAULT_PYTHON}{there} has no "
            f"accelerate, which launcher: {trainer.launcher} runs: install it there (pip "
            "install accelerate), or use launcher: python")
        return python, config_file
    if data is not None:
        for message in accelconfig.problems(
                data, interp.keys, interp.has("deepspeed"), trainer.accelerate.mixed_precision,
                trainer.accelerate.dynamo_backend, choices=interp.choices):
            bad("trainer.accelerate.config_file", f"{config_file}: {message}")
    return python, config_file


# variables sweep sets for a trial besides PER_TRIAL (`launch_plan.build_launch`, `lineage.env`)
ALSO_PER_TRIAL = ("CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED", "WANDB_RUN_GROUP", "WANDB_NAME",
                  "WANDB_RUN_ID", "WANDB_RESUME")


def trial_variables(trainer: TrainerSection, params: Mapping[str, Any],
                    environ: Mapping[str, str]) -> set[str]:
    """The names a trial's `$NAME`s may use: the driver's environment (`environ`),
    `trainer.env`, what sweep sets for each trial, and `SWEEP_PARAM_*` with
    `pass_params: env`."""
    known = {*environ, *trainer.env, *PER_TRIAL, *ALSO_PER_TRIAL}
    if trainer.pass_params == "env":
        known |= {env_name(name) for name, param in params.items()
                  if param.where != "accelerate"}
    return known


def env_name(param: str) -> str:
    """The variable that carries `param` with `pass_params: env`: SWEEP_PARAM_<NAME>."""
    return "SWEEP_PARAM_" + re.sub(r"[^A-Za-z0-9_]", "_", param).upper()


def _env_clashes(spec: Spec) -> list[tuple[str, str]]:
    """(key, message) for each param whose `env_name` another param, or `trainer.env`,
    already has: the trainer would get one value where the study records two."""
    owner: dict[str, str] = {}
    clashes = []
    for name, param in spec.params.items():
        if param.where == "accelerate":
            continue
        var = env_name(name)
        if var in owner:
            clashes.append((f"params.{name}", f"params {owner[var]!r} and {name!r} are both "
                            f"passed as ${var} (trainer.pass_params: env): the trainer would "
                            "get one value for two; rename one of them"))
        else:
            owner[var] = name
    for var in spec.trainer.env:
        if var in owner:
            clashes.append((f"trainer.env.{short(var, 40)}", f"${var} is also how param "
                            f"{owner[var]!r} is passed (trainer.pass_params: env): give one "
                            "of them"))
    return clashes


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PER_TRIAL_WHY = {
    "CUDA_VISIBLE_DEVICES": "sweep gives each trial its own devices (its value would be "
    "replaced): choose the pool with gpus.ids, or CUDA_VISIBLE_DEVICES in the driver's "
    "environment, and remove it from trainer.env",
    RESULT_ENV: "sweep sets it for each trial (its value would be replaced): to read the "
    "result from another file, set trainer.result.file, and remove it from trainer.env",
}

def _check_output_dir(file: str, output_dir: Path) -> None:
    """`output_dir` is a folder, or can be created as one (checked, not created)."""
    if output_dir.exists():
        if not output_dir.is_dir():
            raise ConfigError(file, "study.output_dir", f"not a folder: {output_dir}")
        if not os.access(output_dir, os.W_OK | os.X_OK):
            raise ConfigError(file, "study.output_dir", f"cannot write in {output_dir}")
        return
    ancestor = output_dir.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(file, "study.output_dir",
                          f"cannot create {output_dir}: {ancestor} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(file, "study.output_dir",
                          f"cannot create {output_dir}: no permission to write in {ancestor}")




def _logged_params_problems(file: str, spec: Spec) -> list[Problem]:
    """What `trainer.logged_params` asks that the study cannot do: each a numeric searched
    param, read as `trainer.report` reads a value, in a pbt study (its exploits are
    checked)."""
    logged = spec.trainer.logged_params
    problems: list[Problem] = []
    if logged and (spec.study.scheduler is None or spec.study.scheduler.type != "pbt"):
        problems.append(Problem(file, "trainer.logged_params", "the logged params are "
                                "checked on PBT exploits only: set study.scheduler to "
                                "{type: pbt, ...} or remove trainer.logged_params"))
    for name, section in logged.items():
        key = f"trainer.logged_params.{short(name, 40)}"
        if not isinstance(spec.searched.get(name), (FloatParam, IntParam)):
            problems.append(Problem(file, key, "not a float or int param this study "
                                    "searches: only those are perturbed (name one of "
                                    f"{', '.join(spec.searched) or 'the params'})"))
        problems.extend(_report_problems(file, section, [name], key))
    return problems


def _report_problems(file: str, report: ReportSection, metrics: list[str],
                     where: str = "trainer.report") -> list[Problem]:
    """What `trainer.report` (or a section of its kind at `where`) asks that the study cannot
    do."""
    problems: list[Problem] = []
    if len(metrics) > 1:
        problems.append(Problem(file, where, "Optuna prunes studies of one "
                                "objective only: remove trainer.report or keep one metric"))
    if report.stream is not None:
        key = f"{where}.{report.stream}"
        for pattern in report.patterns:
            groups = compile_pattern(pattern).groupindex
            if metrics[0] not in groups and "value" not in groups:
                problems.append(Problem(file, key, f"a report pattern needs a named group "
                                        f"for the value: (?P<value>...) or (?P<{metrics[0]}>"
                                        f"...): {short(pattern, 60)}"))
    if report.tensorboard is not None:
        try:
            placeholders.check(file, f"{where}.tensorboard.dir", report.tensorboard.dir)
        except ConfigError as e:
            problems.extend(e.problems)
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            problems.append(Problem(file, f"{where}.tensorboard", "reading TensorBoard "
                                    "event files needs the tensorboard package: pip install "
                                    "'sweep[tensorboard]'"))
    if report.file is not None:
        try:
            placeholders.check(file, f"{where}.file", report.file)
        except ConfigError as e:
            problems.extend(e.problems)
    return problems
