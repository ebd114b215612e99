"""study.yaml -> a validated, frozen `Spec`: the study file's sections, and `load`.

Everything a user can get wrong in a study file is caught here, before anything touches storage
or the output directory. Each mistake is one line naming the file and the key, and `load`
reports every mistake of a file at once. The params' own rules (ranges, choices, samplers,
pruners) live in `searchspace`; the storage URL's in `storageurl`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweep._core import placeholders, yamlfile
from sweep._core.errors import ConfigError, Problem, short
from sweep.protocol import compile_pattern
from sweep.spec import accelconfig, interpreter, searchspace, storageurl
from sweep.spec import scheduler as scheduler_spec
from sweep.spec.searchspace import (
    PARAM_TYPES,
    YES_NO,
    BoolParam,
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
    Param,
    Prefix,
    PrunerSpec,
    SamplerSpec,
    Searched,
    Section,
)


class _Section(Section, BaseModel):  # BaseModel named: ruff knows a pydantic model
    """A section of the study file (`searchspace.Section`: strict, no unknown keys, frozen)."""


NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
Direction = Literal["minimize", "maximize"]


class StudySection(_Section):
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
    scheduler: scheduler_spec.SchedulerSpec | None = None  # or a pruner: see spec.scheduler
    enqueue: list[dict[str, Any]] = []
    max_consecutive_failures: Annotated[int, Field(gt=0)] = 5
    heartbeat_interval: Annotated[int, Field(gt=0)] = 30
    reclaim_after: Annotated[int, Field(gt=0)] | None = Field(
        default=None, validation_alias=AliasChoices("reclaim_after", "grace_period"))
    report: StrictBool = False  # write <output_dir>/report.html at the end of each run

    @field_validator("name")
    @classmethod
    def _no_path(cls, value: str) -> str:
        # output_dir and the SQLite file are named after the study: `..` would put them in
        # the study file's parent folder, `-x` reads as an option on a command line
        if value in (".", "..") or value.startswith("-"):
            raise ValueError(f"{value!r} cannot name a study (its output_dir and database are "
                             "named after it): use letters, digits and . _ -, not '.', '..' "
                             "or a leading '-'")
        return value

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


class AccelerateSettings(_Section):
    mixed_precision: Literal["no", "fp16", "bf16"] | None = None
    dynamo_backend: str | None = None
    # a file written by `accelerate config` (relative to the study file): see accelconfig
    config_file: Path | None = None


Patterns = Annotated[str, Field(min_length=1)] | Annotated[
    list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


def _patterns(stdout: str | list[str] | None, stderr: str | list[str] | None) -> list[str]:
    """The patterns of a section's `stdout` or else `stderr` key, as a list ([]: neither)."""
    found = stdout if stdout is not None else stderr
    if found is None:
        return []
    return [found] if isinstance(found, str) else list(found)


class ResultSection(_Section):
    """Where a trial's metrics come from, if not `$SWEEP_RESULT_FILE`: a JSON file the script
    writes anyway, or regular expressions over its standard output or error (last match
    wins)."""

    file: Annotated[str, Field(min_length=1)] | None = None
    stdout: Patterns | None = None
    stderr: Patterns | None = None

    @field_validator("stdout", "stderr")
    @classmethod
    def _linear_patterns(cls, patterns: str | list[str] | None,
                         info: ValidationInfo) -> str | list[str] | None:
        if info.data.get("file") is None and info.data.get("stdout") is None:
            for pattern in [patterns] if isinstance(patterns, str) else patterns or []:
                compile_pattern(pattern)  # RE2, named groups: PatternError is a ValueError
        return patterns

    @model_validator(mode="after")
    def _one_source(self) -> ResultSection:
        if [self.file, self.stdout, self.stderr].count(None) != 2:
            raise ValueError("give exactly one of file, stdout or stderr")
        return self

    @property
    def patterns(self) -> list[str]:
        """The patterns over `stream`'s output; [] for a result file."""
        return _patterns(self.stdout, self.stderr)

    @property
    def stream(self) -> Literal["stdout", "stderr"]:
        """The output the patterns search."""
        return "stderr" if self.stderr is not None else "stdout"


class TensorboardSource(_Section):
    """Scalars of one tag from the TensorBoard event files under `dir`."""

    dir: Annotated[str, Field(min_length=1)]
    tag: Annotated[str, Field(min_length=1)]


