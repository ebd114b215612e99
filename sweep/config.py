"""study.yaml -> a validated, frozen `Spec`, and the Optuna objects it describes.

Everything a user can get wrong in a study file is caught here, before anything touches storage
or the output directory; each mistake becomes one `ConfigError` line naming the file and the key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweep import yamlfile
from sweep.errors import ConfigError
from sweep.protocol import compile_pattern

NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
Direction = Literal["minimize", "maximize"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Prefix = Literal["--", "-", ""]


class _Passed(_Model):
    """How a param reaches the script's command line (with `trainer.pass_params: args`)."""

    arg: Annotated[str, Field(min_length=1)] | None = None  # the flag, e.g. --learning-rate
    prefix: Prefix | None = None  # else trainer.prefix; "" passes name=value (Hydra style)
    where: Literal["script", "accelerate"] = "script"  # whose command line it goes on


class FloatParam(_Passed):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _check(self) -> FloatParam:
        _check_range(self.low, self.high, self.log, self.step)
        return self


class IntParam(_Passed):
    type: Literal["int"]
    low: int
    high: int
    step: Annotated[int, Field(gt=0)] = 1
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> IntParam:
        _check_range(self.low, self.high, self.log, self.step if self.step != 1 else None)
        return self


class CategoricalParam(_Passed):
    type: Literal["categorical"]
    choices: Annotated[list[str | bool | int | float | None], Field(min_length=1)]

    @model_validator(mode="after")
    def _no_yaml_booleans_among_strings(self) -> CategoricalParam:
        for i, a in enumerate(self.choices):
            for b in self.choices[i + 1:]:
                if a == b:
                    raise ValueError(f"choices {a!r} and {b!r} are the same to Optuna "
                                     "(true == 1 == 1.0); keep one")
        kinds = {type(c) for c in self.choices}
        if bool in kinds and str in kinds:
            raise ValueError(
                "choices mix booleans and strings: YAML reads unquoted no/yes/on/off/true/false "
                "as booleans; quote them, e.g. ['no', bf16]")
        return self


class BoolParam(_Passed):
    """true or false. With `flag: true` the script gets `--name` when true and nothing when
    false (argparse's store_true); else `--name true` / `--name false`."""

    type: Literal["bool"]
    flag: bool = False

    @property
    def choices(self) -> list[bool]:
        return [True, False]


class FixedParam(_Passed):
    """Passed to every trial as it is, never searched."""

    type: Literal["fixed"]
    value: Any
    flag: bool = False  # for a boolean value: pass `--name` when true, nothing when false


PARAM_TYPES = ("float", "int", "categorical", "bool", "fixed")
Param = Annotated[
    FloatParam | IntParam | CategoricalParam | BoolParam | FixedParam,
    Field(discriminator="type"),
]
Searched = FloatParam | IntParam | CategoricalParam | BoolParam


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    if low > high:
        raise ValueError(f"low ({low}) must not be above high ({high})")
    if log and low <= 0:
        raise ValueError(f"log scale needs low > 0 (got {low})")
    if log and step is not None:
        raise ValueError("step and log cannot be used together")


SAMPLER_TYPES = ("tpe", "random", "cmaes", "gp", "nsga2", "qmc", "grid", "bruteforce")
PRUNER_TYPES = (
    "none", "median", "percentile", "hyperband", "successive_halving", "threshold", "patient",
)


