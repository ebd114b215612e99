"""The search space: each param's model and the values it can take, its Optuna distribution,
grids, and the Optuna samplers and pruners a study file names.

Everything here depends only on the params and the sampler/pruner sections, not on the rest of
a study file; `config` puts these pieces into its `Spec` and checks them when it loads a file.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import inspect
import math
import types
import typing
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sweep._core import ConfigError, short

YES_NO = "number_not_yes_no"  # the error type; its ctx `key` names the field
YES_NO_TEXT = ("a number is needed, not {got} (YAML reads an unquoted yes/no/on/off as "
               "true/false); where a key can be turned off, null does it")


def takes_number_not_yes_no(annotation: Any) -> bool:
    """Whether a field of type `annotation` takes a number (int or float, maybe in a union
    with None or a literal) and no yes/no."""
    leaves: set[Any] = set()
    todo = [annotation]
    while todo:
        kind = todo.pop()
        if typing.get_origin(kind) in (typing.Union, types.UnionType, Annotated):
            todo.extend(typing.get_args(kind)[:1] if typing.get_origin(kind) is Annotated
                        else typing.get_args(kind))
        else:
            leaves.add(kind)
    return bool(leaves & {int, float}) and bool not in leaves and Any not in leaves


class StrictNumbers(BaseModel):
    """A model whose number fields refuse a yes/no: pydantic takes `true` as 1, and YAML reads
    an unquoted true, yes or on as one, so `hang_after: yes` would be a 1-second limit."""

    @model_validator(mode="before")
    @classmethod
    def _no_yes_no(cls, data: Any) -> Any:
        for name, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if (isinstance(value, bool) and field is not None
                    and takes_number_not_yes_no(field.annotation)):
                raise PydanticCustomError(YES_NO, YES_NO_TEXT,
                                          {"key": name, "got": str(value).lower()})
        return data


class Section(StrictNumbers, BaseModel):  # BaseModel named: ruff knows a pydantic model
    """A part of the study file: strict numbers, no unknown keys, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Prefix = Literal["--", "-", ""]


class _Passed(Section):
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
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(high - low)):
        raise ValueError(f"low and high must be finite numbers, and so must high - low (got "
                         f"{low}, {high})")
    if step is not None and not math.isfinite(step):
        raise ValueError(f"step must be a finite number (got {step})")
    if low > high:
        raise ValueError(f"low ({low}) must not be above high ({high})")
    if step is not None and low < high and step > high - low:
        raise ValueError(f"step ({step}) is larger than the range [{low}, {high}]: no value but "
                         "low could be drawn")
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


