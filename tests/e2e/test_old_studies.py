"""Studies written by older sweeps still read, report and resume with today's code.

Each folder of tests/examples/old_studies/ holds a study made by the commit it is named for
(`make.sh` made it; its README says how): trials 0-3 COMPLETE, FAIL, PRUNED, COMPLETE, trials
4 and 5 told FAIL "interrupted" by a SIGTERM of the driver mid-trial, and one trial left
RUNNING by a kill -9 of the next driver. Each test works on a copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from conftest import EXAMPLES, run_cli

from sweep._core import names

OLD = EXAMPLES / "old_studies"
N_TRIALS = 6

# The summary columns docs/how-to/read-results.md names, in its order (params_* after value).
DOCUMENTED = ["number", "state", "value", "params_x", "params_fate", "gpu", "gpus",
              "datetime_start", "datetime_complete", "duration_s", "exit_code", "fail_reason",
              "gpu_util_mean", "gpu_util_max", "gpu_mem_peak_mb", "energy_j", "attempt",
              "retry_of", "code_version", "image", "host", "rerun_of", "continues",
              "paused_at", "exploit_of", "resumed_at", "steps_repeated", "lineage",
              "lineage_attempts", "lineage_device_s"]

# (number, state, value, x, fate, exit_code, fail_reason, attempt, continues, lineage) of the
# trials both old sweeps made the same way
FIRST_RUN = [
    (0, "COMPLETE", (0.1 - 0.3) ** 2, 0.1, "complete", 0, None, 0, None, 0),
    (1, "FAIL", None, 0.2, "fail", 1, "exit code 1: failing on purpose", 0, None, 1),
    (2, "PRUNED", 10.0, 0.3, "prune", 0, None, 0, None, 2),
    (3, "COMPLETE", (0.4 - 0.3) ** 2, 0.4, "complete", 0, None, 0, None, 3),
    (4, "FAIL", None, 0.5, "long", 0, "interrupted", 0, None, 4),
    (5, "FAIL", None, 0.6, "long", 0, "interrupted", 0, None, 5),
]
F1_X6, F1_X7 = 0.9888908017773853, 0.6682236863919441  # what f1ce194's sampler drew
STORED: dict[str, list[tuple[Any, ...]]] = {
    # SIGTERM queued continuations 6 (of 4) and 7 (of 5); the second driver (one GPU) ran 6
    # and was killed: 6 RUNNING, 7 WAITING
    "3b5d082": [
        *FIRST_RUN,
        (6, "RUNNING", None, 0.5, "long", None, None, 1, 4, 4),
        (7, "WAITING", None, None, None, None, None, 1, 5, 5),
    ],
    # f1ce194 queued no continuations: the second driver drew new trials, 7 is left RUNNING
    "f1ce194": [
        *FIRST_RUN,
        (6, "FAIL", None, F1_X6, "fail", 1, "exit code 1: failing on purpose", 0, None, 6),
        (7, "RUNNING", None, F1_X7, "long", None, None, None, None, 7),
    ],
}
# (number, state, attempt, continues, lineage) of the trials today's `sweep run` adds, and each
# lineage's checkpoints/<lineage>/starts.log after it (`<trial> <first step>`): a continuation
# starts at the step its checkpoint reached
RESUMED: dict[str, tuple[list[tuple[Any, ...]], dict[int, list[str]]]] = {
    "3b5d082": (
        [(7, "COMPLETE", 1, 5, 5),    # the continuation queued by the SIGTERM
         (8, "COMPLETE", 2, 6, 4),    # the reclaimed 6's continuation
         (9, "COMPLETE", 0, None, 9)],
        {4: ["4 0", "6 7", "8 12"], 5: ["5 0", "7 6"]},
    ),
    "f1ce194": (
        [(8, "COMPLETE", 1, 7, 7),    # 7 reclaimed: f1ce194 gave no checkpoint folder
         (9, "COMPLETE", 0, None, 9),
         (10, "COMPLETE", 0, None, 10)],
        {7: ["8 0"]},
    ),
}
RECLAIMED = {"3b5d082": 6, "f1ce194": 7}
# the stored trials' gpu, retry_of and lineage_attempts columns
PLACES = {
    "3b5d082": ([0, 1, 0, 1, 1, 0, 0, None], [None] * 6 + [4, 5], [1, 1, 1, 1, 2, 2, 2, 2]),
    "f1ce194": ([0, 1, 0, 1, 1, 0, 0, 0], [None] * 8, [1] * 8),
}


def copy_study(commit: str, tmp_path: Path) -> Path:
    """A copy of the stored study made by `commit`: its study.yaml. The study.json that marks
    its output folder names the storage where make.sh made it (a temporary folder): it is
    pointed at the copy's, as it would be had the study been made there."""
    dest = tmp_path / commit
    shutil.copytree(OLD / commit, dest)
    marker = dest / "old" / "study.json"
    if marker.exists():
        data = json.loads(marker.read_text())
        data["storage"] = f"sqlite:///{dest / 'old.db'}"
        marker.write_text(json.dumps(data))
    return dest / "study.yaml"


def summary_rows(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                 ) -> pd.DataFrame:
    csv = tmp_path / "summary.csv"
    assert run_cli("summary", str(study), "--csv", str(csv)) == 0, capsys.readouterr().err
    return pd.read_csv(csv)


