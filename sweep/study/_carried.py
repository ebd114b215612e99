"""What an attempt just asked carries from its lineage's earlier attempts (`Store.ask`): its run
id (a new lineage gets one), the params it samples (none the study file added after its lineage
began), and the curve of intermediate values they reached (so the pruner compares what the
trial really reached).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import optuna

from sweep._core import ATTEMPT, FIXED_PARAMS, RETRY_OF, RUN_ID
from sweep.spec import Searched
from sweep.study._optuna_compat import trial_id
from sweep.trial import lineage


def lineage_of(study: optuna.Study, trial: optuna.Trial) -> lineage.Lineage:
    """The lineage of a trial just asked; a new one gets its run id, written before its
    owner record and params (a trial that has params has its run id: a kill in between
    left a continuation without one)."""
    line = lineage.Lineage.of(trial.user_attrs, trial.number)
    if line.run_id is None:
        run_id = lineage.new_run_id(study.study_name, line.origin)
        trial.set_user_attr(RUN_ID, run_id)
        line = dataclasses.replace(line, run_id=run_id)
    return line


def params(storage: optuna.storages.BaseStorage, study: optuna.Study, trial: optuna.Trial,
           line: lineage.Lineage, searched: Mapping[str, Searched]) -> Mapping[str, Searched]:
    """What a trial just asked samples: every searched param; an attempt that carries a
    lineage on, none the file added after its lineage began (no trial up to its first
    had it): its script's default, as in its earlier attempts. A param its lineage
    should have had but was not queued with (a driver killed while it sampled the first
    attempt) is sampled."""
    if line.continues is None:
        return searched
    queued = storage.get_trial(trial_id(trial)).system_attrs.get(FIXED_PARAMS)
    if not queued:  # queued with no params (by hand): it samples, as a new trial
        return searched
    known = {name for t in study.get_trials(deepcopy=False)
             if t.number <= line.origin for name in t.distributions}
    return {name: p for name, p in searched.items() if name in queued or name in known}


def curve(study: optuna.Study, trial: optuna.Trial, line: lineage.Lineage) -> int:
    """An attempt that resumes gets the curve (intermediate values) its lineage's earlier
    attempts reached, so the pruner compares what the trial really reached; reported
    through the trial, so a step it reports again keeps the earlier value (Optuna ignores
    a step already reported). Returns the curve's last step (0: none carried)."""
    if not line.resumes or len(study.directions) > 1:  # Optuna prunes one objective
        return 0
    earlier = [(int(t.user_attrs.get(ATTEMPT, 0)), t.intermediate_values)
               for t in study.get_trials(deepcopy=False)
               if t.number != trial.number and t.state.is_finished()
               and int(t.user_attrs.get(RETRY_OF, t.number)) == line.origin]
    merged = lineage.merged_curve(earlier)
    for step, value in sorted(merged.items()):
        trial.report(value, step)
    return max(merged, default=0)