class ReportSection(_Section):
    """Where a trial's intermediate values come from, if not `$SWEEP_REPORT_FILE`: patterns
    over its stdout or stderr, TensorBoard scalars, or a JSON-lines file with `step` and
    `value` naming its keys."""

    stdout: Patterns | None = None
    stderr: Patterns | None = None
    tensorboard: TensorboardSource | None = None
    file: Annotated[str, Field(min_length=1)] | None = None
    step: Annotated[str, Field(min_length=1)] | None = None
    value: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("stdout", "stderr")
    @classmethod
    def _linear_patterns(cls, patterns: str | list[str] | None) -> str | list[str] | None:
        for pattern in [patterns] if isinstance(patterns, str) else patterns or []:
            compile_pattern(pattern)  # RE2, named groups: PatternError is a ValueError
        return patterns

    @model_validator(mode="after")
    def _one_source(self) -> ReportSection:
        given = [k for k in ("stdout", "stderr", "tensorboard", "file")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of stdout, stderr, tensorboard or file"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.file is None and (self.step is not None or self.value is not None):
            raise ValueError("step and value name the keys of a report file: give them "
                             "with file only")
        return self

    @property
    def patterns(self) -> list[str]:
        """The patterns over `stream`'s output; [] for the other sources."""
        return _patterns(self.stdout, self.stderr)

    @property
    def stream(self) -> Literal["stdout", "stderr"] | None:
        """The output the patterns search; None for the other sources."""
        return "stdout" if self.stdout is not None else (
            "stderr" if self.stderr is not None else None)


ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


class TrainerSection(_Section):
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
    fork_launcher: StrictBool | None = None  # no longer used: old study files load; ignored
    timeout: Annotated[float, Field(gt=0)] | None = None
    stop_grace: Annotated[float, Field(
        ge=0, validation_alias=AliasChoices("stop_grace", "grace_period"))] = 5.0
    max_retries: Annotated[int, Field(ge=0)] = 0
    retry_oom: bool = False
    gpu_memory_gb: Annotated[float, Field(gt=0)] | Literal["auto"] | None = None
    gpus_per_trial: Annotated[int, Field(ge=1, le=64, strict=True)] = 1
    # a trial silent this long with its GPUs idle is hung (`sweep.trial.hang`); null: never judged
    hang_after: Annotated[float, Field(gt=0)] | None = 1800.0
    hang_gpu_util: Annotated[float, Field(ge=0, le=100)] = 5.0  # %: below it a GPU is idle
    # the interpreter trials run with (relative to the study file, or a name on PATH)
    python: Annotated[str, Field(min_length=1)] | None = None
    # where a trial runs: a path with placeholders ({trial_dir}...); None: the driver's cwd
    workdir: Annotated[str, Field(min_length=1)] | None = None
    report: ReportSection | None = None
    # appended to args when an attempt carries on a lineage whose checkpoint folder is not
    # empty (see sweep.trial.lineage); {last_checkpoint} is the newest HF checkpoint-N folder there
    resume_args: list[str] = []
    # a retry after a real failure: from the lineage's checkpoint, or from scratch
    retry_from: Literal["checkpoint", "clean"] = "checkpoint"

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


class GpusSection(_Section):
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


class Spec(_Section):
    """A whole study file, validated. Paths are absolute; `source` is the file it came from."""

    study: StudySection
    trainer: TrainerSection
    gpus: GpusSection = GpusSection()
    params: dict[Annotated[str, Field(pattern=PARAM_NAME_PATTERN, max_length=200)], Param] = {}
    source: Path = Path("study.yaml")
    storage_from: str = "study.storage"  # where the URL came from: the key errors blame

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
    """Read and validate a study file; raise one `ConfigError` listing every problem found
    (one line each).

    `runnable=False` is for verbs that only read the study (status, summary): the trainer
    script need not exist and the sampler's optional dependencies need not be installed.
    `n_trials`, `gpus` and `storage` override the file (the command line's --n-trials,
    --gpus, --storage); `$SWEEP_STORAGE` overrides the file's storage too, and an error
    about the URL names where it came from.
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
    problems: list[Problem] = []
    _refuse_nul(file, data, "", problems)
    for key in NOT_IN_FILES:
        if key in data:
            problems.append(Problem(file, str(key), f"unknown key `{key}`"))
            del data[key]
    if isinstance(data.get("params"), dict):
        for name in data["params"]:
            if not isinstance(name, str):
                problems.append(Problem(
                    file, f"params.{name!r}", "a param name must be text; YAML reads unquoted "
                    "on/off/yes/no/true/false and numbers as such: quote it"))
    from_env = os.environ.get(STORAGE_ENV)
    storage_from = "--storage" if storage else f"${STORAGE_ENV}" if from_env else "study.storage"
    storage = storage or from_env
    if isinstance(data.get("study"), dict):
        if n_trials is not None:
            data["study"]["n_trials"] = n_trials
        if storage:
            data["study"]["storage"] = storage
    if gpus is not None:
        data["gpus"] = {**(data.get("gpus") or {}), "ids": list(gpus)}
    spec = None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        seen = {p.key for p in problems}
        problems += [p for p in _problems(file, e, data) if p.key not in seen]
    if problems or spec is None:
        raise ConfigError.of(problems)
    return _resolve(spec.model_copy(update={"storage_from": storage_from}), path, runnable)


NOT_IN_FILES = ("source", "storage_from")  # fields of `Spec` that `load` sets, not the file


MAX_FILE = yamlfile.MAX_FILE  # a study file is a few kB


def _read_study_file(file: str, path: Path) -> str:
    """The text of a regular, UTF-8 file of at most MAX_FILE bytes (never blocks)."""
    try:
        return yamlfile.read_text(path, "the study file")
    except yamlfile.FileTextError as e:
        raise ConfigError(file, "", str(e)) from None


def _problems(file: str, error: ValidationError, data: Mapping[str, Any]) -> list[Problem]:
    """One problem per mistake in `error`: a union's branches (pydantic reports each) become
    one, its deepest; a misspelt key says which it may have meant, and a required key it
    stands for is not reported missing as well."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for e in error.errors():
        if e["loc"][:1] == ("params",) and "[key]" in e["loc"] and e["type"] == "string_type":
            continue  # a param name that is no text: `load` says so in its own words
        key, root = _location(e["loc"])
        if e["type"] == YES_NO:  # found by the model, said of its key
            key = root = f"{key}.{e['ctx']['key']}" if key else str(e["ctx"]["key"])
        groups.setdefault(root, []).append((key, e))
    meant: set[str] = set()
    problems = []
    for members in groups.values():
        key, first = max(members, key=lambda m: len(m[1]["loc"]))
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            section, _, name = key.rpartition(".")
            fields = _fields(section, data)
            close = difflib.get_close_matches(name, fields, n=1)
            if close:
                meant.add(f"{section}.{close[0]}" if section else close[0])
                msg = f"unknown key `{short(name, 40)}` (did you mean `{close[0]}`?)"
            else:
                where = f"{section} takes" if section else "the file has"
                msg = f"unknown key `{short(name, 40)}` ({where} {', '.join(fields)})"
        elif first["type"] == "missing":
            msg = "required key is missing"
        elif "input" in first and first["type"] not in ("value_error", YES_NO):
            msg = f"{msg} (got {short(repr(first['input']))})"
        problems.append((first["type"], Problem(file, key, msg)))
    return [p for kind, p in problems if not (kind == "missing" and p.key in meant)]


def _fields(section: str, data: Mapping[str, Any]) -> list[str]:
    """The keys the section at dotted `section` takes (for a param, those of its type)."""
    models: dict[str, type[BaseModel]] = {
        "": Spec, "study": StudySection, "trainer": TrainerSection, "gpus": GpusSection,
        "trainer.accelerate": AccelerateSettings, "trainer.result": ResultSection,
        "trainer.report": ReportSection, "trainer.report.tensorboard": TensorboardSource,
    }
    model = models.get(section)
    parts = section.split(".")
    if model is None and len(parts) == 2 and parts[0] == "params":
        param = (data.get("params") or {}).get(parts[1])
        kind = param.get("type") if isinstance(param, dict) else None
        model = PARAM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return []
    names: list[Any] = []
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        names += list(alias.choices) if isinstance(alias, AliasChoices) else [name]
    return [str(n) for n in dict.fromkeys(names) if n not in NOT_IN_FILES]


PARAM_MODELS: dict[str, type[BaseModel]] = {
    "float": FloatParam, "int": IntParam, "categorical": CategoricalParam, "bool": BoolParam,
    "fixed": FixedParam,
}


def _refuse_nul(file: str, value: Any, key: str, problems: list[Problem]) -> None:
    """No string of the file may hold a NUL byte: no argv, environment or path can."""
    if isinstance(value, str) and "\x00" in value:
        problems.append(Problem(file, key, "contains a NUL byte, which no command line, "
                                "environment variable or path can carry"))
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        _refuse_nul(file, k, key, problems)
        _refuse_nul(file, v, f"{key}.{short(str(k), 40)}" if key else short(str(k), 40),
                    problems)


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


_TAGS = ("function-", "literal[", "list[", "dict[", "constrained-")  # pydantic's union members
_TYPE_TAGS = ("str", "int", "float", "bool", "none")


def _location(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """A pydantic error location as the user's dotted key, without pydantic's tags; and the
    key of the union whose branch it is (the key itself where it is none)."""
    keep: list[int | str] = []
    root = None
    for i, part in enumerate(loc):
        # params.<name>.<type tag>.<key>: the tag is the discriminator pydantic adds, not a key
        if i == 2 and loc[0] == "params" and part in PARAM_TYPES:
            continue
        # a union's branch: `str`, `list[...]`... (deeper than any key a user names so)
        if isinstance(part, str) and (part.startswith(_TAGS) or (i >= 3 and part in _TYPE_TAGS)):
            root = root if root is not None else ".".join(str(p) for p in keep)
            continue
        keep.append(part)
    key = ".".join(str(p) for p in keep)
    return key, key if root is None else root


MAX_ARG_BYTES = 120_000  # of one param's value as text: Linux takes 128 KB per argv or env string


def _text_size(value: Any) -> int:
    """Bytes of a param value as the trainer's command line or environment carries it."""
    return len((value if isinstance(value, str) else json.dumps(value, default=str)).encode())


def _resolve(spec: Spec, path: Path, runnable: bool = True) -> Spec:
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
    check(storageurl.check_storage_url, file, storage, spec.storage_from)
    output_dir = base / (study.output_dir or study.name)
    if runnable:
        check(_check_output_dir, file, output_dir)
    for i, arg in enumerate(trainer.args):
        check(placeholders.check, file, f"trainer.args.{i}", arg)
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
    if trainer.workdir is not None:
        check(placeholders.check, file, "trainer.workdir", trainer.workdir)
        fixed = base / placeholders.fill(trainer.workdir, {}) if "{" not in trainer.workdir \
            else None  # the same folder for every trial: checked now
        if runnable and fixed is not None and fixed.exists() and not fixed.is_dir():
            bad("trainer.workdir", f"{fixed} is a file, not a folder: name a folder (made if "
                "missing) or a placeholder path such as \"{trial_dir}\"")
    python, config_file = _trainer_environment(file, base, trainer, runnable, bad)
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
    if problems:
        raise ConfigError.of(problems)
    return resolved


def _trainer_environment(file: str, base: Path, trainer: TrainerSection, runnable: bool,
                         bad: Callable[[str, str], None]) -> tuple[str | None, Path | None]:
    """`trainer.python` (absolute; a name without a slash is looked up on PATH) and
    `trainer.accelerate.config_file` (absolute), checked when `runnable`: the interpreter runs
    and has accelerate where the launcher needs it; the config file is one the trainer's
    accelerate takes and sweep can honour (`accelconfig.problems`)."""
    python = trainer.python
    if python is not None:
        found = shutil.which(python) if "/" not in python else None
        python = found or os.path.abspath(base / python)  # a venv's link is not resolved
    config_file = trainer.accelerate.config_file
    if config_file is not None:
        config_file = (base / config_file).resolve()
        if trainer.launcher == "python":
            bad("trainer.accelerate.config_file", "launcher: python runs no accelerate; use "
                "launcher: accelerate (or direct, warm), or remove the config file")
            return python, config_file
    if not runnable or (python is None and config_file is None):
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
                                   keys=data is not None)
    except interpreter.InterpreterError as e:
        bad("trainer.python" if python else "trainer.accelerate.config_file",
            f"{e}: give a working Python (e.g. your project's .venv/bin/python)")
        return python, config_file
    if python is not None and trainer.launcher != "python" and not interp.has("accelerate"):
        bad("trainer.python", f"{python} has no accelerate, which launcher: {trainer.launcher} "
            "runs: install it there (pip install accelerate), or use launcher: python")
        return python, config_file
    if data is not None:
        for message in accelconfig.problems(
                data, interp.keys, interp.has("deepspeed"), trainer.accelerate.mixed_precision,
                trainer.accelerate.dynamo_backend, choices=interp.choices):
            bad("trainer.accelerate.config_file", f"{config_file}: {message}")
    return python, config_file


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




def _report_problems(file: str, report: ReportSection, metrics: list[str]) -> list[Problem]:
    """What `trainer.report` asks that the study cannot do."""
    problems: list[Problem] = []
    if len(metrics) > 1:
        problems.append(Problem(file, "trainer.report", "Optuna prunes studies of one "
                                "objective only: remove trainer.report or keep one metric"))
    if report.stream is not None:
        key = f"trainer.report.{report.stream}"
        for pattern in report.patterns:
            groups = compile_pattern(pattern).groupindex
            if metrics[0] not in groups and "value" not in groups:
                problems.append(Problem(file, key, f"a report pattern needs a named group "
                                        f"for the value: (?P<value>...) or (?P<{metrics[0]}>"
                                        f"...): {short(pattern, 60)}"))
    if report.tensorboard is not None:
        try:
            placeholders.check(file, "trainer.report.tensorboard.dir", report.tensorboard.dir)
        except ConfigError as e:
            problems.extend(e.problems)
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            problems.append(Problem(file, "trainer.report.tensorboard", "reading TensorBoard "
                                    "event files needs the tensorboard package: pip install "
                                    "'sweep[tensorboard]'"))
    if report.file is not None:
        try:
            placeholders.check(file, "trainer.report.file", report.file)
        except ConfigError as e:
            problems.extend(e.problems)
    return problems
