"""Scripts people already have, swept unmodified from the studies in studies/: one that only
prints its metrics, one that writes all_results.json where it is told, one with dash-named
options and store_true / store_false flags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, load_trials, run_cli

EXAMPLES = ROOT / "tests" / "examples"


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """studies/ and tests/examples/ copied to tmp_path, so nothing is written to the repo."""
    shutil.copytree(ROOT / "studies", tmp_path / "studies",
                    ignore=shutil.ignore_patterns("*.db", "*-*", "hf_out"))
    shutil.copytree(EXAMPLES, tmp_path / "tests" / "examples")
    return tmp_path / "studies"


def swept(copied: Path, file: str, name: str) -> list:
    """Run studies/<file> to its end: its trials, all of which must be COMPLETE."""
    study = copied / file
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study, name)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    return trials


def test_the_example_scripts_know_nothing_of_sweep():
    for script in EXAMPLES.glob("*.py"):
        code = script.read_text()
        assert "import sweep" not in code and "from sweep" not in code, script
        assert "SWEEP_" not in code, script


def test_a_script_that_only_prints_its_metrics(copied, fake_gpus):
    for t in swept(copied, "print_metrics.yaml", "print-metrics"):
        out = (copied / "print-metrics" / "trials" / str(t.number) / "stdout.log").read_text()
        last = out.strip().splitlines()[-1]  # "Test set: Average loss: 0.1234, Accuracy: ..."
        assert last.startswith(f"Test set: Average loss: {t.value:.4f}")
        assert t.user_attrs["metric_accuracy"] == float(last.split("(")[1].rstrip("%)"))
        command = (copied / "print-metrics" / "trials" / str(t.number) / "command.sh").read_text()
        assert f"--batch-size {t.params['batch-size']}" in command


def test_a_script_that_writes_all_results_json_into_its_output_dir(copied, fake_gpus):
    for t in swept(copied, "hf_style.yaml", "hf-style"):
        out = copied / "hf-style" / "trials" / str(t.number) / "hf_out" / "all_results.json"
        written = json.loads(out.read_text())  # where the script put it, per trial
        assert t.value == written["eval_loss"]
        assert t.user_attrs["metric_eval_accuracy"] == written["eval_accuracy"]


def test_a_script_with_dash_names_and_store_true_flags(copied, fake_gpus):
    trials = swept(copied, "flags.yaml", "flags")
    for t in trials:
        out = (copied / "flags" / "trials" / str(t.number) / "stdout.log").read_text()
        assert f"amp={t.params['use_amp']}" in out and "shuffle=True" in out
        assert f"batch={t.params['batch_size']}" in out
    assert {t.params["use_amp"] for t in trials} == {True, False}
