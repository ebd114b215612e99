"""Regenerate the notebooks from the cells below (keeps them reviewable).

analysis.ipynb: a study's summary and plots. python_api.ipynb: sweep.run, status and load.
"""

from __future__ import annotations

from pathlib import Path

import nbformat as nbf

ANALYSIS = [
    ("md", """# Sweep analysis

Loads the study named by the environment variable `SWEEP_STUDY` (a study YAML path; default
`studies/quickstart.yaml`), shows the summary and the figures of `sweep report` (the same
functions, from `sweep.analysis.figures`): the objective against time and device-hours, intermediate
values, parameters, a time line of trials per GPU with utilisation and memory, what the trials
cost, and the failures by reason. Works while the sweep is still running."""),
    ("code", """import os
from pathlib import Path

from sweep.analysis import figures, report

study_file = Path(os.environ.get("SWEEP_STUDY", "studies/quickstart.yaml"))
if not study_file.exists() and (Path("..") / study_file).exists():
    study_file = Path("..") / study_file  # running from notebooks/
s, study = report.load(study_file)  # what `sweep summary` reads, and the optuna.Study
metrics = s.spec.study.objective_metrics
print(f"{s.spec.study.name}: {len(s.trials)} trials, objective {metrics}")"""),
    ("code", "s.trials"),
    ("code", "s.gpus"),
    ("md", "## Objective against wall time and device-hours"),
    ("code", "figures.objective(s).show()"),
    ("md", "## Intermediate values (pruned trials marked x), or the Pareto front"),
    ("code", """(figures.pareto(s, study) if len(metrics) > 1
 else figures.intermediate(s, study)).show()"""),
    ("md", "## Parameters"),
    ("code", """figures.parallel(s, study).show()
figures.importances(s, study).show()"""),
    ("md", "## Trials on a time line per GPU, with utilisation and memory"),
    ("code", "figures.timeline(s).show()"),
    ("md", "## Cost, and failures by reason"),
    ("code", """print(figures.cost_figures(s))
figures.costs(s).show()
figures.failures(s)"""),
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
