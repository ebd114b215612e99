"""A study opened for its study file: created or loaded, checked against the file (directions,
metrics, param types) before anything is written, and a new trial's params suggested.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from sweep._core import METRICS, SCHEDULER, ConfigError, Problem, short
from sweep.spec import FloatParam, IntParam, Searched, Spec, searchspace

# Optuna's warnings for a queued (fixed) value outside the distribution a suggest call gives:
# `Trial`'s, `PartialFixedSampler`'s, `GridSampler`'s
OUT_OF_RANGE = (r"Fixed parameter .* is out of range for distribution",
                r"The value .* is out of range of the parameter")


def open_study(
    spec: Spec, storage: optuna.storages.BaseStorage, notes: list[str] | None = None,
    found: optuna.Study | None = None,
) -> optuna.Study:
    """Create the study, or load it (`found`: the study already loaded from `storage`); its
    directions, metrics and param types must match the file (UsageError before anything is
    written). Refinements are added to `notes`. It samples and prunes as the file says."""
    directions = spec.study.objective_directions
    metrics = spec.study.objective_metrics
    sampler = searchspace.build_sampler(spec.study.sampler, spec.searched, str(spec.source))
    pruner = searchspace.build_pruner(spec.study.pruner, str(spec.source))
    if found is None:
        study = optuna.create_study(storage=storage, study_name=spec.study.name,
                                    sampler=sampler, pruner=pruner, directions=directions,
                                    load_if_exists=True)
    else:
        study, study.sampler, study.pruner = found, sampler, pruner
    said = check_stored(spec, study)
    if notes is not None:
        notes += said
    stored_metrics = study.user_attrs.get(METRICS)
    if stored_metrics is None:
        study.set_user_attr(METRICS, metrics)
    scheduler = None if spec.study.scheduler is None else \
        spec.study.scheduler.model_dump(mode="json")
    recorded, then = SCHEDULER in study.user_attrs, study.user_attrs.get(SCHEDULER)
    if recorded and then != scheduler and notes is not None:
        notes.append(scheduler_changed(then, scheduler))
    if (recorded and then != scheduler) or (not recorded and scheduler is not None):
        study.set_user_attr(SCHEDULER, scheduler)
    if study.metric_names is None:  # optuna-dashboard's names for the objectives
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metrics)
    return study


def scheduler_changed(then: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str:
    """The line that says `study.scheduler` changed since the study's last run."""
    def shown(settings: Mapping[str, Any] | None) -> str:
        return "none" if settings is None else str(settings.get("type"))

    if then is None or now is None or then.get("type") != now.get("type"):
        what = f"{shown(then)} -> {shown(now)}"
    else:
        what = ", ".join(f"{k} {then.get(k)!r} -> {now.get(k)!r}" for k in sorted(
            set(then) | set(now)) if then.get(k) != now.get(k))
    return (f"study.scheduler changed since the study's last run ({what}): what it decides "
            "from now on follows the new settings; earlier pauses, promotions and exploits "
            "stand, and n_trials still counts every configuration so far")


