"""`sweep report`: one self-contained HTML file of a study's figures (`sweep.analysis.figures`).

It works offline: plotly.js is inlined once, and nothing is fetched. It only reads: storage
through Optuna and the drivers' GPU samples, as `sweep summary` does; writing the file is
`write`.
"""

from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path
from typing import Any

from sweep._core import UsageError, userfiles
from sweep.analysis import figures, lineage_figures
from sweep.analysis.summary import Summary, gpu_table, own_files, read_samples, trials_frame
from sweep.spec import Spec, config
from sweep.study import storage

REPORT_NAME = "report.html"

_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1300px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
.num{text-align:right}.note{color:#666}"""


def load(study_file: str | Path, storage_url: str | None = None) -> tuple[Summary, Any]:
    """The study file's summary and its `optuna.Study`, read from storage (nothing written);
    UsageError when it has not run yet."""
    spec = config.load(study_file, runnable=False, storage=storage_url)
    return load_spec(spec)


def load_spec(spec: Spec) -> tuple[Summary, Any]:
    study = storage.read_study(spec)
    if study is None:
        raise UsageError(f"{spec.source}: no study named {spec.study.name!r} in "
                         f"{spec.storage.shown} yet; run the study first")
    trials = trials_frame(study, spec)
    samples = read_samples(spec.output_dir)
    return Summary(spec, trials, gpu_table(trials, samples, spec.study.reclaim_seconds),
                   samples), study


def render(s: Summary, study: Any, now: datetime | None = None) -> str:
    """The report's HTML text."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    figs = figures.all_figures(s, study)
    lines = None
    if s.spec.study.scheduler is not None:  # pauses and promotions on the timeline; lineages
        figs["timeline"] = lineage_figures.mark_timeline(figs["timeline"], s)
        lines = lineage_figures.tree(s, study)
        figs["lineages"] = lineage_figures.tree_figure(lines)
    counts = s.trials["state"].value_counts().to_dict() if not s.trials.empty else {}
    said = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no trials"
    when = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(s.spec.study.name)}: sweep report</title>",
        f"<style>{_STYLE}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>', "</head><body>",
        f"<h1>{html.escape(s.spec.study.name)}</h1>",
        f'<p>{html.escape(said)}; written {when} from '
        f"{html.escape(str(s.spec.source))}</p>",
    ]
    images = images_line(s.trials)
    if images is not None:
        parts.append(f"<p>{html.escape(images)}</p>")
    headings = {"objective": "Objective", "pareto": "Pareto front",
                "intermediate": "Intermediate values", "parallel": "Parameters",
                "importances": "Parameter importances", "timeline": "GPUs over time",
                "costs": "Cost", "lineages": "Lineages"}
    for name, fig in figs.items():
        parts.append(f"<h2>{headings[name]}</h2>")
        if name == "costs":
            parts += [_cost_table(figures.cost_figures(s)),
                      _savings_table(figures.savings(s, study))]
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs=False,
                                 div_id=f"fig-{name}", config={"displaylogo": False}))
        if name == "lineages" and lines is not None:
            parts += [_copies_table(lines), _flagged_table(lineage_figures.flagged(s)),
                      "<h2>Fidelity of the rungs</h2>",
                      _fidelity_table(lineage_figures.fidelity(s, study))]
    parts += ["<h2>Failures by reason</h2>", _failure_table(figures.failures(s)),
              "</body></html>"]
    return "\n".join(parts)


def images_line(trials: Any) -> str | None:
    """The images the trials ran in (`trainer.container`: the `image` column), with how many
    trials each: `image sha256:...: 12 trials`; None when no trial ran in one."""
    if trials.empty or "image" not in trials.columns:
        return None
    counts = trials["image"].dropna().value_counts()
    if counts.empty:
        return None
    return "image " + "; ".join(f"{ident}: {n} trial{'s' if n != 1 else ''}"
                                for ident, n in sorted(counts.items()))


def _cost_table(numbers: dict[str, Any]) -> str:
    if not numbers:
        return '<p class="note">no trial yet</p>'

    def hours(key: str) -> str:
        return f"{numbers[key]:.3g}"

    rows = [("device-hours in all", hours("device_hours")),
            ("of which FAIL trials", hours("fail_device_hours")),
            ("of which PRUNED trials", hours("pruned_device_hours")),
            ("energy (kWh)", "not measured" if numbers["energy_kwh"] is None
             else f"{numbers['energy_kwh']:.3g}")]
    if "best_trial" in numbers:
        rows.append((f"device-hours until the best trial ({numbers['best_trial']}: "
                     f"{numbers['best_value']:.4g}) ended", hours("device_hours_to_best")))
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td class=num>{v}</td></tr>"
                    for k, v in rows)
    return f"<table>{cells}</table>"


def _savings_table(numbers: dict[str, Any]) -> str:
    if not numbers:
        return ('<p class="note">no saving to show yet: no step reported (or, without a '
                "scheduler, no trial completed)</p>")
    rows = [("device-hours spent", f"{numbers['device_hours']:.3g}"),
            ("steps trained (the step numbers reported)", f"{numbers['steps']}"),
            ("attempts stopped before the end (PRUNED)", f"{numbers['stops']}"),
            ("of which paused (to be continued if promoted, or a PBT donor for its copy)",
             f"{numbers['pauses']}"),
            (f"training all {numbers['configurations']} configurations to step "
             f"{numbers['max_steps']} (at the mean cost of a step trained)",
             f"{numbers['full_device_hours']:.3g}"),
            ("device-hours saved", f"{numbers['saved_device_hours']:.3g}")]
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td class=num>{v}</td></tr>"
                    for k, v in rows)
    return f'<table id="savings">{cells}</table>'


def _copies_table(lines: Any) -> str:
    copied = lines[lines["donor"].notna()]
    if copied.empty:
        return '<p class="note">no lineage was copied from another (no PBT exploit)</p>'
    head = "<tr><th>lineage</th><th>copied from</th><th>at step</th><th>params</th></tr>"
    body = "".join(f"<tr><td class=num>{r.origin}</td><td class=num>{r.donor}</td>"
                   f"<td class=num>{r.copied_at}</td><td>{html.escape(r.params)}</td></tr>"
                   for r in copied.itertuples())
    return f'<table id="copies">{head}{body}</table>'


def _flagged_table(frame: Any) -> str:
    if frame.empty:
        return ('<p class="note">every resume and explore checked: none started over or ran '
                "with its donor's params</p>")
    head = "<tr><th>trial</th><th>lineage</th><th>flagged</th></tr>"
    body = "".join(f"<tr><td class=num>{r.number}</td><td class=num>{r.lineage}</td>"
                   f"<td>{html.escape(r.why)}</td></tr>" for r in frame.itertuples())
    return f'<table id="flagged">{head}{body}</table>'


def _fidelity_table(frame: Any) -> str:
    if frame.empty:
        return '<p class="note">no rung</p>'
    head = ("<tr><th>rung (step)</th><th>lineages that completed, with a value there</th>"
            "<th>rank correlation with their final values</th></tr>")
    body = "".join(
        f"<tr><td class=num>{r.step}</td><td class=num>{r.lineages}</td><td class=num>"
        f"{'too few' if r.rho != r.rho else f'{r.rho:.2f}'}</td></tr>"
        for r in frame.itertuples())
    return (f'<table id="fidelity">{head}{body}</table><p class="note">Spearman\'s rho: 1, '
            "the rung ranked the lineages as they ended; near 0, it did not predict the end "
            "(a rung decided on it may pause the wrong ones)</p>")


def _failure_table(frame: Any) -> str:
    if frame.empty:
        return '<p class="note">no FAIL trial</p>'
    head = "<tr><th>reason</th><th>trials</th><th>numbers</th></tr>"
    body = "".join(
        f"<tr><td>{html.escape(r.reason)}</td><td class=num>{r.count}</td>"
        f"<td>{html.escape(r.trials)}</td></tr>" for r in frame.itertuples())
    return f'<table id="failures">{head}{body}</table>'


def write(s: Summary, study: Any, path: Path | None = None) -> Path:
    """Write the report (default `<output_dir>/report.html`) atomically, never over a file
    sweep did not write, nor the study's own files (`userfiles.replace_output`); its path."""
    path = path or s.spec.output_dir / REPORT_NAME
    text = render(s, study)
    path.parent.mkdir(parents=True, exist_ok=True)
    userfiles.replace_output(path, text, own_files(s.spec))
    return path


def report_file(study_file: str | Path, out: Path | None = None,
                storage_url: str | None = None) -> Path:
    """`sweep report STUDY.yaml [-o FILE]`: read the study, write its report, return where."""
    s, study = load(study_file, storage_url)
    return write(s, study, out)
