"""`sweep rerun`: a trial's params queued again as a new trial, recorded as `rerun_of`, once
the study file is found to search exactly what it ran."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep._core import UsageError
from sweep.commands._args import Verbs, common

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from sweep.spec import Spec


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep rerun STUDY NUMBER`."""
    rerun = verbs.add_parser("rerun", help="queue a trial's params again as a new trial")
    rerun.add_argument("study", help="the study YAML file")
    rerun.add_argument("number", type=int, help="the trial number to run again")
    rerun.set_defaults(func=main)
    return common(rerun)


def main(args: argparse.Namespace) -> int:
    """Queue the trial again; say so, and when it runs."""
    print(rerun(args.study, args.number, args.storage))
    return 0


def _same_params(path: str | Path, number: int, params: Mapping[str, Any],
                 spec: Spec) -> None:
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
    from sweep._core import RERUN_OF
    from sweep.spec import config, searchspace
    from sweep.study import check_stored, reading, storage_errors, unreachable

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
    told = f"queued trial {number}'s params again; {_when(path, spec, trials)}"
    changed = _changed(spec, old)
    return told if changed is None else f"{told} (note: since trial {number} ran, {changed})"


def _when(path: str | Path, spec: Spec, trials: list[FrozenTrial]) -> str:
    """When the trial queued on `trials` runs: at the next run, or with a larger budget."""
    from sweep import schedulers
    from sweep.study import FINISHED

    # the budget once every trial that is running or queued (this one too) has run
    needed = 1 + sum(1 for t in trials
                     if t.state in FINISHED or t.state.name in ("RUNNING", "WAITING"))
    budget = spec.study.n_trials
    if spec.study.scheduler is not None:  # a queued trial runs whatever n_trials says
        made = schedulers.configurations(trials) + 1
        return "it runs at the next `sweep run`, before new configurations" + (
            "" if made <= budget else f", {made - budget} more than study.n_trials "
            f"({made} configurations of {budget}: a queued trial runs whatever the budget "
            "says)")
    if needed <= budget:
        return "it runs at the next `sweep run`, before new trials"
    return (f"the budget of {budget} leaves no room for it: `sweep run {path} "
            f"--n-trials {needed}` runs it (and what is running or queued before it)")


def _changed(spec: Spec, old: FrozenTrial) -> str | None:
    """What changed in the trial's software since trial `old` ran (None: nothing known)."""
    from sweep.launch import make as launchers
    from sweep.launch import provenance
    from sweep.study import OwnerRecord

    now = provenance.RunRecord.find(spec, launchers.accelerate_record(spec))
    record = OwnerRecord.of(old.user_attrs)
    then = provenance.recorded(old.user_attrs, record.dir if record else None)
    return provenance.differences(then, now.versions())
