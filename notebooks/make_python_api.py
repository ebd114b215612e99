"""Regenerate notebooks/python_api.ipynb from the cells below (keeps the notebook reviewable)."""

from __future__ import annotations

from pathlib import Path

import nbformat as nbf

CELLS = [
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


def build() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for kind, text in CELLS:
        nb.cells.append(nbf.v4.new_markdown_cell(text) if kind == "md"
                        else nbf.v4.new_code_cell(text))
    return nb


if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "python_api.ipynb"
    nbf.write(build(), out)
    print(out)
