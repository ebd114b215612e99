"""A scheduler's study (`study.scheduler`) in tables and figures, for `sweep report`: the
lineage tree (who was copied from whom, at which step, with which params), pauses, promotions
and exploits on the per-GPU timeline, and the fidelity of each rung (did its values predict
the end?). What the scheduler saved is `figures.savings`, for every study.

The tables are pure functions of the summary and the `optuna.Study` (tested exactly); the
figures draw them with plotly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sweep._core import PAUSED_AT, RESTORED_PARAMS, RESUMED_AT, RETRY_OF, STEPS_REPEATED
from sweep.analysis._cost import with_costs
from sweep.analysis._plotting import COLOURS, empty, go
from sweep.analysis.summary import Summary
from sweep.schedulers import history, rungs

# kind: (symbol, colour, offset from its bar's row): a pause above the bar pointing down at
# its end, a promotion below pointing up at its start, so the two at one moment both show
MARKS = {"paused": ("triangle-down", "#ff7f0e", 0.3), "promoted": ("triangle-up", "#2ca02c", -0.3),
         "exploited": ("diamond", "#9467bd", 0.0)}


def tree(s: Summary, study: Any) -> pd.DataFrame:
    """One row per lineage, by origin: `origin`, `donor` (the lineage it was copied from,
    <NA>: none), `copied_at` (the step it was copied at), `params` (its searched params,
    `name=value, ...`), `first_step`, `last_step` (<NA>: it reported none), `attempts`,
    `pauses`, `state` (its latest attempt's) and `value` (its final value, if it completed)."""
    columns = ["origin", "donor", "copied_at", "params", "first_step", "last_step",
               "attempts", "pauses", "state", "value"]
    trials = study.get_trials(deepcopy=False)
    lines = history.read(trials)
    attempts: dict[int, list[Any]] = {}
    for t in trials:
        attempts.setdefault(int(t.user_attrs.get(RETRY_OF, t.number)), []).append(t)
    rows = []
    for origin, line in sorted(lines.items()):
        done = line.latest.state.name == "COMPLETE"
        rows.append({
            "origin": origin, "donor": line.exploit_of, "copied_at": line.exploit_step,
            "params": ", ".join(f"{k}={_shown(v)}" for k, v in line.params.items()
                                if k in s.spec.searched),
            "first_step": min(line.curve) if line.curve else None,
            "last_step": line.last_step, "attempts": len(attempts[origin]),
            "pauses": sum(PAUSED_AT in t.user_attrs for t in attempts[origin]),
            "state": line.latest.state.name,
            "value": line.latest.value if done else None})
    frame = pd.DataFrame(rows, columns=columns)
    for col in ("donor", "copied_at", "first_step", "last_step"):
        frame[col] = pd.array(frame[col], dtype="Int64")
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def flagged(s: Summary) -> pd.DataFrame:
    """The trials whose resume or explore check failed, by number: `number`, `lineage`, `why`
    (a continuation that started over: `resumed_at`, `steps_repeated`; an exploit that ran
    with its donor's params: `restored_params`)."""
    columns = ["number", "lineage", "why"]
    t = s.trials
    rows = []
    for r in t.to_dict("records") if not t.empty else []:
        if pd.notna(r.get(STEPS_REPEATED)):
            rows.append((r["number"], r["lineage"], f"did not resume: reported step "
                         f"{int(r[RESUMED_AT])} first, "
                         f"{int(r[STEPS_REPEATED])} steps repeated"))
        if isinstance(r.get(RESTORED_PARAMS), str):
            rows.append((r["number"], r["lineage"], "ran with its donor's params restored "
                         f"from the checkpoint, not the perturbed ones: logged "
                         f"{r[RESTORED_PARAMS]}"))
    return pd.DataFrame(rows, columns=columns)


def rung_steps(s: Summary) -> list[int]:
    """The steps a scheduler decides at: asha's and hyperband's rungs; pbt's `interval`
    multiples below `max_steps`."""
    sched = s.spec.study.scheduler
    if sched is None:
        return []
    if sched.type == "pbt":
        return list(range(sched.interval, sched.max_steps, sched.interval))
    return list(rungs(sched.min_steps, sched.max_steps, sched.reduction_factor))


def fidelity(s: Summary, study: Any) -> pd.DataFrame:
    """For each rung step: `lineages`, how many lineages that completed reported a value at
    it (their curve spans it: at the first step reported at or after it), and `rho`, the
    Spearman rank correlation of those values with the lineages' final values (NaN under 3
    lineages, or when one side has a single rank)."""
    lines = history.read(study.get_trials(deepcopy=False))
    done = {o: line for o, line in lines.items() if line.latest.state.name == "COMPLETE"
            and line.latest.value is not None and line.curve}
    rows = []
    for step in rung_steps(s):
        pairs = [(v.value_at(step), float(v.latest.value or 0.0)) for v in done.values()
                 if min(v.curve) <= step <= max(v.curve)]
        early = pd.Series([p[0] for p in pairs], dtype=float)
        final = pd.Series([p[1] for p in pairs], dtype=float)
        rho = math.nan
        if len(pairs) >= 3 and early.nunique() > 1 and final.nunique() > 1:
            rho = float(np.corrcoef(early.rank(), final.rank())[0, 1])
        rows.append({"step": step, "lineages": len(pairs), "rho": rho})
    return pd.DataFrame(rows, columns=["step", "lineages", "rho"])


def timeline_marks(s: Summary) -> pd.DataFrame:
    """The scheduler's moments on the per-GPU timeline, one row each: `number` (the attempt),
    `host`, `gpu`, `kind` (`paused`: at its end, at step `step`; `promoted`: a paused lineage
    continued, at its start; `exploited`: a PBT lineage copied from a donor, at its start),
    `time`, `text`."""
    columns = ["number", "host", "gpu", "kind", "time", "step", "text"]
    t = with_costs(s)
    if t.empty or PAUSED_AT not in t:
        return pd.DataFrame(columns=columns)
    paused = set(t.loc[t[PAUSED_AT].notna(), "number"])
    rows: list[tuple[Any, ...]] = []
    for r in t.dropna(subset=["datetime_start", "gpu"]).itertuples():
        if pd.notna(r.paused_at) and pd.notna(r.end):
            rows.append((r.number, r.host, r.gpu, "paused", r.end, int(r.paused_at),
                         f"trial {r.number} paused at step {int(r.paused_at)}"))
        if pd.notna(r.continues) and int(r.continues) in paused:
            rows.append((r.number, r.host, r.gpu, "promoted", r.datetime_start, None,
                         f"trial {r.number} continues paused trial {int(r.continues)}"))
        if pd.notna(r.exploit_of):
            rows.append((r.number, r.host, r.gpu, "exploited", r.datetime_start, None,
                         f"trial {r.number} copied from trial {int(r.exploit_of)}"))
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["time", "number"], kind="stable", ignore_index=True)


