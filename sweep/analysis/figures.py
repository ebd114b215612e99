"""A study's figures (plotly), for `sweep report` and the analysis notebook.

    from sweep.analysis import figures, summary
    s = summary.load("studies/quickstart.yaml")
    figures.objective(s).show()

Each function takes a `summary.Summary` (trials, devices, samples) and, where Optuna's own
`optuna.visualization` figure exists, the `optuna.Study` too; each returns a
`plotly.graph_objects.Figure` (a figure with a note in it when there is nothing to draw).
Pure: they read the frames and the study, and write nothing.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from sweep._core import names
from sweep.analysis.plotting import COLOURS
from sweep.analysis.plotting import empty as _empty
from sweep.analysis.plotting import go as _go
from sweep.analysis.plotting import note as _note
from sweep.analysis.summary import Summary, ends
from sweep.study import savings as study_savings

MAX_CURVES = 400  # intermediate-value curves drawn at most (the best and the latest)
MAX_POINTS = 3000  # samples drawn per device and series at most (evenly thinned)
MAX_IMPORTANCE_TRIALS = 1000  # finished trials the importances are computed on at most
MAX_PARALLEL_TRIALS = 500  # finished trials drawn in parallel coordinates at most
INK = (8 / 255, 48 / 255, 107 / 255)  # the darkest blue of Optuna's scale
NO_SAMPLES = "no GPU samples yet"
NOT_MEASURED = ("no {what} measured: the pool is simulated (SWEEP_FAKE_GPUS), or NVML gives "
                "none for these devices")
NO_ENERGY = ("no energy measured:<br>the pool is simulated (SWEEP_FAKE_GPUS),<br>or the "
             "devices have no NVML energy counter")
STILL_ENERGY = ("0 kWh: the devices' NVML energy counters<br>did not move while these "
                "trials ran")


def _legible(colour: str, k: float = 0.35) -> str:
    """`colour` mixed with INK: the palest of Optuna's blues still shows on a white page, and
    mixing is linear, so a colour scale mixed alike still matches the lines."""
    from plotly.colors import convert_colors_to_same_type

    (rgb,), _ = convert_colors_to_same_type([colour], colortype="tuple")
    mixed = (255 * (c * (1 - k) + i * k) for c, i in zip(rgb, INK, strict=True))
    return "rgb({:.0f},{:.0f},{:.0f})".format(*mixed)


def device_count(trials: pd.DataFrame) -> pd.Series:
    """Devices each trial held: the length of its `gpus` ("0,1") when it had several, else 1."""
    if "gpus" not in trials:
        return pd.Series(1, index=trials.index)
    return trials["gpus"].map(lambda g: len(str(g).split(",")) if isinstance(g, str) and g
                              else 1)


def with_costs(s: Summary, now: datetime | None = None) -> pd.DataFrame:
    """The trials with `end`, `device_hours`, `energy_kwh` and, in order of ending,
    `cum_device_hours` and `hours` (since the first start). A trial's `end` is when it
    stopped holding its devices: when it was told; for one a reclaim told, its driver's last
    sign of life (`alive_until`); for a running one, now, unless its driver is gone (the GPU
    samples have not shown it for `study.reclaim_after`): its last sample."""
    t = s.trials.copy()
    if t.empty:
        return t
    t["end"] = ends(t, s.samples, s.spec.study.reclaim_seconds, now)
    seconds = (t["end"] - t["datetime_start"]).dt.total_seconds()
    t["device_hours"] = seconds.fillna(0.0) * device_count(t) / 3600
    t["energy_kwh"] = pd.to_numeric(t[names.ENERGY_J], errors="coerce") / 3.6e6
    first = t["datetime_start"].min()
    t = t.sort_values("end", kind="stable", na_position="last")
    t["cum_device_hours"] = t["device_hours"].cumsum()
    t["hours"] = (t["end"] - first).dt.total_seconds() / 3600
    return t.sort_values("number", kind="stable")


def savings(s: Summary, study: Any) -> dict[str, float | int]:
    """What training every configuration to the end would have cost, against what was spent
    (`sweep.study.savings`, each attempt's device-hours as `with_costs` counts them):
    `device_hours` spent, `steps` trained (from the step numbers reported), `pauses`, `stops`
    (attempts stopped before the end, told PRUNED),
    `configurations`, `max_steps` (the scheduler's; without one, the steps of the longest
    lineage that completed), `full_device_hours` and `saved_device_hours`; {} before a step
    is trained."""
    t = with_costs(s)
    hours = {} if t.empty else dict(zip(t["number"], t["device_hours"], strict=True))
    sched = s.spec.study.scheduler
    found = study_savings.savings(study.get_trials(deepcopy=False), hours,
                                  None if sched is None else sched.max_steps)
    if found is None:
        return {}
    return {"device_hours": found.device_hours, "steps": found.steps, "pauses": found.pauses,
            "stops": found.stops,
            "configurations": found.configurations, "max_steps": found.max_steps,
            "full_device_hours": found.full_device_hours,
            "saved_device_hours": found.saved_device_hours}


def _objective_columns(s: Summary) -> list[str]:
    metrics = s.spec.study.objective_metrics
    return ["value"] if len(metrics) == 1 else [f"values_{m}" for m in metrics]


def objective(s: Summary) -> Any:
    """Each objective value and the best so far, against wall time (hours since the first
    trial started) and against cumulative device-hours; pruned trials at their last report."""
    from plotly.subplots import make_subplots

    t = with_costs(s)
    column = _objective_columns(s)[0]
    metric = s.spec.study.objective_metrics[0]
    title = f"{metric} by trial, and the best so far"
    if t.empty or column not in t or t[column].notna().sum() == 0:
        return _empty(title, "no trial has a value yet")
    go = _go()
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("against wall time", "against device-hours spent"))
    minimize = s.spec.study.objective_directions[0] == "minimize"
    ordered = t.sort_values("end", kind="stable")
    done = ordered[ordered["state"] == "COMPLETE"]
    best = done[column].cummin() if minimize else done[column].cummax()
    for col, x in ((1, "hours"), (2, "cum_device_hours")):
        for state in ("COMPLETE", "PRUNED", "FAIL"):
            part = t[(t["state"] == state) & t[column].notna()]
            if part.empty:
                continue
            fig.add_trace(go.Scatter(
                x=part[x], y=part[column], mode="markers", name=state, legendgroup=state,
                showlegend=col == 1, marker={"color": COLOURS[state], "size": 6,
                                             "symbol": "x" if state == "PRUNED" else "circle"},
                text=[f"trial {n}" for n in part["number"]],
                hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"), row=1, col=col)
        if not done.empty:
            fig.add_trace(go.Scatter(x=done[x], y=best, mode="lines", line_shape="hv",
                                     name="best so far", legendgroup="best",
                                     showlegend=col == 1, line={"color": "black"}),
                          row=1, col=col)
    fig.update_xaxes(title_text="hours since the first trial started", row=1, col=1)
    fig.update_xaxes(title_text="device-hours", row=1, col=2)
    fig.update_yaxes(title_text=metric, row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def intermediate(s: Summary, study: Any) -> Any:
    """Each trial's intermediate values by step; a pruned trial's last one marked with an x.
    At most MAX_CURVES trials: the best finished ones and the latest."""
    title = "intermediate values"
    trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    if not trials:
        return _empty(title, "no trial reported an intermediate value (trainer.report)")
    shown = trials
    if len(trials) > MAX_CURVES:
        minimize = s.spec.study.objective_directions[0] == "minimize"
        valued = [t for t in trials if t.value is not None]
        best = sorted(valued, key=lambda t: t.value if minimize else -t.value)
        numbers = {t.number for t in best[: MAX_CURVES // 2]}
        numbers |= {t.number for t in trials[-(MAX_CURVES - len(numbers)):]}
        shown = [t for t in trials if t.number in numbers]
        title += f" ({len(shown)} of {len(trials)} trials: the best and the latest)"
    go = _go()
    fig = go.Figure()
    for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING"):
        xs: list[float] = []
        ys: list[float] = []
        ends_x, ends_y, names = [], [], []
        for t in shown:
            if t.state.name != state:
                continue
            steps = sorted(t.intermediate_values)
            xs += [*steps, math.nan]
            ys += [*(t.intermediate_values[k] for k in steps), math.nan]
            ends_x.append(steps[-1])
            ends_y.append(t.intermediate_values[steps[-1]])
            names.append(f"trial {t.number}")
        if not names:
            continue
        fig.add_trace(go.Scatter(x=np.array(xs), y=np.array(ys), mode="lines", name=state,
                                 legendgroup=state,
                                 line={"color": COLOURS[state], "width": 1}, opacity=0.6,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=ends_x, y=ends_y, mode="markers", legendgroup=state, showlegend=False,
            text=names, hovertemplate="%{text}<br>step %{x}: %{y:.4g}<extra></extra>",
            marker={"color": COLOURS[state], "size": 8 if state == "PRUNED" else 4,
                    "symbol": "x" if state == "PRUNED" else "circle"}))
    fig.update_layout(title=title, xaxis_title="step",
                      yaxis_title=s.spec.study.objective_metrics[0], height=420)
    return fig


def _target(s: Summary, index: int = 0) -> tuple[Callable[[Any], float] | None, str | None]:
    metrics = s.spec.study.objective_metrics
    if len(metrics) == 1:
        return None, None
    return (lambda t: t.values[index]), metrics[index]


def _finished(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def parallel(s: Summary, study: Any) -> Any:
    """Optuna's parallel-coordinate figure of the params and the (first) objective."""
    import optuna.visualization as vis

    title = "parallel coordinates"
    done = _finished(study)
    if not done or not s.spec.params:
        return _empty(title, "no COMPLETE trial yet")
    source, note = _latest(study, done, MAX_PARALLEL_TRIALS)
    target, name = _target(s)
    fig = vis.plot_parallel_coordinate(source, target=target,
                                       target_name=name or "Objective Value")
    for trace in fig.data:  # Optuna's worst trials are near white: drawn on white, unseen
        if trace.mode == "lines" and isinstance(trace.line.color, str):
            trace.update(line_color=_legible(trace.line.color), opacity=0.8)
        elif trace.marker is not None and trace.marker.colorscale:
            trace.marker.colorscale = [[at, _legible(c)] for at, c in trace.marker.colorscale]
    fig.update_layout(title=f"{title}{note}", height=420)
    return fig


def _latest(study: Any, done: list[Any], most: int) -> tuple[Any, str]:
    """`study`, or an in-memory copy of its latest `most` finished trials; a title note."""
    import optuna

    if len(done) <= most:
        return study, ""
    copy = optuna.create_study(directions=study.directions)
    copy.add_trials(done[-most:])
    return copy, f" (the latest {most} of {len(done)} COMPLETE trials)"


def importances(s: Summary, study: Any) -> Any:
    """Optuna's parameter importances (fANOVA), on the latest MAX_IMPORTANCE_TRIALS finished
    trials at most."""
    import optuna.visualization as vis

    title = "parameter importances"
    done = _finished(study)
    if len(done) < 2 or not s.spec.params:
        return _empty(title, "needs two COMPLETE trials")
    source, note = _latest(study, done, MAX_IMPORTANCE_TRIALS)
    title += note
    target, name = _target(s)
    try:
        with warnings.catch_warnings():  # its evaluator's advice on the target's direction
            warnings.simplefilter("ignore")
            fig = vis.plot_param_importances(source, target=target,
                                             target_name=name or "Objective Value")
    except (ValueError, RuntimeError) as e:  # e.g. every trial has the same params
        return _empty(title, f"cannot be computed: {e}")
    fig.update_layout(title=title, height=360)
    return fig


def pareto(s: Summary, study: Any) -> Any:
    """Optuna's Pareto-front figure (several objectives only)."""
    import optuna.visualization as vis

    if not _finished(study):
        return _empty("Pareto front", "no COMPLETE trial yet")
    fig = vis.plot_pareto_front(study, target_names=s.spec.study.objective_metrics)
    fig.update_layout(height=420)
    return fig


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


def costs(s: Summary) -> Any:
    """Device-hours and energy per state (what FAIL and PRUNED cost), and per trial (energy:
    NVML's counter over the trial; none on a simulated pool)."""
    from plotly.subplots import make_subplots

    t = with_costs(s)
    title = "cost: device-hours and energy"
    if t.empty:
        return _empty(title, "no trial yet")
    go = _go()
    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.08, vertical_spacing=0.16,
                        subplot_titles=("device-hours by state", "energy (kWh) by state",
                                        "device-hours per trial", "energy (kWh) per trial"))
    by = t.groupby("state")[["device_hours", "energy_kwh"]].sum(min_count=1)
    colours = [COLOURS.get(str(state), "#7f7f7f") for state in by.index]
    fig.add_trace(go.Bar(x=list(by.index), y=by["device_hours"], marker_color=colours,
                         showlegend=False), row=1, col=1)
    measured = t["energy_kwh"].notna().any()
    if measured and (by["energy_kwh"].fillna(0.0) > 0).any():
        fig.add_trace(go.Bar(x=list(by.index), y=by["energy_kwh"].fillna(0.0),
                             marker_color=colours, showlegend=False), row=1, col=2)
    elif measured:  # bars of 0 draw nothing: say why
        _note(fig, STILL_ENERGY, "x2")
    else:
        _note(fig, NO_ENERGY, "x2")
        _note(fig, NO_ENERGY, "x4")
    for state, part in t.groupby("state"):
        for col, column in ((1, "device_hours"), (2, "energy_kwh")):
            if col == 2 and not measured:
                continue
            fig.add_trace(go.Scatter(
                x=part["number"].to_numpy(dtype=float),
                y=part[column].to_numpy(dtype=float), mode="markers", name=str(state),
                legendgroup=str(state), showlegend=col == 1,
                marker={"color": COLOURS.get(str(state)), "size": 4}), row=2, col=col)
    fig.update_xaxes(title_text="trial", row=2, col=1)
    fig.update_xaxes(title_text="trial" if measured else None, row=2, col=2)
    fig.update_layout(title=title, height=620)
    return fig


