"""The summary of a finished sweep, checked against storage; the analysis notebook runs on it."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest
from conftest import ROOT, load_trials, run_cli, study_dict

from sweep._core import names
from sweep.analysis import summary

# the tests of `finished_study` run on one worker: the module's sweep runs once for them all,
# not once on each worker that takes one of them
ON_THE_FINISHED_STUDY = pytest.mark.xdist_group("summary-finished-study")


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A small sweep on 2 simulated GPUs with one failed and one pruned trial."""
    tmp = tmp_path_factory.mktemp("summary")
    marker = tmp / "failed-once"
    data = study_dict(
        study={"n_trials": 5, "pruner": {"type": "threshold", "upper": 0.3},
               "enqueue": [{"x": 0.3}, {"x": 0.35}, {"x": 0.99}]},
        trainer={"args": ["--mode", "report", "--steps", "3", "--sleep", "0.15",
                          "--fail_first", str(marker)]},
    )
    import yaml

    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # set here, not by the tests' own fixtures (they come after a module's): the devices
    # leased in a lock folder of its own, not the machine's (other workers' sweeps)
    env = {"SWEEP_FAKE_GPUS": "2", "SWEEP_LOCK_DIR": str(tmp / "locks")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert run_cli("run", str(path)) == 0
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return path


@ON_THE_FINISHED_STUDY
def test_summary_csv_matches_storage_row_by_row(finished_study, capsys):
    assert run_cli("summary", str(finished_study)) == 0
    out = capsys.readouterr().out
    assert "best 5" in out and "GPUs" in out
    csv = pd.read_csv(finished_study.parent / "probe" / "summary.csv")
    trials = load_trials(finished_study)
    assert list(csv["number"]) == [t.number for t in trials]
    required = ["number", "state", "value", "params_x", "gpu", "datetime_start", "duration_s",
                "gpu_util_mean", "gpu_util_max", "gpu_mem_peak_mb", "exit_code", "fail_reason"]
    assert set(required) <= set(csv.columns)
    states = set()
    for t, (_, row) in zip(trials, csv.iterrows(), strict=True):
        states.add(t.state.name)
        assert row["state"] == t.state.name
        assert row["gpu"] == t.user_attrs[names.GPU]
        assert row["params_x"] == pytest.approx(t.params["x"])
        if t.value is None:
            assert math.isnan(row["value"])
        else:
            assert row["value"] == pytest.approx(t.value)
        assert row["duration_s"] == pytest.approx(t.duration.total_seconds(), abs=1e-3)
        assert pd.Timestamp(row["datetime_start"]) == pd.Timestamp(t.datetime_start)
        reason = t.user_attrs.get(names.FAIL_REASON)
        assert (row["fail_reason"] if isinstance(row["fail_reason"], str) else None) == reason
        assert math.isnan(row["gpu_util_mean"])  # simulated pool: never invented
    assert states == {"COMPLETE", "FAIL", "PRUNED"}


@ON_THE_FINISHED_STUDY
def test_python_api_returns_trials_gpus_and_samples(finished_study):
    s = summary.load(finished_study)
    assert len(s.trials) == len(load_trials(finished_study))
    assert list(s.gpus["gpu"]) == [0, 1]
    assert (s.gpus["busy_fraction"] > 0).all() and (s.gpus["busy_fraction"] <= 1).all()
    assert set(s.samples["gpu"]) == {0, 1}
    held = s.samples[s.samples["trials"] != ""]
    assert len(held) > 0


def test_summary_of_a_study_never_run_is_one_line(write_study, capsys):
    assert run_cli("summary", str(write_study())) == 2
    assert "run the study first" in capsys.readouterr().err


@ON_THE_FINISHED_STUDY
def test_the_analysis_notebook_runs_against_the_study(finished_study, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("SWEEP_STUDY", str(finished_study))
    notebook = ROOT / "notebooks" / "analysis.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3",
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    client.execute()
    plots = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 6  # sweep.analysis.figures' plotly figures, as `sweep report` draws them
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []


def test_many_result_keys_leave_the_terminal_table_readable(write_study):
    """HF's Trainer writes 13 result keys: the table shows 3; the rest are named under it."""
    from rich.console import Console

    from sweep.spec import config

    spec = config.load(write_study(), runnable=False)
    keys = [f"eval_{k}" for k in "abcdefghijklm"]
    trials = pd.DataFrame([{"number": 0, "state": "COMPLETE", "value": 0.5, "params_x": 0.1,
                            "gpu": 0, "gpus": None, "duration_s": 2.0, "gpu_util_mean": None,
                            "gpu_mem_peak_mb": None, **{f"metric_{k}": 1.0 for k in keys}}])
    console = Console(record=True, width=120)
    console.print(summary.render(summary.Summary(spec, trials, pd.DataFrame(), pd.DataFrame())))
    text = console.export_text()
    assert "eval_a" in text and "eval_c" in text
    assert "10 more result keys in the CSV: " + ", ".join(keys[3:]) in text
    assert max(len(line) for line in text.splitlines()) <= 120
    table = text.split("10 more result keys")[0]
    assert "eval_d" not in table


def test_numbers_never_wrap_in_an_80_column_terminal(write_study):
    """Issue 32: at 80 columns `sweep summary` split `1.785` into `1.78` / `5`. A number keeps
    its line (a header may fold), and the table fits the terminal."""
    from rich.console import Console

    from sweep.spec import config

    spec = config.load(write_study(), runnable=False)
    values = [1.785123, 0.00012345, 123456.7, 42.0]
    trials = pd.DataFrame([{
        "number": i, "state": "COMPLETE", "value": v, "params_learning_rate": 1e-4 * (i + 1),
        "params_weight_decay": 0.0123, "params_warmup_ratio": 0.0625, "params_batch": 32,
        "gpu": i % 2, "gpus": None, "duration_s": 1234.5678, "gpu_util_mean": 87.65,
        "gpu_mem_peak_mb": 40123.4, "metric_eval_accuracy": 0.9123,
        "metric_eval_runtime": 12.345, "metric_eval_samples_per_second": 345.678}
        for i, v in enumerate(values)])
    console = Console(record=True, width=80)
    console.print(summary.render(summary.Summary(spec, trials, pd.DataFrame(), pd.DataFrame())))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == 4
    whole = {"0", "1", "2", "3", "32", "1.785", "0.0001234", "1.235e+05", "42", "0.0001",
             "0.0002", "0.0003", "0.0004", "0.0123", "0.0625", "0.9123", "12.35", "345.7"}
    cells = {c.strip() for line in rows for c in line.strip("│").split("│")}
    assert cells <= whole, cells - whole  # each number whole, on its row
    assert {"1.785", "0.0001234", "1.235e+05", "0.9123"} <= cells
    assert ("6 more columns in a wider terminal and in the CSV: metric_eval_runtime, "
            "metric_eval_samples_per_second, gpu, duration_s, gpu_util_mean, gpu_mem_peak_mb"
            ) in " ".join(text.split())


LONG_PARAMS = {  # run_clm's, as a study of it names them
    "learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    "per_device_train_batch_size": {"type": "int", "low": 4, "high": 32},
    "weight_decay": {"type": "float", "low": 0.0, "high": 0.1},
    "warmup_ratio": {"type": "float", "low": 0.0, "high": 0.2},
    "lr_scheduler_type": {"type": "categorical", "choices": ["linear", "cosine"]}}
IMAGES = ["sha256:9f0c1d2e3b4a" + "0" * 52, "sha256:51ff00aa11bb" + "1" * 52]


def clm_study(write_study, tmp_path, n=6):
    """A stored study of run_clm's params in containers of two images, with three more
    result keys (made with create_trial, not run)."""
    import optuna

    from sweep.spec import config, searchspace

    study = write_study(study_dict(params=LONG_PARAMS, trainer={"container": {"image": "t:1"}}))
    spec = config.load(study, runnable=False)
    stored = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path}/probe.db")
    for i in range(n):
        stored.add_trial(optuna.trial.create_trial(
            params={"learning_rate": 1.234e-4 * (i + 1), "per_device_train_batch_size": 8 + i,
                    "weight_decay": 0.01 * i, "warmup_ratio": 0.05,
                    "lr_scheduler_type": "cosine"},
            distributions=searchspace.distributions(spec.searched), value=3.2 - 0.1 * i,
            user_attrs={names.GPU: i % 2, names.IMAGE: IMAGES[i % 2], names.GPU_UTIL_MEAN: 88.2,
                        names.GPU_MEM_PEAK_MB: 21034.5, "metric_eval_accuracy": 0.41 + i / 100,
                        "metric_perplexity": 24.5 - i, "metric_train_runtime": 123.4}))
    return study


def summary_at(study, columns, monkeypatch, capsys):
    """`sweep summary` in a terminal `columns` wide (COLUMNS, as a shell sets it for a
    command whose output is not a terminal), run in this process: its lines."""
    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    assert run_cli("summary", str(study)) == 0
    return capsys.readouterr().out.splitlines()


def test_at_80_columns_headers_fold_between_whole_words_in_at_most_three_lines(
        write_study, tmp_path, monkeypatch, capsys):
    """Issue 38: run_clm's params split their headers one letter per line (19 lines high)."""
    study = clm_study(write_study, tmp_path)
    lines = summary_at(study, 80, monkeypatch, capsys)
    assert max(len(line) for line in lines) <= 80
    top = [line.strip() for line in lines].index("best 5") + 1
    bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("└"))
    table = lines[top:bottom + 1]
    header = table[1:table.index(next(line for line in table if line.startswith("┡")))]
    rows = [line for line in table if line.startswith("│")]
    assert len(rows) == 5 and 1 <= len(header) <= 3
    assert len(table) == len(rows) + len(header) + 3  # borders: top, under the header, bottom
    columns = zip(*(line.strip("┃").split("┃") for line in header), strict=True)
    pieces = [[cell.strip() for cell in column if cell.strip()] for column in columns]
    names = ["number", "value", *LONG_PARAMS, "metric_eval_accuracy", "metric_perplexity",
             "metric_train_runtime", "image", "gpu", "duration_s", "gpu_util_mean",
             "gpu_mem_peak_mb"]
    shown = ["".join(p) for p in pieces]
    assert shown == names[:len(shown)] and len(shown) >= 7  # number, value and the params
    assert all(piece.endswith("_") for p in pieces for piece in p[:-1])  # words whole
    assert "per_device_" in pieces[3] and "train_batch_" in pieces[3]
    rest = " ".join(" ".join(lines[bottom + 1:]).split())
    assert f"more columns in a wider terminal and in the CSV: {', '.join(names[len(shown):])}" \
        in rest


def test_the_terminal_summary_has_the_image_column_of_a_study_run_in_containers(
        write_study, tmp_path, monkeypatch, capsys):
    """Each trial's image as `podman images` shows an ID (12 hex digits), never folded;
    summary.csv keeps the whole ID."""
    import csv

    study = clm_study(write_study, tmp_path)
    lines = summary_at(study, 240, monkeypatch, capsys)
    header = [line for line in lines if line.startswith("┃")]
    assert "image" in {cell.strip() for line in header for cell in line.split("┃")}
    rows = [line for line in lines if line.startswith("│") and "cosine" in line]
    assert len(rows) == 5
    assert [next(c.strip() for c in row.split("│") if c.strip() in ("9f0c1d2e3b4a",
                                                                     "51ff00aa11bb"))
            for row in rows] == ["51ff00aa11bb", "9f0c1d2e3b4a"] * 2 + ["51ff00aa11bb"]
    with open(tmp_path / "probe" / "summary.csv") as f:
        assert [row["image"] for row in csv.DictReader(f)] == IMAGES * 3
