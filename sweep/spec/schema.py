"""The study file's sections as frozen pydantic models, and `Spec`, the whole file validated.

Only the shape and the rules of one value at a time live here; `config.load` reads the file,
resolves paths and checks what spans sections.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweep._core import compile_pattern, short
from sweep.spec import container as containerspec
from sweep.spec import scheduler as scheduler_spec
from sweep.spec.searchspace import (
    FixedParam,
    Param,
    Prefix,
    PrunerSpec,
    SamplerSpec,
    Searched,
    Section,
)
from sweep.spec.storageurl import StorageUrl

PACKED_MAX = 16  # trials per device when memory decides (`trainer.gpu_memory_gb`)


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
    def counts_steps(self) -> bool:
        """Whether sweep counts the values (a pattern with no `step` group): their steps are
        no step of the trainer's, such as the N of a HF `checkpoint-N`."""
        return any("step" not in compile_pattern(p).groupindex for p in self.patterns)

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
    # searched params the script logs (as trainer.report reads values): a PBT exploit is
    # checked to run with its perturbed value, not its donor's restored from the checkpoint
    logged_params: dict[str, ReportSection] = {}
    container: containerspec.ContainerSection | None = None  # the image trials run in

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
    _storage: StorageUrl | None = PrivateAttr(default=None)

    @property
    def storage_url(self) -> str:
        return str(self.study.storage)

    @property
    def storage(self) -> StorageUrl:
        """`study.storage` parsed: by `config.load`, which checks it too (a `Spec` made
        otherwise parses it on first use; `StorageUrlError` if it is none)."""
        if self._storage is None or self._storage.url != self.storage_url:
            self._storage = StorageUrl.parse(self.storage_url)
        return self._storage

    def with_storage(self, storage: StorageUrl) -> Spec:
        """This spec with `study.storage` set to `storage`, already parsed."""
        spec = self.model_copy(update={"study": self.study.model_copy(
            update={"storage": storage.url})})
        spec._storage = storage
        return spec

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