def _kind(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"categorical {short(repr(list(dist.choices)), 60)}"
    kind = "float" if isinstance(dist, FloatDistribution) else "int"
    return f"{kind}{' (log)' if getattr(dist, 'log', False) else ''}"


def check_stored(spec: Spec, study: optuna.Study) -> list[str]:
    """Compare the stored study with the file, writing nothing: its directions, metrics and
    param types must match (a ConfigError with every mismatch, one line each). Refinements (a
    changed range, a new param) are returned as one line each, to be said to the user."""
    file = str(spec.source)
    problems: list[Problem] = []
    directions = spec.study.objective_directions
    metrics = spec.study.objective_metrics
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        problems.append(Problem(
            file, "study.direction", f"study {spec.study.name!r} in storage optimises "
            f"{stored}, the file says {directions}; rename the study or fix the direction"))
    key = "study.metrics" if len(metrics) > 1 else "study.metric"
    stored_metrics = study.user_attrs.get(METRICS)
    if stored_metrics is not None and stored_metrics != metrics:
        problems.append(Problem(
            file, key, f"study {spec.study.name!r} in storage optimises {stored_metrics}, "
            f"the file says {metrics}; rename the study or fix the metric"))
    notes = check_params(spec, study, problems)
    if problems:
        raise ConfigError.of(problems)
    return notes


def check_params(
    spec: Spec, study: optuna.Study, problems: list[Problem] | None = None
) -> list[str]:
    """Compare the file's params with those the stored trials used.

    A param whose type (float, int, categorical), log scale or choices changed is a problem:
    Optuna cannot mix the two. Each is added to `problems` (without it, the first is raised
    as a ConfigError). A changed range or a new param is a refinement: returned as one line
    each, to be said to the user.
    """
    stored: dict[str, BaseDistribution] = {}
    trials = study.get_trials(deepcopy=False)
    for t in sorted(trials, key=lambda t: t.number):  # the latest trial's: a change is said
        for name, dist in t.distributions.items():  # once, not on every run after it
            stored[name] = dist
    notes = []
    found: list[Problem] = [] if problems is None else problems
    for name, dist in searchspace.distributions(spec.searched).items():
        old = stored.get(name)
        if old is None:
            if stored:
                notes.append(f"params.{name}: new in this run (earlier trials did not have "
                             "it; a lineage they started continues without it)")
            continue
        if _kind(old) != _kind(dist):
            found.append(Problem(
                str(spec.source), f"params.{name}", f"the stored study searched it as "
                f"{_kind(old)}, the file says {_kind(dist)}; a param's type, log scale and "
                "choices cannot change: rename the param or the study"))
        elif old != dist:
            out = sum(name in t.params and not _holds(dist, t.params[name]) for t in trials)
            notes.append(f"params.{name}: range changed from {_range(old)} to {_range(dist)}"
                         + (f"; the earlier trials outside it ({out}) are kept, and the "
                            "sampler is given them as they are, but new values are sampled "
                            "only inside it (a queued continuation or rerun keeps its own)"
                            if out else ""))
    if problems is None and found:
        raise ConfigError.of(found)
    return notes


def _holds(dist: BaseDistribution, value: Any) -> bool:
    """Whether `value` is one `dist` can sample: within [low, high], on its step."""
    if not isinstance(dist, (FloatDistribution, IntDistribution)):
        return True  # a categorical's choices cannot change (`check_params`)
    if not dist.low <= value <= dist.high:
        return False
    if dist.step is None:
        return True
    steps = (value - dist.low) / dist.step
    return abs(steps - round(steps)) < 1e-8


def _range(dist: BaseDistribution) -> str:
    """"[low, high]", and its step where it has one: "[0.0, 0.5] step 0.1"."""
    step = getattr(dist, "step", None)
    text = f"[{getattr(dist, 'low', None)}, {getattr(dist, 'high', None)}]"
    return text if step is None or (isinstance(dist, IntDistribution) and step == 1) else \
        f"{text} step {step}"


def suggest(trial: optuna.Trial, name: str, param: Searched) -> Any:
    """One searched param through Optuna's public suggest API."""
    if isinstance(param, FloatParam):
        return trial.suggest_float(name, param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, IntParam):
        return trial.suggest_int(name, param.low, param.high, step=param.step, log=param.log)
    return trial.suggest_categorical(name, param.choices)


def sample(
    study: optuna.Study, trial: optuna.Trial,
    searched: Mapping[str, Searched],
    sampler_for: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """The params of a trial just asked, sampled by `sampler_for(trial.number)` if given. A
    queued value outside a param's range (queued before the study file narrowed it) is taken
    as it is, without Optuna's warning: `check_params` says it once, in sweep's words."""
    if sampler_for is not None:
        study.sampler = sampler_for(trial.number)
    with warnings.catch_warnings():
        for message in OUT_OF_RANGE:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        return {name: suggest(trial, name, p) for name, p in searched.items()}