class SamplerSpec(BaseModel):
    """`type` picks the Optuna sampler; every other key is a keyword argument of it."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal[SAMPLER_TYPES] = "tpe"  # type: ignore[valid-type]
    seed: int | None = None

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class PrunerSpec(BaseModel):
    """`type` picks the Optuna pruner; every other key is a keyword argument of it.

    `patient` wraps another pruner given as `wrapped: {type: ..., ...}`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal[PRUNER_TYPES] = "none"  # type: ignore[valid-type]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class StudySection(_Model):
    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=200)]
    storage: str | None = None
    output_dir: Path | None = None
    direction: Direction | None = None
    directions: Annotated[list[Direction], Field(min_length=2)] | None = None
    metric: str | None = None
    metrics: Annotated[list[str], Field(min_length=2)] | None = None
    n_trials: Annotated[int, Field(gt=0)]
    timeout: Annotated[float, Field(gt=0)] | None = None
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    enqueue: list[dict[str, Any]] = []
    max_consecutive_failures: Annotated[int, Field(gt=0)] = 5
    heartbeat_interval: Annotated[int, Field(gt=0)] = 30
    reclaim_after: Annotated[int, Field(gt=0)] | None = Field(
        default=None, validation_alias=AliasChoices("reclaim_after", "grace_period"))

    @model_validator(mode="after")
    def _objectives(self) -> StudySection:
        if self.direction is not None and self.directions is not None:
            raise ValueError("give either direction or directions, not both")
        if self.directions is None:
            if self.metrics is not None:
                raise ValueError("metrics needs directions (one per metric)")
            if self.metric is None:
                raise ValueError("metric is required: the result-file key to optimise")
        else:
            if self.metric is not None or self.metrics is None:
                raise ValueError("directions needs metrics (one per direction), not metric")
            if len(self.metrics) != len(self.directions):
                raise ValueError(
                    f"{len(self.metrics)} metrics but {len(self.directions)} directions"
                )
        return self

    @property
    def reclaim_seconds(self) -> int:
        """How old a trial's last heartbeat may be before another driver reclaims it."""
        return self.reclaim_after or 2 * self.heartbeat_interval

    @property
    def objective_directions(self) -> list[Direction]:
        return list(self.directions) if self.directions else [self.direction or "minimize"]

    @property
    def objective_metrics(self) -> list[str]:
        return list(self.metrics) if self.metrics else [str(self.metric)]


class AccelerateSettings(_Model):
    mixed_precision: Literal["no", "fp16", "bf16"] | None = None
    dynamo_backend: str | None = None


class ResultSection(_Model):
    """Where a trial's metrics come from, if not `$SWEEP_RESULT_FILE`: a JSON file the script
    writes anyway, or regular expressions over its standard output (last match wins)."""

    file: Annotated[str, Field(min_length=1)] | None = None
    stdout: Annotated[str, Field(min_length=1)] | Annotated[
        list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None

    @field_validator("stdout")
    @classmethod
    def _linear_patterns(cls, stdout: str | list[str] | None,
                         info: ValidationInfo) -> str | list[str] | None:
        if info.data.get("file") is None:  # else: one source only, says _one_source
            for pattern in [stdout] if isinstance(stdout, str) else stdout or []:
                compile_pattern(pattern)  # RE2, named groups: PatternError is a ValueError
        return stdout

    @model_validator(mode="after")
    def _one_source(self) -> ResultSection:
        if (self.file is None) == (self.stdout is None):
            raise ValueError("give exactly one of file or stdout")
        return self

    @property
    def patterns(self) -> list[str]:
        if self.stdout is None:
            return []
        return [self.stdout] if isinstance(self.stdout, str) else list(self.stdout)


ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


class TrainerSection(_Model):
    script: Path | None = None
    module: ModuleName | None = None
    args: list[str] = []
    result: ResultSection | None = None
    pass_params: Literal["args", "env", "file"] = "args"
    prefix: Prefix = "--"
    env: dict[str, str | int | float | bool] = {}
    accelerate: AccelerateSettings = AccelerateSettings()
    launcher: Literal["accelerate", "direct", "warm", "python"] = "accelerate"
    preload: list[ModuleName] = []
    fork_launcher: StrictBool = True
    timeout: Annotated[float, Field(gt=0)] | None = None
    stop_grace: Annotated[float, Field(
        ge=0, validation_alias=AliasChoices("stop_grace", "grace_period"))] = 5.0
    max_retries: Annotated[int, Field(ge=0)] = 0
    retry_oom: bool = False
    gpu_memory_gb: Annotated[float, Field(gt=0)] | Literal["auto"] | None = None
    gpus_per_trial: Annotated[int, Field(ge=1, le=64, strict=True)] = 1

    @field_validator("gpu_memory_gb", mode="before")
    @classmethod
    def _size_or_auto(cls, value: Any) -> Any:
        ok = value is None or value == "auto" or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            and math.isfinite(value))
        if not ok:
            raise ValueError(f"a size in GB (e.g. 20) or auto, not {short(repr(value), 40)}")
        return value

    @model_validator(mode="after")
    def _one_entry_point(self) -> TrainerSection:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of script or module")
        if self.launcher in ("direct", "warm") and self.gpus_per_trial > 1:
            raise ValueError(f"launcher: {self.launcher} starts one process per trial; a "
                             "trial of several devices needs launcher: accelerate")
        return self


