"""A study's figures (plotly), for `sweep report` and the analysis notebook.

    from sweep.analysis import figures, summary
    s = summary.load("studies/quickstart.yaml")
    figures.objective(s).show()

Each function takes a `summary.Summary` (trials, devices, samples) and, where Optuna's own
`optuna.visualization` figure exists, the `optuna.Study` too; each returns a
`plotly.graph_objects.Figure` (a figure with a note in it when there is nothing to draw).
Pure: they read the frames and the study, and write nothing. The cost figure and its numbers
are `_cost`'s, the timeline `_device_timeline`'s; their public names are this module's too.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from sweep._core import names
from sweep.analysis._cost import (
    NO_ENERGY,
    STILL_ENERGY,
    cost_figures,
    costs,
    device_count,
    savings,
    with_costs,
)
from sweep.analysis._device_timeline import MAX_POINTS, NO_SAMPLES, NOT_MEASURED, timeline
from sweep.analysis._plotting import COLOURS
from sweep.analysis._plotting import empty as _empty
from sweep.analysis._plotting import go as _go
from sweep.analysis.summary import Summary

__all__ = ["MAX_CURVES", "MAX_IMPORTANCE_TRIALS", "MAX_PARALLEL_TRIALS", "MAX_POINTS",
           "NOT_MEASURED", "NO_ENERGY", "NO_SAMPLES", "STILL_ENERGY", "all_figures",
           "cost_figures", "costs", "device_count", "failures", "importances", "intermediate",
           "objective", "parallel", "pareto", "savings", "timeline", "with_costs"]

MAX_CURVES = 400  # intermediate-value curves drawn at most (the best and the latest)
MAX_IMPORTANCE_TRIALS = 1000  # finished trials the importances are computed on at most
MAX_PARALLEL_TRIALS = 500  # finished trials drawn in parallel coordinates at most
INK = (8 / 255, 48 / 255, 107 / 255)  # the darkest blue of Optuna's scale


def _legible(colour: str, k: float = 0.35) -> str:
    """`colour` mixed with INK: the palest of Optuna's blues still shows on a white page, and
    mixing is linear, so a colour scale mixed alike still matches the lines."""
    from plotly.colors import convert_colors_to_same_type

    (rgb,), _ = convert_colors_to_same_type([colour], colortype="tuple")
    mixed = (255 * (c * (1 - k) + i * k) for c, i in zip(rgb, INK, strict=True))
    return "rgb({:.0f},{:.0f},{:.0f})".format(*mixed)


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
        ends_x, ends_y, labels = [], [], []
        for t in shown:
            if t.state.name != state:
                continue
            steps = sorted(t.intermediate_values)
            xs += [*steps, math.nan]
            ys += [*(t.intermediate_values[k] for k in steps), math.nan]
            ends_x.append(steps[-1])
            ends_y.append(t.intermediate_values[steps[-1]])
            labels.append(f"trial {t.number}")
        if not labels:
            continue
        fig.add_trace(go.Scatter(x=np.array(xs), y=np.array(ys), mode="lines", name=state,
                                 legendgroup=state,
                                 line={"color": COLOURS[state], "width": 1}, opacity=0.6,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=ends_x, y=ends_y, mode="markers", legendgroup=state, showlegend=False,
            text=labels, hovertemplate="%{text}<br>step %{x}: %{y:.4g}<extra></extra>",
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
    lines, colours = [], []  # Optuna's worst trials are near white: drawn on white, unseen
    for i, trace in enumerate(fig.data):
        if trace.mode == "lines" and isinstance(trace.line.color, str):
            lines.append(i)
            colours.append(_legible(trace.line.color))
        elif trace.marker is not None and trace.marker.colorscale:
            trace.marker.colorscale = [[at, _legible(c)] for at, c in trace.marker.colorscale]
    # one restyle of the lines (a trace per trial), not an update through each one's validators
    fig.plotly_restyle({"line.color": colours, "opacity": [0.8] * len(lines)},
                       trace_indexes=lines)
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
