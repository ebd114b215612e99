"""A study's trials -> one DataFrame row each, with the columns the docs name
(docs/how-to/read-results.md): its values and params, the attributes sweep stored on it
(`sweep._core.names`), and its lineage's attempts and device-seconds (pure: study in,
frame out)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pandas as pd

from sweep._core import names
from sweep.spec import Spec
from sweep.study import attrs

# the trial's attributes shown as they are stored, each a column of its name
ATTR_COLUMNS = [names.GPU, names.GPUS, names.EXIT_CODE, names.FAIL_REASON, *names.USAGE,
                names.ATTEMPT, names.RETRY_OF, *names.RAN]
# study.scheduler's records (`names.SCHEDULER_RECORDS`): a paused attempt's step, a PBT
# exploit's donor, a continuation that did not resume from its checkpoint, and an exploit that
# ran with its donor's params (`name=logged value`)
SCHEDULER_COLUMNS = [names.PAUSED_AT, names.EXPLOIT_OF, names.RESUMED_AT,
                     names.STEPS_REPEATED, names.RESTORED_PARAMS]
# trial numbers and counts that a row may lack (a trial an older sweep left RUNNING has no
# attempt): integers still, not floats
INTEGER_COLUMNS = (names.ATTEMPT, names.RETRY_OF, names.RERUN_OF, names.CONTINUES)


def seconds(start: datetime | None, end: datetime | None) -> float:
    """From `start` to `end` in seconds; NaN where either is unknown."""
    if start is None or end is None:
        return math.nan
    return (end - start).total_seconds()


def trials_frame(study: Any, spec: Spec) -> pd.DataFrame:
    """One row per trial with the columns the README documents."""
    metrics = spec.study.objective_metrics
    multi = len(metrics) > 1
    front = {t.number for t in study.best_trials} if multi else set()
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        values = t.values or [math.nan] * len(metrics)
        if multi:
            row.update({f"values_{m}": v for m, v in zip(metrics, values, strict=True)})
            row["pareto"] = t.number in front
        else:
            row["value"] = values[0]
        row.update({f"params_{k}": v for k, v in t.params.items()})
        record = attrs.OwnerRecord.of(t.user_attrs)
        for key in ATTR_COLUMNS:
            row[key] = t.user_attrs.get(key)
        if row[names.GPU] is None and record is not None:  # not noted (yet): the record's
            row[names.GPU], row[names.GPUS] = record.gpu, record.gpus
        row["datetime_start"] = t.datetime_start
        row["datetime_complete"] = t.datetime_complete
        row["duration_s"] = seconds(t.datetime_start, t.datetime_complete)
        row[names.HOST] = t.user_attrs.get(names.HOST) or (record.owner.host if record else None)
        row[names.RERUN_OF] = t.user_attrs.get(names.RERUN_OF)
        row[names.CONTINUES] = t.user_attrs.get(names.CONTINUES)
        alive = t.user_attrs.get(names.ALIVE_UNTIL)
        row[names.ALIVE_UNTIL] = (datetime.fromtimestamp(alive)
                                  if isinstance(alive, int | float) else None)
        for key in SCHEDULER_COLUMNS:
            row[key] = t.user_attrs.get(key)
        restored = row[names.RESTORED_PARAMS]
        if isinstance(restored, dict):
            row[names.RESTORED_PARAMS] = ", ".join(f"{k}={v:g}" for k, v in restored.items())
        row.update({k: v for k, v in t.user_attrs.items() if k.startswith(names.METRIC_PREFIX)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    params = [c for c in frame.columns if c.startswith("params_")]
    order = ["number", "state", *[c for c in frame.columns if c.startswith(("value", "pareto"))],
             *params, names.GPU, names.GPUS, "datetime_start", "datetime_complete", "duration_s",
             *[c for c in ATTR_COLUMNS if c not in (names.GPU, names.GPUS)], names.HOST,
             names.ALIVE_UNTIL, names.RERUN_OF,
             *sorted(c for c in frame.columns if c.startswith(names.METRIC_PREFIX)),
             names.CONTINUES, *SCHEDULER_COLUMNS]
    frame = _with_lineages(frame[order])
    for col in (*names.USAGE, "duration_s"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in ("datetime_start", "datetime_complete", names.ALIVE_UNTIL):  # all None: times
        frame[col] = frame[col].astype("datetime64[us]")
    for col in (names.GPU, names.EXIT_CODE):
        frame[col] = pd.array(frame[col], dtype="Int64")
    for col in INTEGER_COLUMNS:
        frame[col] = pd.array(frame[col], dtype="Int64")
    return frame


def _with_lineages(frame: pd.DataFrame) -> pd.DataFrame:
    """Add each trial's lineage (`lineage`: its first attempt's number; see `sweep.trial.lineage`),
    how many attempts the lineage has had (`lineage_attempts`) and the device-seconds they
    took together (`lineage_device_s`: each attempt's duration, until its driver's last sign
    of life for one a reclaim told, times its devices; a running one counts as far as it is
    known)."""
    frame = frame.copy()
    origin = pd.to_numeric(frame[names.RETRY_OF], errors="coerce")
    frame["lineage"] = pd.array(origin.fillna(frame["number"]), dtype="Int64")
    width = frame[names.GPUS].map(lambda g: len(str(g).split(",")) if isinstance(g, str) else 1)
    seconds = pd.to_numeric(frame["duration_s"], errors="coerce")
    alive = pd.to_datetime(frame[names.ALIVE_UNTIL]) - pd.to_datetime(frame["datetime_start"])
    seconds = seconds.mask(alive.notna(), alive.dt.total_seconds().clip(lower=0.0))
    device_s = seconds.fillna(0.0) * width
    by = frame.groupby("lineage")
    frame["lineage_attempts"] = by["number"].transform("count")
    frame["lineage_device_s"] = device_s.groupby(frame["lineage"]).transform("sum")
    return frame
