"""Regenerate the notebooks from the cells below (keeps them reviewable).

analysis.ipynb: a study's summary and plots. python_api.ipynb: sweep.run, status and load.
"""

from __future__ import annotations

from pathlib import Path

import nbformat as nbf

ANALYSIS = [
    ("md", """# Sweep analysis

Loads the study named by the environment variable `SWEEP_STUDY` (a study YAML path; default
`studies/quickstart.yaml`), shows the summary and plots the objective, a time line of trials
per GPU, and GPU utilisation against the objective. Works while the sweep is still running."""),
    ("code", """import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sweep import summary

study_file = Path(os.environ.get("SWEEP_STUDY", "studies/quickstart.yaml"))
if not study_file.exists() and (Path("..") / study_file).exists():
    study_file = Path("..") / study_file  # running from notebooks/
s = summary.load(study_file)
metrics = s.spec.study.objective_metrics
value_cols = ["value"] if "value" in s.trials.columns else [f"values_{m}" for m in metrics]
print(f"{s.spec.study.name}: {len(s.trials)} trials, objective {metrics}")"""),
    ("code", "s.trials"),
    ("code", "s.gpus"),
    ("md", "## Objective against trial number"),
    ("code", """fig, ax = plt.subplots(figsize=(7, 3.5))
t = s.trials
for state, marker in (("COMPLETE", "o"), ("PRUNED", "x"), ("FAIL", "v")):
    part = t[t["state"] == state]
    if state == "COMPLETE" or part[value_cols[0]].notna().any():
        ax.scatter(part["number"], part[value_cols[0]], marker=marker, label=state)
done = t[t["state"] == "COMPLETE"].sort_values("number")
if len(done) and len(value_cols) == 1:
    best = done[value_cols[0]].cummin() if s.spec.study.objective_directions[0] == "minimize" \\
        else done[value_cols[0]].cummax()
    ax.step(done["number"], best, where="post", label="best so far")
ax.set_xlabel("trial")
ax.set_ylabel(metrics[0])
ax.set_title("objective")
ax.legend()
plt.show()"""),
    ("md", "## Trials on a time line per GPU"),
    ("code", """fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * max(1, t["gpu"].nunique())))
colours = {"COMPLETE": "tab:green", "PRUNED": "tab:orange", "FAIL": "tab:red",
           "RUNNING": "tab:blue"}
started = t.dropna(subset=["datetime_start", "gpu"])
if len(started):
    t0 = started["datetime_start"].min()
    end = started["datetime_complete"].fillna(pd.Timestamp.now())
    for (_, row), stop in zip(started.iterrows(), end, strict=True):
        x = (row["datetime_start"] - t0).total_seconds()
        w = (stop - row["datetime_start"]).total_seconds()
        ax.barh(int(row["gpu"]), w, left=x, color=colours.get(row["state"], "grey"),
                edgecolor="black", height=0.6)
        ax.text(x + w / 2, int(row["gpu"]), str(row["number"]), ha="center", va="center",
                fontsize=8)
ax.set_xlabel("seconds since the first trial")
ax.set_ylabel("GPU")
ax.set_yticks(sorted(started["gpu"].astype(int).unique()) if len(started) else [])
ax.set_title("trials per GPU (green complete, orange pruned, red failed)")
plt.show()"""),
    ("md", "## GPU utilisation against the objective"),
    ("code", """fig, ax = plt.subplots(figsize=(5, 3.5))
measured = t.dropna(subset=["gpu_util_mean", value_cols[0]])
ax.scatter(measured["gpu_util_mean"], measured[value_cols[0]])
if measured.empty:
    ax.text(0.5, 0.5, "no utilisation measured\\n(simulated pool or no NVML)",
            ha="center", va="center", transform=ax.transAxes)
ax.set_xlabel("mean GPU utilisation (%)")
ax.set_ylabel(metrics[0])
ax.set_title("utilisation vs objective")
plt.show()"""),
]

PYTHON_API = [
    ("md", """# Running a sweep from Python

`sweep.run` runs the study file in this kernel and returns its `optuna.Study`; keyword
arguments override the file. Interrupting the kernel stops the trials as Ctrl-C does on the
command line (then raises `KeyboardInterrupt`). `sweep.status` and `sweep.load` read the study,
also while another process runs it. The study is `SWEEP_STUDY` (default
`studies/quickstart.yaml`); on a machine without a GPU set `SWEEP_FAKE_GPUS=2` first."""),
    ("code", """import os
from pathlib import Path

import sweep

study_file = Path(os.environ.get("SWEEP_STUDY", "studies/quickstart.yaml"))
if not study_file.exists() and (Path("..") / study_file).exists():
    study_file = Path("..") / study_file  # running from notebooks/
n_trials = int(os.environ.get("SWEEP_N_TRIALS", "8"))
study = sweep.run(study_file, n_trials=n_trials)
print(f"best: trial {study.best_trial.number}, {study.best_value:.4g}")"""),
    ("code", """now = sweep.status(study_file)
now.counts"""),
    ("code", """s = sweep.load(study_file)
s.trials[["number", "state", "value", "duration_s", "gpu"]]"""),
]


def build(cells: list[tuple[str, str]]) -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for kind, text in cells:
        nb.cells.append(nbf.v4.new_markdown_cell(text) if kind == "md"
                        else nbf.v4.new_code_cell(text))
    return nb


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for name, cells in (("analysis", ANALYSIS), ("python_api", PYTHON_API)):
        out = here / f"{name}.ipynb"
        nbf.write(build(cells), out)
        print(out)
