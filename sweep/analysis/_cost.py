"""What a study's trials cost: each trial's device-hours and energy (`with_costs`), the cost
figure and the numbers beside it, and the savings against training every configuration to the
end. Pure: they read the summary's frames and the study, and write nothing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd

from sweep._core import names
from sweep.analysis._plotting import COLOURS
from sweep.analysis._plotting import empty as _empty
from sweep.analysis._plotting import go as _go
from sweep.analysis._plotting import note as _note
from sweep.analysis.summary import Summary, ends
from sweep.study import savings as study_savings

NO_ENERGY = ("no energy measured:<br>the pool is simulated (SWEEP_FAKE_GPUS),<br>or the "
             "devices have no NVML energy counter")
STILL_ENERGY = ("0 kWh: the devices' NVML energy counters<br>did not move while these "
                "trials ran")


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