def cell(value: Any) -> Any:
    """A CSV cell as the tuples above write it: None for empty, ints for whole numbers."""
    if pd.isna(value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def stored_rows(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    cols = ["number", "state", "value", "params_x", "params_fate", "exit_code", "fail_reason",
            "attempt", "continues", "lineage"]
    return [tuple(cell(v) if c not in ("value", "params_x") or pd.isna(v) else v
                  for c, v in zip(cols, row, strict=True))
            for row in df[cols].itertuples(index=False)]


def reclaim_reasons(old_pid: int) -> set[str]:
    """What reclaiming the killed driver's trial says: on the host that made the study, its
    pid is found dead; elsewhere its heartbeat is stale."""
    return {f"driver died (pid {old_pid} on vm)", "driver on vm died (no heartbeat)"}


@pytest.mark.parametrize("commit", sorted(STORED))
def test_summary_of_an_old_study_has_the_documented_columns_and_its_trials(
        commit, tmp_path, capsys):
    study = copy_study(commit, tmp_path)
    df = summary_rows(study, tmp_path, capsys)
    header = list(df.columns)
    assert [c for c in header if c in DOCUMENTED] == DOCUMENTED
    assert stored_rows(df) == STORED[commit]
    assert list(df["host"].iloc[:7]) == ["vm"] * 7
    gpus, retry_of, attempts = PLACES[commit]
    assert [cell(v) for v in df["gpu"]] == gpus
    assert [cell(v) for v in df["retry_of"]] == retry_of
    assert [cell(v) for v in df["lineage_attempts"]] == attempts
    stored = optuna.load_study(study_name="old", storage=f"sqlite:///{study.parent / 'old.db'}")
    durations = [(t.datetime_complete - t.datetime_start).total_seconds()
                 if t.datetime_complete and t.datetime_start else None for t in stored.trials]
    assert [cell(v) for v in df["duration_s"]] == durations
    # trial numbers and attempts are written as integers, though some rows have none (an
    # f1ce194 trial left RUNNING has no attempt yet)
    raw = pd.read_csv(tmp_path / "summary.csv", dtype=str)
    for col in ("attempt", "retry_of", "continues", "lineage"):
        assert not raw[col].fillna("").str.endswith(".0").any(), (col, list(raw[col]))


COUNTS = {"3b5d082": "2 COMPLETE, 3 FAIL, 1 PRUNED, 1 RUNNING, 1 WAITING",
          "f1ce194": "2 COMPLETE, 4 FAIL, 1 PRUNED, 1 RUNNING"}


@pytest.mark.parametrize("commit", sorted(STORED))
def test_status_and_logs_of_an_old_study(commit, tmp_path, capsys):
    study = copy_study(commit, tmp_path)
    assert run_cli("status", str(study)) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.splitlines()[0] == COUNTS[commit]
    running = RECLAIMED[commit]
    assert f"trial {running} RUNNING on GPU 0 (vm)" in out
    assert run_cli("logs", str(study), "1", "--stderr") == 0, capsys.readouterr().err
    assert capsys.readouterr().out == "failing on purpose\n"


@pytest.mark.slow
@pytest.mark.parametrize("commit", sorted(STORED))
def test_report_of_an_old_study_builds(commit, tmp_path, capsys):
    study = copy_study(commit, tmp_path)
    out = tmp_path / "report.html"
    assert run_cli("report", str(study), "-o", str(out)) == 0, capsys.readouterr().err
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "<title>old: sweep report</title>" in html


@pytest.mark.slow
@pytest.mark.parametrize("commit", sorted(STORED))
def test_an_old_study_resumes_its_interrupted_and_reclaimed_trials_to_its_budget(
        commit, tmp_path, fake_gpus, capsys):
    study = copy_study(commit, tmp_path)
    storage = f"sqlite:///{study.parent / 'old.db'}"
    reclaimed = RECLAIMED[commit]
    before = optuna.load_study(study_name="old", storage=storage).trials[reclaimed]
    old_pid = before.user_attrs[names.OWNER]["pid"]
    checkpoints = study.parent / "old" / "checkpoints"
    reached = {int(f.parent.name): json.loads(f.read_text())["next"]
               for f in checkpoints.glob("*/state.json")}

    assert run_cli("run", str(study)) == 0, capsys.readouterr().err

    trials = optuna.load_study(study_name="old", storage=storage).trials
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == N_TRIALS
    assert "RUNNING" not in states and "WAITING" not in states
    gone = trials[reclaimed]
    assert gone.state.name == "FAIL"
    assert gone.user_attrs[names.FAIL_REASON] in reclaim_reasons(old_pid)
    df = summary_rows(study, tmp_path, capsys)
    added, starts = RESUMED[commit]
    first_new = added[0][0]
    new = df[df["number"] >= first_new]
    assert [tuple(cell(v) for v in row) for row in
            new[["number", "state", "attempt", "continues", "lineage"]].itertuples(
                index=False)] == added
    for lineage, lines in starts.items():
        log = checkpoints / str(lineage) / "starts.log"
        assert log.read_text().splitlines() == lines
        if lineage in reached:  # the last attempt started where the stored checkpoint was
            assert lines[-1].endswith(f" {reached[lineage]}") and reached[lineage] > 0
    assert run_cli("run", str(study)) == 0  # the budget is spent: nothing more runs
    assert len(optuna.load_study(study_name="old", storage=storage).trials) == len(trials)
