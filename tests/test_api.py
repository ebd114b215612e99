"""sweep.run / sweep.status / sweep.load from Python and from a notebook."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from conftest import ROOT, load_trials, processes_mentioning, wait_until

import sweep
from sweep._core import names


def test_run_returns_the_study_and_status_and_load_read_it(write_study, fake_gpus):
    study_file = write_study(study={"n_trials": 1})
    study = sweep.run(study_file, n_trials=2, gpus=[1])
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    assert {t.user_attrs[names.GPU] for t in study.trials} == {1}
    now = sweep.status(study_file)
    assert now.counts == {"COMPLETE": 2} and now.running.empty
    assert list(sweep.load(study_file).trials["number"]) == [0, 1]


def test_ctrl_c_in_python_stops_the_trials_then_raises_keyboard_interrupt(write_study,
                                                                           fake_gpus, tmp_path):
    study_file = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "30"]})
    started = tmp_path / "probe" / "trials"

    def interrupt() -> None:
        wait_until(lambda: len(list(started.glob("*/probe_start.json"))) == 2, 30)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        sweep.run(study_file)
    trials = load_trials(study_file)
    assert [t.user_attrs[names.FAIL_REASON] for t in trials[:2]] == ["interrupted"] * 2
    # and their continuations are queued for the next run
    assert [(t.state.name, t.user_attrs[names.RETRY_OF]) for t in trials[2:]] in (
        [("WAITING", 0), ("WAITING", 1)], [("WAITING", 1), ("WAITING", 0)])
    assert processes_mentioning(str(tmp_path)) == []


def test_the_python_api_notebook_runs_a_sweep(write_study, fake_gpus, monkeypatch):
    import nbclient
    import nbformat

    study_file = write_study(study={"n_trials": 1})
    monkeypatch.setenv("SWEEP_STUDY", str(study_file))
    monkeypatch.setenv("SWEEP_N_TRIALS", "2")
    notebook = ROOT / "notebooks" / "python_api.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    assert [t.state.name for t in load_trials(study_file)] == ["COMPLETE"] * 2
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "best: trial" in printed
