"""The timeline figure: which trial ran when on each device (and host), coloured by state,
and under it each device's sampled utilisation and memory. Pure: it reads the summary's
frames and writes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from sweep.analysis._cost import with_costs
from sweep.analysis._plotting import COLOURS
from sweep.analysis._plotting import empty as _empty
from sweep.analysis._plotting import go as _go
from sweep.analysis._plotting import note as _note
from sweep.analysis.summary import Summary

MAX_POINTS = 3000  # samples drawn per device and series at most (evenly thinned)
NO_SAMPLES = "no GPU samples yet"
NOT_MEASURED = ("no {what} measured: the pool is simulated (SWEEP_FAKE_GPUS), or NVML gives "
                "none for these devices")


def _thin(frame: pd.DataFrame, most: int = MAX_POINTS) -> pd.DataFrame:
    step = max(1, math.ceil(len(frame) / most))
    return frame.iloc[::step]


def _segments(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """[start0, end0, NaN, start1, end1, NaN, ...]: one line per pair, one trace for all."""
    out = np.full(3 * len(starts), np.nan)
    out[0::3] = starts
    out[1::3] = ends
    return out


def timeline(s: Summary) -> Any:
    """Which trial ran when on each device (and host), coloured by state; under it each
    device's sampled utilisation and memory. Gaps between bars are idle devices."""
    from plotly.subplots import make_subplots

    t = with_costs(s)
    title = "trials per GPU over time"
    started = t.dropna(subset=["datetime_start", "gpu"]) if not t.empty else t
    if started.empty:
        return _empty(title, "no trial has started yet")
    go = _go()
    gpus = started["gpus"] if "gpus" in started else pd.Series(None, index=started.index)
    placed = started.assign(device=[
        [int(x) for x in g.split(",")] if isinstance(g, str) and g else [int(d)]
        for g, d in zip(gpus, started["gpu"], strict=True)]).explode("device")
    placed["label"] = [f"{h} GPU {d}" if isinstance(h, str) and h else f"GPU {d}"
                       for h, d in zip(placed["host"], placed["device"], strict=True)]
    labels = sorted(set(placed["label"]))
    row_of = {label: i for i, label in enumerate(reversed(labels))}  # the first on top
    t0 = started["datetime_start"].min()

    def hours(times: pd.Series) -> np.ndarray:
        return ((times - t0).dt.total_seconds() / 3600).to_numpy(dtype=float)

    samples = s.samples
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.09,
                        row_heights=[0.5, 0.25, 0.25],
                        subplot_titles=("trials", "GPU utilisation (%)", "GPU memory used (GB)"))
    for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING"):
        part = placed[(placed["state"] == state) & placed["end"].notna()]
        if part.empty:
            continue
        rows = part["label"].map(row_of).to_numpy(dtype=float)
        numbers = part["number"].to_numpy(dtype=float)
        fig.add_trace(go.Scatter(  # numeric arrays, NaN between bars: fast to build and draw
            x=_segments(hours(part["datetime_start"]), hours(part["end"])),
            y=_segments(rows, rows), customdata=_segments(numbers, numbers),
            mode="lines", name=state, line={"color": COLOURS[state], "width": 14},
            hovertemplate="trial %{customdata}<extra></extra>"), row=1, col=1)
    _sample_lines(fig, samples, hours)
    fig.update_yaxes(tickvals=list(row_of.values()), ticktext=list(row_of),
                     range=[-0.6, len(labels) - 0.4], row=1, col=1)  # bars clear of titles
    drawn = np.concatenate([hours(placed["end"]), [0.0],
                            hours(samples["time"]) if not samples.empty else []])
    low, high = float(np.nanmin(drawn)), float(np.nanmax(drawn))
    pad = 0.01 * ((high - low) or 1 / 60)
    fig.update_xaxes(title_text=f"hours since {t0:%Y-%m-%d %H:%M:%S}", row=3, col=1,
                     range=[low - pad, high + pad])  # an empty row would widen it
    fig.update_layout(title=title, height=360 + 22 * len(labels))
    return fig


def _sample_lines(fig: Any, samples: pd.DataFrame,
                  hours: Callable[[pd.Series], np.ndarray]) -> None:
    """Each device's sampled utilisation (row 2) and memory (row 3), one colour per device in
    both, listed once; an empty row says why (a sample without figures draws nothing)."""
    from plotly.colors import DEFAULT_PLOTLY_COLORS

    go = _go()
    if samples.empty:
        for row in (2, 3):
            _note(fig, NO_SAMPLES, f"x{row}", shared_x=True)
        return
    listed: set[str] = set()
    devices = sorted({_device_label(h, g) for h, g in zip(samples["host"], samples["gpu"],
                                                          strict=True)})
    for row, column, what, scale in ((2, "util_gpu", "utilisation", 1.0),
                                     (3, "mem_used_mb", "memory use", 1 / 1024)):
        measured = samples.dropna(subset=[column])
        if measured.empty:
            _note(fig, NOT_MEASURED.format(what=what), f"x{row}", shared_x=True)
            continue
        for (host, gpu), part in measured.groupby(["host", "gpu"], dropna=False, sort=True):
            label = _device_label(host, gpu)
            colour = DEFAULT_PLOTLY_COLORS[devices.index(label) % len(DEFAULT_PLOTLY_COLORS)]
            part = _thin(part)
            fig.add_trace(go.Scatter(
                x=hours(part["time"]), y=(part[column] * scale).to_numpy(dtype=float),
                mode="lines", name=label, legendgroup=label, showlegend=label not in listed,
                line={"width": 1, "color": colour}), row=row, col=1)
            listed.add(label)


def _device_label(host: Any, gpu: Any) -> str:
    return f"{host} GPU {gpu}" if isinstance(host, str) and host else f"GPU {gpu}"