def cost_figures(s: Summary) -> dict[str, float | int | None]:
    """The numbers beside the cost figure: device-hours and kWh in all, by FAIL and PRUNED
    trials, and spent until the best trial ended (one objective)."""
    t = with_costs(s)
    if t.empty:
        return {}
    energy = t["energy_kwh"].sum(min_count=1)
    out: dict[str, float | int | None] = {
        "device_hours": float(t["device_hours"].sum()),
        "energy_kwh": None if pd.isna(energy) else float(energy),
        "fail_device_hours": float(t.loc[t["state"] == "FAIL", "device_hours"].sum()),
        "pruned_device_hours": float(t.loc[t["state"] == "PRUNED", "device_hours"].sum()),
    }
    done = t[t["state"] == "COMPLETE"]
    if "value" in t and not done.empty and done["value"].notna().any():
        minimize = s.spec.study.objective_directions[0] == "minimize"
        best = done.loc[done["value"].idxmin() if minimize else done["value"].idxmax()]
        out["best_trial"] = int(best["number"])
        out["best_value"] = float(best["value"])
        out["device_hours_to_best"] = float(best["cum_device_hours"])
    return out


def failures(s: Summary, most: int = 30) -> pd.DataFrame:
    """FAIL trials grouped by reason, most frequent first: `reason, count, trials` (their
    numbers, at most `most` listed)."""
    t = s.trials
    columns = ["reason", "count", "trials"]
    if t.empty or names.FAIL_REASON not in t:
        return pd.DataFrame(columns=columns)
    failed = t[t["state"] == "FAIL"]
    rows = []
    for reason, part in failed.groupby(failed[names.FAIL_REASON].fillna("(no reason stored)")):
        numbers = sorted(int(n) for n in part["number"])
        shown = ", ".join(map(str, numbers[:most])) + (
            f", … ({len(numbers) - most} more)" if len(numbers) > most else "")
        rows.append({"reason": str(reason), "count": len(numbers), "trials": shown})
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("count", ascending=False, kind="stable", ignore_index=True)


def all_figures(s: Summary, study: Any) -> dict[str, Any]:
    """The report's figures by name, in the order it shows them."""
    multi = len(s.spec.study.objective_metrics) > 1
    figs = {"objective": objective(s)}
    if multi:
        figs["pareto"] = pareto(s, study)
    else:
        figs["intermediate"] = intermediate(s, study)
    figs["parallel"] = parallel(s, study)
    figs["importances"] = importances(s, study)
    figs["timeline"] = timeline(s)
    figs["costs"] = costs(s)
    return figs
