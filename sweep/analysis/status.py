"""The study's state now, for `sweep status`: trial counts by state, and each running
trial's place, age, last report and whether its driver lives."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

from sweep.analysis.summary import load_study, seconds
from sweep.spec import Spec, config
from sweep.study import attrs, ownership
from sweep.trial import folders, hang, launch_plan


@dataclass
class Status:
    """Trial counts by state; one row per running trial (`number, gpu, host, elapsed_s,
    last_step, last_value, driver`, where gpu is "1,2" for a trial of several devices and
    driver is "alive", "gone" or "elsewhere")."""

    counts: dict[str, int]
    running: pd.DataFrame


def status(study_file: str | Path, storage: str | None = None) -> Status:
    """The study's state now: counts, and each running trial's place, age and last report."""
    spec = config.load(study_file, runnable=False, storage=storage)
    study = load_study(spec)
    counts: dict[str, int] = {}
    rows = []
    now = datetime.now()
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
        if t.state.name != "RUNNING":
            continue
        record = attrs.OwnerRecord.of(t.user_attrs)
        here = record is not None and record.owner.host == ownership.host_name()
        last = max(t.intermediate_values) if t.intermediate_values else None
        rows.append({
            "number": t.number,
            "gpu": None if record is None else record.gpus or record.gpu,
            "host": None if record is None else record.owner.host,
            "elapsed_s": seconds(t.datetime_start, now),
            "last_step": last, "last_value": t.intermediate_values.get(last, math.nan)
            if last is not None else math.nan,
            "driver": ("alive" if record.owner.alive() else "gone") if here and record
            else "elsewhere",
            "silent_s": _silent(spec, t.number),
        })
    columns = ["number", "gpu", "host", "elapsed_s", "last_step", "last_value", "driver",
               "silent_s"]
    return Status(counts, pd.DataFrame(rows, columns=columns))


def _silent(spec: Spec, number: int) -> float:
    """Seconds since the trial last wrote its stdout, stderr, reports or result (NaN: none of
    them is in its folder here)."""
    paths = folders.TrialPaths.of(spec.output_dir, number)
    files = [paths.stdout, paths.stderr, paths.reports, paths.result]
    places = {**launch_plan.spec_places(spec), "trial_dir": str(paths.dir),
              "trial_number": str(number)}
    with contextlib.suppress(KeyError):  # a placeholder only the driver knows (a lineage's)
        files.append(launch_plan.result_path(spec.trainer, paths, places,
                                        launch_plan.trial_cwd(spec.trainer, places)))
    silent = hang.silence(files, time.time())
    return math.nan if silent is None else silent