def mark_timeline(fig: Any, s: Summary) -> Any:
    """`figures.timeline(s)` with the scheduler's moments drawn on its bars."""
    marks = timeline_marks(s)
    rows = fig.layout.yaxis.tickvals
    if marks.empty or rows is None:
        return fig
    row_of = dict(zip(fig.layout.yaxis.ticktext, rows, strict=True))
    started = with_costs(s).dropna(subset=["datetime_start", "gpu"])
    t0 = started["datetime_start"].min()
    label = [f"{h} GPU {int(g)}" if isinstance(h, str) and h else f"GPU {int(g)}"
             for h, g in zip(marks["host"], marks["gpu"], strict=True)]
    marks = marks.assign(row=[row_of.get(x) for x in label]).dropna(subset=["row"])
    for kind, (symbol, colour, offset) in MARKS.items():
        part = marks[marks["kind"] == kind]
        if part.empty:
            continue
        fig.add_trace(go().Scatter(
            x=((part["time"] - t0).dt.total_seconds() / 3600).to_numpy(dtype=float),
            y=part["row"].to_numpy(dtype=float) + offset, mode="markers", name=kind,
            text=list(part["text"]), hovertemplate="%{text}<extra></extra>",
            marker={"symbol": symbol, "size": 11, "color": colour,
                    "line": {"width": 1, "color": "#222"}}), row=1, col=1)
    return fig


def tree_figure(frame: pd.DataFrame) -> Any:
    """The lineage tree: each lineage a line over the steps it ran (its row, by origin),
    coloured by its latest state; a dotted link from a donor at the step it was copied at
    to the lineage copied from it; each lineage's params in its hover."""
    title = "lineages: steps run, and who was copied from whom"
    drawn = frame.dropna(subset=["last_step"])
    if drawn.empty:
        return empty(title, "no lineage has reported a step yet")
    g = go()
    fig = g.Figure()
    row_of = {int(o): i for i, o in enumerate(drawn["origin"])}
    for state, part in drawn.groupby("state", sort=True):
        xs, ys, text = [], [], []
        for r in part.itertuples():
            start = r.first_step if pd.isna(r.copied_at) else r.copied_at
            xs += [float(start), float(r.last_step), None]
            ys += [row_of[int(r.origin)]] * 2 + [None]
            said = f"lineage {r.origin}: {r.params}" + (
                f"<br>copied from {r.donor} at step {r.copied_at}" if pd.notna(r.donor) else "")
            text += [said, said, None]
        fig.add_trace(g.Scatter(x=xs, y=ys, mode="lines+markers", name=str(state),
                                text=text, hovertemplate="%{text}<extra></extra>",
                                line={"color": COLOURS.get(str(state), "#7f7f7f"),
                                      "width": 6}, marker={"size": 7}))
    links = drawn[drawn["donor"].notna() & drawn["donor"].isin(list(row_of))]
    if not links.empty:
        xs, ys = [], []
        for r in links.itertuples():
            xs += [float(r.copied_at), float(r.copied_at), None]
            ys += [row_of[int(r.donor)], row_of[int(r.origin)], None]
        fig.add_trace(g.Scatter(x=xs, y=ys, mode="lines", name="copied from",
                                line={"color": "#9467bd", "dash": "dot", "width": 2},
                                hoverinfo="skip"))
    fig.update_yaxes(tickvals=list(row_of.values()), ticktext=[f"lineage {o}" for o in row_of],
                     autorange="reversed")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=200 + 24 * len(row_of))
    return fig