class GpusSection(_Model):
    ids: Literal["all"] | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = "all"

    @field_validator("ids")
    @classmethod
    def _each_once(cls, value: Any) -> Any:
        if isinstance(value, list):
            twice = sorted({i for i in value if value.count(i) > 1})
            if twice:
                raise ValueError(f"listed more than once: {', '.join(map(str, twice))}")
        return value

    trials_per_gpu: Annotated[int, Field(gt=0)] = 1
    sample_interval: Annotated[float, Field(gt=0)] = 1.0
    skip_busy: bool = True
    busy_memory_mb: Annotated[float, Field(gt=0)] = 1024.0


class Spec(_Model):
    """A whole study file, validated. Paths are absolute; `source` is the file it came from."""

    study: StudySection
    trainer: TrainerSection
    gpus: GpusSection = GpusSection()
    params: dict[Annotated[str, Field(pattern=PARAM_NAME_PATTERN, max_length=200)], Param] = {}
    source: Path = Path("study.yaml")

    @property
    def storage_url(self) -> str:
        return str(self.study.storage)

    @property
    def output_dir(self) -> Path:
        return Path(str(self.study.output_dir))

    @property
    def trials_per_gpu(self) -> int:
        """Trials a device may hold at once: `gpus.trials_per_gpu`; with
        `trainer.gpu_memory_gb` and no `trials_per_gpu` given, memory decides, up to
        `PACKED_MAX`."""
        if self.trainer.gpu_memory_gb is not None and (
                "trials_per_gpu" not in self.gpus.model_fields_set):
            return PACKED_MAX
        return self.gpus.trials_per_gpu

    @property
    def searched(self) -> dict[str, Searched]:
        return {k: v for k, v in self.params.items() if not isinstance(v, FixedParam)}

    @property
    def fixed(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.params.items() if isinstance(v, FixedParam)}


STORAGE_ENV = "SWEEP_STORAGE"
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
PACKED_MAX = 16  # trials per device when memory decides (`trainer.gpu_memory_gb`)


def load(
    path: str | Path, runnable: bool = True, *, n_trials: int | None = None,
    gpus: list[int] | None = None, storage: str | None = None,
) -> Spec:
    """Read and validate a study file; raise `ConfigError` on the first problem found.

    `runnable=False` is for verbs that only read the study (status, summary): the trainer
    script need not exist and the sampler's optional dependencies need not be installed.
    `n_trials`, `gpus` and `storage` override the file (the command line's --n-trials,
    --gpus, --storage); `$SWEEP_STORAGE` overrides the file's storage too.
    """
    path = Path(path)
    file = str(path)
    text = _read_study_file(file, path)
    try:
        data = yamlfile.load(text)
    except yamlfile.YamlError as e:
        raise ConfigError(file, f"line {e.line}" if e.line else "", e.problem) from None
    if not isinstance(data, dict):
        raise ConfigError(file, "", "the study file must be a mapping with study/trainer/params")
    _refuse_nul(file, data, "")
    if isinstance(data.get("params"), dict):
        for name in data["params"]:
            if not isinstance(name, str):
                raise ConfigError(file, f"params.{name!r}", "a param name must be text; YAML "
                                  "reads unquoted on/off/yes/no/true/false and numbers as "
                                  "such: quote it")
    storage = storage or os.environ.get(STORAGE_ENV)
    if isinstance(data.get("study"), dict):
        if n_trials is not None:
            data["study"]["n_trials"] = n_trials
        if storage:
            data["study"]["storage"] = storage
    if gpus is not None:
        data["gpus"] = {**(data.get("gpus") or {}), "ids": list(gpus)}
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        raise _config_error(file, e) from None
    return _resolve(spec, path, runnable)


MAX_FILE = 1 << 20  # a study file is a few kB