def distributions(searched: Mapping[str, Searched]) -> dict[str, Any]:
    """The Optuna distributions of the searched params, in their order."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for name, p in searched.items():
        if isinstance(p, FloatParam):
            out[name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        elif isinstance(p, IntParam):
            out[name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
        else:
            out[name] = CategoricalDistribution(p.choices)
    return out


GRID_KEY = "study.sampler.search_space"


def _grid_space(searched: Mapping[str, Searched], file: str) -> dict[str, list[Any]]:
    space: dict[str, list[Any]] = {}
    for name, p in searched.items():
        if isinstance(p, (CategoricalParam, BoolParam)):
            space[name] = list(p.choices)
        elif isinstance(p, IntParam):
            space[name] = list(range(p.low, p.high + 1, p.step))
        elif p.step is not None:
            n = math.floor((p.high - p.low) / p.step + 1e-9)
            space[name] = [p.low + i * p.step for i in range(n + 1)]
        else:
            raise ConfigError(
                file, GRID_KEY,
                f"grid needs a search_space for float param {name!r} (or give it a step)",
            )
    return space


def _check_grid(searched: Mapping[str, Searched], space: Any, file: str) -> None:
    """A grid names every searched param (Optuna's GridSampler fails at the first trial
    otherwise), and only values each param can take."""
    if not isinstance(space, dict):
        raise ConfigError(file, GRID_KEY, "give a mapping of param name -> list of values")
    unknown = sorted(set(space) - set(searched))
    if unknown:
        raise ConfigError(file, GRID_KEY, f"not a searched param: {', '.join(unknown)}")
    missing = sorted(set(searched) - set(space))
    if missing:
        raise ConfigError(file, GRID_KEY, f"gives no values for {', '.join(missing)}: "
                          "a grid needs values for every searched param")
    for name, values in space.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(file, f"{GRID_KEY}.{name}", "give a non-empty list of values")
        for value in values:
            problem = outside(searched[name], value)
            if problem:
                raise ConfigError(file, f"{GRID_KEY}.{name}", problem)


def grid_size(sampler: SamplerSpec, searched: Mapping[str, Searched]) -> int | None:
    """How many points a grid sampler has (None for other samplers)."""
    if sampler.type != "grid":
        return None
    space = sampler.kwargs.get("search_space") or _grid_space(searched, "")
    return math.prod(len(values) for values in space.values())


SAMPLER_NEEDS = {"qmc": ["scipy"], "gp": ["scipy", "torch"], "cmaes": ["cmaes"]}


def _construct(file: str, key: str, cls: type, kwargs: dict[str, Any]) -> Any:
    from optuna.exceptions import ExperimentalWarning

    accepted = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        for k in kwargs:
            if k not in accepted:
                close = difflib.get_close_matches(k, list(accepted), n=1)
                meant = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(file, f"{key}.{k}",
                                  f"{cls.__name__} has no argument {k!r}{meant}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return cls(**kwargs)


# Samplers whose only memory between trials is their random generator: given a seed, each
# trial gets one of its own, derived from the seed and the trial number. A rerun (a fresh
# process) then continues with new points instead of replaying the first run's, and a trial's
# params stay reproducible. QMC, grid and brute force keep the study's seed: their sequence or
# their choice of unvisited points is what the seed fixes.
PER_TRIAL_SEED = ("random", "tpe", "gp", "cmaes", "nsga2")


def reseeds(sampler: SamplerSpec) -> bool:
    """Whether each trial gets a sampler seeded of its own (see PER_TRIAL_SEED)."""
    return sampler.seed is not None and sampler.type in PER_TRIAL_SEED


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial `number` in a study seeded with `seed` (stable across processes)."""
    digest = hashlib.sha256(f"sweep:{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def build_sampler(
    sampler: SamplerSpec, searched: Mapping[str, Searched], file: str = "",
    trial: int | None = None,
) -> Any:
    """The Optuna sampler of `study.sampler` over `searched` (for trial number `trial`, with
    its own seed where `PER_TRIAL_SEED` says so); TPE keeps Optuna's default constant liar.
    A `ConfigError` names `file`."""
    import optuna.samplers as s

    kwargs = sampler.kwargs
    if sampler.seed is not None:
        per_trial = trial is not None and sampler.type in PER_TRIAL_SEED
        kwargs["seed"] = (sampler.seed if trial is None or not per_trial
                          else trial_seed(sampler.seed, trial))
    classes = {
        "tpe": s.TPESampler, "random": s.RandomSampler, "cmaes": s.CmaEsSampler,
        "gp": s.GPSampler, "nsga2": s.NSGAIISampler, "qmc": s.QMCSampler,
        "grid": s.GridSampler, "bruteforce": s.BruteForceSampler,
    }
    missing = [m for m in SAMPLER_NEEDS.get(sampler.type, [])
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(file, "study.sampler.type",
                          f"the {sampler.type} sampler needs {', '.join(missing)} "
                          f"(pip install {' '.join(missing)})")
    if sampler.type == "grid":
        space = kwargs.pop("search_space", None) or _grid_space(searched, file)
        _check_grid(searched, space, file)
        kwargs["search_space"] = space
    return _construct(file, "study.sampler", classes[sampler.type], kwargs)


def build_pruner(pruner: PrunerSpec, file: str = "", key: str = "study.pruner") -> Any:
    """The Optuna pruner of `study.pruner` (`patient` wraps the pruner under `wrapped`).
    A `ConfigError` names `file`."""
    import optuna.pruners as p

    kwargs = pruner.kwargs
    classes = {
        "none": p.NopPruner, "median": p.MedianPruner, "percentile": p.PercentilePruner,
        "hyperband": p.HyperbandPruner, "successive_halving": p.SuccessiveHalvingPruner,
        "threshold": p.ThresholdPruner, "patient": p.PatientPruner,
    }
    if pruner.type == "patient":
        inner = kwargs.get("wrapped")
        if inner is not None:
            if not isinstance(inner, dict):
                raise ConfigError(file, f"{key}.wrapped", "must be a pruner mapping")
            try:
                inner_cfg = PrunerSpec.model_validate(inner)
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ConfigError(file, f"{key}.wrapped" + (f".{where}" if where else ""),
                                  first["msg"].removeprefix("Value error, ")) from None
            kwargs["wrapped_pruner"] = build_pruner(inner_cfg, file, f"{key}.wrapped")
            del kwargs["wrapped"]
    return _construct(file, key, classes[pruner.type], kwargs)
