"""What the devices did: the drivers' GPU samples read back, when each trial stopped
holding its devices, and each device's trials, busy time, utilisation and idle hours (pure
but for `read_samples`, which reads `<output_dir>/drivers/*/gpu_samples.csv`)."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from sweep._core import names


def last_seen(samples: pd.DataFrame) -> pd.Series:
    """When the GPU samples last showed each trial holding a device, by trial number: the
    last sign of life of a trial whose driver died."""
    if samples.empty:
        return pd.Series(dtype="datetime64[us]")
    held = samples.assign(trial=samples["trials"].astype(str).str.split(";")).explode("trial")
    held = held[held["trial"].str.fullmatch(r"\d+", na=False)]
    return held.groupby(held["trial"].astype(int))["time"].max()


def ends(trials: pd.DataFrame, samples: pd.DataFrame, reclaim_seconds: float = math.inf,
         now: datetime | None = None) -> pd.Series:
    """When each trial stopped holding its devices: when it was told; for one a reclaim told,
    its driver's last sign of life (`alive_until`); for a running one, `now` (default: now),
    unless its driver is gone (the GPU `samples` have not shown it for `reclaim_seconds`):
    the last sample that did. NaT for a trial not started."""
    moment = pd.Timestamp(now or datetime.now())
    end = trials["datetime_complete"].astype("datetime64[ns]")
    state = trials["state"] if "state" in trials else end.isna().map(
        {True: "RUNNING", False: "COMPLETE"})  # a frame of times only: the open ones run
    if names.ALIVE_UNTIL in trials:
        reclaimed = (state == "FAIL") & trials[names.ALIVE_UNTIL].notna()
        end = end.mask(reclaimed, trials[[names.ALIVE_UNTIL, "datetime_start"]].astype(
            "datetime64[ns]").max(axis=1))
    running = state == "RUNNING"
    end = end.mask(running, moment)
    if running.any() and "number" in trials:
        seen = pd.to_datetime(trials["number"].map(last_seen(samples).to_dict())).astype(
            "datetime64[ns]")
        gone = running & seen.notna() & (
            (moment - seen).dt.total_seconds() > reclaim_seconds)
        end = end.mask(gone, seen)
    return end


def read_samples(output_dir: Path) -> pd.DataFrame:
    """The samples of every driver that ran with this `output_dir` (sweep 0.2's single
    `gpu_samples.csv` too); an empty frame with the right columns if there are none yet.

    `time` is naive local time, like Optuna's `datetime_start`, so the two can be compared.
    """
    from sweep.gpus import SAMPLE_COLUMNS, SAMPLES_NAME

    files = sorted(output_dir.glob(f"drivers/*/{SAMPLES_NAME}"))
    if (output_dir / SAMPLES_NAME).is_file():
        files.insert(0, output_dir / SAMPLES_NAME)
    frames = [pd.read_csv(f, dtype={"trials": "string", "host": "string"},
                          on_bad_lines="skip") for f in files]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    samples = pd.concat(frames, ignore_index=True)
    if "host" not in samples:
        samples["host"] = pd.NA
    samples = samples[SAMPLE_COLUMNS]
    samples["trials"] = samples["trials"].fillna("")
    local = datetime.now().astimezone().tzinfo
    samples["time"] = (
        pd.to_datetime(samples["time"], unit="s", utc=True).dt.tz_convert(local)
        .dt.tz_localize(None)
    )
    return samples.sort_values("time", kind="stable", ignore_index=True)


def _union_seconds(intervals: list[tuple[pd.Timestamp, pd.Timestamp]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is not None and start < end:
            if stop > end:
                total += (stop - end).total_seconds()
                end = stop
        else:
            total += (stop - start).total_seconds()
            end = stop
    return total


def gpu_table(trials: pd.DataFrame, samples: pd.DataFrame,
              reclaim_seconds: float = math.inf) -> pd.DataFrame:
    """Per device of each host: trials run, busy fraction of the sweep's wall time,
    utilisation, idle hours.

    Wall time runs from the first trial's start to the last trial's end (`ends`: now, while
    trials run; a dead driver's trial at its last sign of life);
    a device is busy while it holds at least one trial. `util_mean_busy` is the mean sampled
    utilisation while busy (NaN without NVML).
    """
    columns = ["host", "gpu", "trials", "busy_s", "busy_fraction", "util_mean_busy",
               "idle_gpu_hours"]
    if trials.empty or trials["datetime_start"].isna().all():
        return pd.DataFrame(columns=columns)
    started = trials.dropna(subset=["datetime_start", "gpu"]).copy()
    if started.empty:
        return pd.DataFrame(columns=columns)
    started["host"] = started["host"].fillna("").astype(str) if "host" in started else ""
    samples = samples.copy()
    if not samples.empty:
        hosts = set(started["host"])
        # sweep 0.2's samples name no host: they are the one host's, if the trials have one
        samples["host"] = samples["host"].fillna(hosts.pop() if len(hosts) == 1 else "")
        samples["host"] = samples["host"].astype(str)
    until = ends(started, samples, reclaim_seconds)
    wall = (until.max() - started["datetime_start"].min()).total_seconds()
    places = set(zip(started["host"], started["gpu"].astype(int), strict=True))
    if not samples.empty:
        places |= set(zip(samples["host"], samples["gpu"].astype(int), strict=True))
    devices = [_devices(g, gs) for g, gs in zip(started["gpu"], started["gpus"], strict=True)] \
        if "gpus" in started else [[int(g)] for g in started["gpu"]]
    for host, many in zip(started["host"], devices, strict=True):
        places |= {(host, g) for g in many}
    rows = []
    for host, gpu in sorted(places):
        on = [gpu in many for many in devices]
        mine = started[(started["host"] == host) & pd.Series(on, index=started.index, dtype=bool)]
        intervals = list(zip(mine["datetime_start"], until[mine.index], strict=True))
        busy = _union_seconds(intervals)
        util = math.nan
        if not samples.empty:
            held = samples[(samples["host"] == host) & (samples["gpu"] == gpu)
                           & (samples["trials"] != "")]
            if held["util_gpu"].notna().any():
                util = float(held["util_gpu"].mean())
        rows.append({
            "host": host, "gpu": gpu, "trials": len(mine), "busy_s": busy,
            "busy_fraction": busy / wall if wall > 0 else math.nan,
            "util_mean_busy": util, "idle_gpu_hours": max(0.0, wall - busy) / 3600,
        })
    return pd.DataFrame(rows, columns=columns)


def _devices(gpu: Any, gpus: Any) -> list[int]:
    """All devices of a trial: its `gpus` ("0,1") when it had several, else its `gpu`."""
    if isinstance(gpus, str) and gpus:
        return [int(g) for g in gpus.split(",")]
    return [int(gpu)]