def _read_study_file(file: str, path: Path) -> str:
    """The text of a regular, UTF-8 file of at most MAX_FILE bytes (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(file, "", f"cannot read the study file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(file, "", "the study file is not a regular file")
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ConfigError(file, "", f"the study file is larger than {MAX_FILE} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(file, "", f"the study file is not UTF-8 text (byte {e.start})") from None


def _config_error(file: str, error: ValidationError) -> ConfigError:
    # With unions, pydantic reports every branch; the deepest location is the telling one.
    first = max(error.errors(), key=lambda e: len(e["loc"]))
    loc = _location(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see the README's YAML reference)"
    elif first["type"] == "missing":
        msg = "required key is missing"
    elif "input" in first and first["type"] not in ("value_error",):
        msg = f"{msg} (got {short(repr(first['input']))})"
    return ConfigError(file, loc, msg)


def short(text: str, width: int = 60) -> str:
    """`text` cut to `width` characters: error messages never echo unbounded input."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _refuse_nul(file: str, value: Any, key: str) -> None:
    """No string of the file may hold a NUL byte: no argv, environment or path can."""
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError(file, key, "contains a NUL byte, which no command line, environment "
                                     "variable or path can carry")
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        _refuse_nul(file, k, key)
        _refuse_nul(file, v, f"{key}.{short(str(k), 40)}" if key else short(str(k), 40))


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


def _location(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the user's dotted key, without pydantic's union tags."""
    parts = list(loc)
    # params.<name>.<type tag>.<key>: the tag is the discriminator pydantic adds, not a key
    if len(parts) > 2 and parts[0] == "params" and parts[2] in PARAM_TYPES:
        del parts[2]
    tags = ("function-", "literal[", "list[")
    return ".".join(str(p) for p in parts if not (isinstance(p, str) and p.startswith(tags)))


MAX_ARG_BYTES = 120_000  # of one param's value as text: Linux takes 128 KB per argv or env string


def _text_size(value: Any) -> int:
    """Bytes of a param value as the trainer's command line or environment carries it."""
    return len((value if isinstance(value, str) else json.dumps(value, default=str)).encode())


def _resolve(spec: Spec, path: Path, runnable: bool = True) -> Spec:
    """Make paths absolute, fill defaults that depend on the file's place, check what exists."""
    file, base = str(path), path.resolve().parent
    study, trainer = spec.study, spec.trainer
    storage = study.storage or f"sqlite:///{base / (study.name + '.db')}"
    check_storage_url(file, storage, base)
    output_dir = base / (study.output_dir or study.name)
    if runnable:
        _check_output_dir(file, output_dir)
    for i, arg in enumerate(trainer.args):
        _check_places(file, f"trainer.args.{i}", arg)
    for name, value in trainer.env.items():
        _check_places(file, f"trainer.env.{short(name, 40)}", str(value))
    if trainer.result is not None and trainer.result.file is not None:
        _check_places(file, "trainer.result.file", trainer.result.file)
    if trainer.result is not None and trainer.result.patterns:
        groups = {g for p in trainer.result.patterns for g in compile_pattern(p).groupindex}
        for metric in study.objective_metrics:
            if metric not in groups:
                raise ConfigError(file, "trainer.result.stdout",
                                  f"no named group for the metric {metric!r}: add "
                                  f"(?P<{metric}>...) to a pattern")
    for name, param in spec.params.items():
        if param.where != "accelerate":
            continue
        if trainer.launcher == "python":
            raise ConfigError(file, f"params.{name}.where", "accelerate options need "
                              "trainer.launcher: accelerate (or direct, warm)")
        if name not in ACCELERATE_OPTIONS:
            raise ConfigError(file, f"params.{name}.where",
                              f"not an `accelerate launch` option sweep can search: "
                              f"{short(name, 40)} (one of: {', '.join(ACCELERATE_OPTIONS)})")
        if getattr(trainer.accelerate, name, None) is not None:
            raise ConfigError(file, f"params.{name}", f"also set in trainer.accelerate.{name}; "
                              "give it in one place")
        problem = _accelerate_values(name, param)
        if problem:
            raise ConfigError(file, f"params.{name}", problem)
    if trainer.pass_params != "file":
        for name, param in spec.params.items():
            values = [param.value] if isinstance(param, FixedParam) else getattr(
                param, "choices", [])
            size = max((_text_size(v) for v in values), default=0)
            if size > MAX_ARG_BYTES:
                raise ConfigError(file, f"params.{name}", f"a value of {size // 1024} KB: one "
                                  "argument or environment variable holds at most 128 KB; "
                                  "use trainer.pass_params: file")
    for name in trainer.env:
        if not ENV_NAME.match(name):
            raise ConfigError(file, f"trainer.env.{short(name, 40)}",
                              "not an environment variable name (letters, digits and _, "
                              "not starting with a digit)")
    script = None
    if trainer.script is not None:
        script = (base / trainer.script).resolve()
        if runnable and not script.is_file():
            raise ConfigError(file, "trainer.script", f"no such file: {script}")
    for i, params in enumerate(study.enqueue):
        unknown = sorted(set(params) - set(spec.searched))
        if unknown:
            raise ConfigError(
                file, f"study.enqueue.{i}", f"not a searched param: {', '.join(unknown)}"
            )
        for name, value in params.items():
            problem = outside(spec.searched[name], value)
            if problem:
                raise ConfigError(file, f"study.enqueue.{i}.{name}", problem)
    if study.pruner.type != "none" and study.directions is not None:
        raise ConfigError(file, "study.pruner", "Optuna cannot prune multi-objective studies")
    resolved = spec.model_copy(
        update={
            "study": study.model_copy(update={"storage": storage, "output_dir": output_dir}),
            "trainer": trainer.model_copy(update={"script": script}),
            "source": path.resolve(),
        }
    )
    for key, build in (("study.sampler", build_sampler), ("study.pruner", build_pruner)):
        if not runnable:
            break
        try:
            build(resolved)
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(file, key, str(e).splitlines()[0]) from None
    return resolved


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACES = ("trial_dir", "trial_number", "study_dir", "output_dir")


_TOKEN = re.compile(
    r"\{\{|\}\}|\$\$|\$\{(?P<braced>[A-Za-z_]\w*)\}|\$(?P<bare>[A-Za-z_]\w*)"
    r"|\{(?P<place>[^{}]*)\}"
)


def fill(text: str, places: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """`text` with its placeholders filled ({trial_dir}, ...; `{{` and `}}` are braces) and,
    given `env`, `$NAME` / `${NAME}` of it expanded (`$$` is a dollar; unknown names stay).

    An unknown placeholder raises KeyError."""

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if m.group("place") is not None:
            return places[m.group("place")]
        if env is None:
            return token
        if token == "$$":
            return "$"
        return env.get(m.group("braced") or m.group("bare"), token)

    return _TOKEN.sub(one, text)


def _check_places(file: str, key: str, text: str) -> None:
    """`text` uses only known placeholders."""
    try:
        fill(text, {name: "" for name in PLACES})
    except KeyError as e:
        raise ConfigError(file, key, f"unknown placeholder {{{e.args[0]}}}: use "
                          f"{', '.join('{' + p + '}' for p in PLACES)}; a literal brace is "
                          "doubled ({{ }})") from None


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


def outside(param: Searched, value: Any) -> str | None:
    """Why `value` cannot be a value of `param` (None if it can)."""
    shown = short(repr(value), 40)
    if isinstance(param, (CategoricalParam, BoolParam)):
        if not any(type(c) is type(value) and c == value for c in param.choices):
            return f"{shown} is not one of the choices {short(repr(param.choices), 80)}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{shown} is not a number"
    if isinstance(param, IntParam) and value != int(value):
        return f"{shown} is not a whole number"
    if not param.low <= value <= param.high:
        return f"{shown} is outside [{param.low}, {param.high}]"
    return None


def shown_url(url: str) -> str:
    """A storage URL as it may be printed: no password, nor secrets in its query string."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018
    except (ArgumentError, ValueError):
        return "<storage URL>"
    secret = {k: "***" for k in parsed.query if SECRET_KEYS.search(k)}
    shown = parsed.update_query_dict(secret).render_as_string(hide_password=True)
    return shown.replace("%2A%2A%2A", "***")


def redact(text: str, url: str) -> str:
    """`text` with the secrets of `url` (password, secret query values) blanked out."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018
    except (ArgumentError, ValueError):
        return text
    secrets = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if SECRET_KEYS.search(key):
            secrets += [value] if isinstance(value, str) else list(value)
    for secret in secrets:
        if secret:
            text = text.replace(str(secret), "***")
    return text


SECRET_KEYS = re.compile(r"pass|pwd|secret|token|key", re.IGNORECASE)


JOURNAL, GRPC = "journal://", "grpc://"


def storage_kind(url: str) -> str:
    """"journal" (Optuna's JournalStorage on a file), "grpc" (Optuna's gRPC storage proxy)
    or "rdb" (a database through SQLAlchemy)."""
    if url.startswith(JOURNAL):
        return "journal"
    if url.startswith(GRPC):
        return "grpc"
    return "rdb"


def journal_path(url: str) -> Path:
    """The file of a `journal:///path` URL."""
    return Path(url.removeprefix(JOURNAL))


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of a `grpc://host:port` URL, an IPv6 host kept in its brackets as gRPC's
    targets want it (ValueError if it has neither)."""
    rest = url.removeprefix(GRPC).rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(url)
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(url)  # an IPv6 address goes in brackets: grpc://[::1]:13000
    return host, int(port)


def check_storage_url(file: str, url: str, base: Path) -> None:
    """Refuse a storage URL sweep cannot use, without connecting or creating anything."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    kind = storage_kind(url)
    if kind == "journal":
        path = journal_path(url)
        if not path.is_absolute() or path.name in ("", ".", ".."):
            raise ConfigError(file, "study.storage", "a journal storage needs an absolute "
                              "file path: journal:///shared/path/study.log")
        if not path.parent.is_dir():
            raise ConfigError(file, "study.storage", f"folder does not exist: {path.parent}")
        return
    if kind == "grpc":
        try:
            grpc_address(url)
        except ValueError:
            raise ConfigError(file, "study.storage", "a gRPC storage proxy URL is "
                              "grpc://host:port (see `sweep storage-proxy`)") from None
        try:
            from sweep.grpclock import import_grpc

            import_grpc()
        except ImportError:
            raise ConfigError(file, "study.storage", "no grpcio for grpc:// "
                              "(pip install 'sweep[grpc]')") from None
        return
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 (a port that is no number raises here)
    except (ArgumentError, ValueError):
        raise ConfigError(
            file, "study.storage", "not a database URL (e.g. sqlite:///sweep.db or "
            "postgresql://user@host/db)"
        ) from None
    shown = shown_url(url)
    try:
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except NoSuchModuleError:
        raise ConfigError(file, "study.storage", f"unknown database kind in {shown}") from None
    except ImportError as e:
        postgres = parsed.get_backend_name() == "postgresql"
        hint = " (pip install 'sweep[postgres]')" if postgres else ""
        raise ConfigError(
            file, "study.storage", f"no driver for {shown}: {e.name or e}{hint}"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        db = Path(parsed.database)
        folder = (db if db.is_absolute() else Path.cwd() / db).parent
        if not folder.is_dir():
            raise ConfigError(file, "study.storage", f"folder does not exist: {folder}")


def distributions(spec: Spec) -> dict[str, Any]:
    """The Optuna distributions of the searched params, in file order."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for name, p in spec.searched.items():
        if isinstance(p, FloatParam):
            out[name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        elif isinstance(p, IntParam):
            out[name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
        else:
            out[name] = CategoricalDistribution(p.choices)
    return out


def _grid_space(spec: Spec) -> dict[str, list[Any]]:
    space: dict[str, list[Any]] = {}
    for name, p in spec.searched.items():
        if isinstance(p, (CategoricalParam, BoolParam)):
            space[name] = list(p.choices)
        elif isinstance(p, IntParam):
            space[name] = list(range(p.low, p.high + 1, p.step))
        elif p.step is not None:
            n = math.floor((p.high - p.low) / p.step + 1e-9)
            space[name] = [p.low + i * p.step for i in range(n + 1)]
        else:
            raise ConfigError(
                str(spec.source), "study.sampler.search_space",
                f"grid needs a search_space for float param {name!r} (or give it a step)",
            )
    return space


def _check_grid(spec: Spec, space: Any) -> None:
    """A grid names every searched param (Optuna's GridSampler fails at the first trial
    otherwise), and only values each param can take."""
    key = "study.sampler.search_space"
    if not isinstance(space, dict):
        raise ConfigError(str(spec.source), key, "give a mapping of param name -> list of values")
    unknown = sorted(set(space) - set(spec.searched))
    if unknown:
        raise ConfigError(str(spec.source), key, f"not a searched param: {', '.join(unknown)}")
    missing = sorted(set(spec.searched) - set(space))
    if missing:
        raise ConfigError(str(spec.source), key, f"gives no values for {', '.join(missing)}: "
                          "a grid needs values for every searched param")
    for name, values in space.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(str(spec.source), f"{key}.{name}", "give a non-empty list of values")
        for value in values:
            problem = outside(spec.searched[name], value)
            if problem:
                raise ConfigError(str(spec.source), f"{key}.{name}", problem)


def grid_size(spec: Spec) -> int | None:
    """How many points a grid sampler has (None for other samplers)."""
    cfg = spec.study.sampler
    if cfg.type != "grid":
        return None
    space = cfg.kwargs.get("search_space") or _grid_space(spec)
    return math.prod(len(values) for values in space.values())


SAMPLER_NEEDS = {"qmc": ["scipy"], "gp": ["scipy", "torch"], "cmaes": ["cmaes"]}


def _construct(file: str, key: str, cls: type, kwargs: dict[str, Any]) -> Any:
    from optuna.exceptions import ExperimentalWarning

    accepted = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        for k in kwargs:
            if k not in accepted:
                raise ConfigError(file, f"{key}.{k}", f"{cls.__name__} has no argument {k!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return cls(**kwargs)


# Samplers whose only memory between trials is their random generator: given a seed, each
# trial gets one of its own, derived from the seed and the trial number. A rerun (a fresh
# process) then continues with new points instead of replaying the first run's, and a trial's
# params stay reproducible. QMC, grid and brute force keep the study's seed: their sequence or
# their choice of unvisited points is what the seed fixes.
PER_TRIAL_SEED = ("random", "tpe", "gp", "cmaes", "nsga2")


def reseeds(spec: Spec) -> bool:
    """Whether each trial of `spec` gets a sampler seeded of its own (see PER_TRIAL_SEED)."""
    return spec.study.sampler.seed is not None and spec.study.sampler.type in PER_TRIAL_SEED


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial `number` in a study seeded with `seed` (stable across processes)."""
    digest = hashlib.sha256(f"sweep:{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def build_sampler(spec: Spec, trial: int | None = None) -> Any:
    """The Optuna sampler of `study.sampler` (for trial number `trial`, with its own seed
    where `PER_TRIAL_SEED` says so); TPE keeps Optuna's default constant liar."""
    import optuna.samplers as s

    cfg = spec.study.sampler
    kwargs = cfg.kwargs
    if cfg.seed is not None:
        per_trial = trial is not None and cfg.type in PER_TRIAL_SEED
        kwargs["seed"] = cfg.seed if trial is None or not per_trial else trial_seed(cfg.seed, trial)
    classes = {
        "tpe": s.TPESampler, "random": s.RandomSampler, "cmaes": s.CmaEsSampler,
        "gp": s.GPSampler, "nsga2": s.NSGAIISampler, "qmc": s.QMCSampler,
        "grid": s.GridSampler, "bruteforce": s.BruteForceSampler,
    }
    missing = [m for m in SAMPLER_NEEDS.get(cfg.type, []) if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(str(spec.source), "study.sampler.type",
                          f"the {cfg.type} sampler needs {', '.join(missing)} "
                          f"(pip install {' '.join(missing)})")
    if cfg.type == "grid":
        space = kwargs.pop("search_space", None) or _grid_space(spec)
        _check_grid(spec, space)
        kwargs["search_space"] = space
    return _construct(str(spec.source), "study.sampler", classes[cfg.type], kwargs)


def build_pruner(spec: Spec, cfg: PrunerSpec | None = None, key: str = "study.pruner") -> Any:
    """The Optuna pruner of `study.pruner` (`patient` wraps the pruner under `wrapped`)."""
    import optuna.pruners as p

    cfg = cfg or spec.study.pruner
    kwargs = cfg.kwargs
    classes = {
        "none": p.NopPruner, "median": p.MedianPruner, "percentile": p.PercentilePruner,
        "hyperband": p.HyperbandPruner, "successive_halving": p.SuccessiveHalvingPruner,
        "threshold": p.ThresholdPruner, "patient": p.PatientPruner,
    }
    if cfg.type == "patient":
        inner = kwargs.get("wrapped")
        if inner is not None:
            if not isinstance(inner, dict):
                raise ConfigError(str(spec.source), f"{key}.wrapped", "must be a pruner mapping")
            try:
                inner_cfg = PrunerSpec.model_validate(inner)
            except ValidationError as e:
                raise _config_error(str(spec.source), e) from None
            kwargs["wrapped_pruner"] = build_pruner(spec, inner_cfg, f"{key}.wrapped")
            del kwargs["wrapped"]
    return _construct(str(spec.source), key, classes[cfg.type], kwargs)
