"""Scripts people already have, swept unmodified from the studies in studies/: one that only
prints its metrics, one that writes all_results.json where it is told, one with dash-named
options and store_true / store_false flags; one that saves checkpoint-N folders and continues
after an interruption."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, load_trials, run_cli, spawn_cli, wait_until

from sweep._core import names


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


@pytest.mark.slow
def test_a_script_that_only_prints_its_metrics(copied, fake_gpus):
    for t in swept(copied, "print_metrics.yaml", "print-metrics"):
        out = (copied / "print-metrics" / "trials" / str(t.number) / "stdout.log").read_text()
        last = out.strip().splitlines()[-1]  # "Test set: Average loss: 0.1234, Accuracy: ..."
        assert last.startswith(f"Test set: Average loss: {t.value:.4f}")
        assert t.user_attrs["metric_accuracy"] == float(last.split("(")[1].rstrip("%)"))
        command = (copied / "print-metrics" / "trials" / str(t.number) / "command.sh").read_text()
        assert f"--batch-size {t.params['batch-size']}" in command


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_hf_trainer_style_script_interrupted_mid_training_continues_from_its_checkpoint(
        copied, fake_gpus, capsys):
    """studies/hf_resume.yaml: the script resumes only when told --resume_from_checkpoint;
    after a SIGTERM to the driver, the rerun's continuation is told the newest checkpoint-N
    folder of the trial's checkpoint folder, and trains only the steps left. (The interrupted
    driver is a real process, its rerun this test's own.)"""
    study = copied / "hf_resume.yaml"
    out = copied / "hf-resume"
    driver = spawn_cli("run", str(study))
    assert wait_until(lambda: all((out / "checkpoints" / n / "checkpoint-20").is_dir()
                                  for n in ("0", "1")), 60)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    trials = load_trials(study, "hf-resume")
    assert sum(t.state.name == "COMPLETE" for t in trials) == 4
    for first in (t for t in trials if t.user_attrs.get(names.FAIL_REASON) == "interrupted"):
        then = next(t for t in trials if t.user_attrs.get(names.CONTINUES) == first.number)
        assert then.state.name == "COMPLETE" and then.params == first.params
        ran = [json.loads(line)["step"] for line in
               (out / "trials" / str(first.number) / "stdout.log").read_text().splitlines()]
        log = (out / "trials" / str(then.number) / "stdout.log").read_text()
        saved = max(s for s in ran if s % 10 == 0)  # the newest checkpoint it wrote
        assert (f"Continuing training from checkpoint, will skip to saved global_step {saved}"
                in log)
        command = (out / "trials" / str(then.number) / "command.sh").read_text()
        assert f"--resume_from_checkpoint {out}/checkpoints/{first.number}/checkpoint-{saved}" \
            in command
        results = json.loads((out / "checkpoints" / str(first.number) /
                              "all_results.json").read_text())
        assert results["global_step"] == 60  # one run's steps, not a second run's
        assert results["train_steps_this_run"] == 60 - saved
        assert then.value == results["eval_loss"]
    assert sum(t.user_attrs.get(names.FAIL_REASON) == "interrupted" for t in trials) == 2


@pytest.mark.slow
def test_a_hf_trainer_style_script_is_paused_and_promoted_through_last_checkpoint(
        copied, fake_gpus, capsys):
    """studies/hf_asha.yaml: the best configurations come first, so they are paused at rung
    0 (too few there yet) and promoted once worse ones have come; each promoted attempt is
    told --resume_from_checkpoint with its lineage's newest checkpoint-N and trains on from
    there; the best reaches max_steps."""
    study = copied / "hf_asha.yaml"
    text = study.read_text().replace(
        "  sampler: {type: tpe, seed: 0}\n",
        "  sampler: {type: tpe, seed: 0}\n  enqueue: [" + ", ".join(
            f"{{learning_rate: {lr}}}" for lr in
            ("1.0e-4", "1.2e-4", "1.0e-2", "1.0e-6", "5.0e-3", "2.0e-6", "3.0e-3", "5.0e-6",
             "2.0e-3")) + "]\n")
    study.write_text(text)
    out = copied / "hf-asha"
    code = run_cli("run", str(study))
    err = capsys.readouterr().err
    assert code == 0, err
    trials = load_trials(study, "hf-asha")
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    promoted = [t for t in trials if names.PAUSED_AT in
                trials[t.user_attrs.get(names.CONTINUES, t.number)].user_attrs
                and names.CONTINUES in t.user_attrs]
    assert promoted, err
    for then in promoted:
        log = (out / "trials" / str(then.number) / "stdout.log").read_text()
        saved = int(log.split("will skip to saved global_step ")[1].split()[0])
        origin = then.user_attrs[names.RETRY_OF]
        command = (out / "trials" / str(then.number) / "command.sh").read_text()
        assert f"--resume_from_checkpoint {out}/checkpoints/{origin}/checkpoint-{saved}" \
            in command
        first_step = json.loads(log.splitlines()[1])["step"]
        assert first_step == saved + 1
        assert names.STEPS_REPEATED not in then.user_attrs
    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    results = json.loads((out / "checkpoints" / str(best.user_attrs.get(
        names.RETRY_OF, best.number)) / "all_results.json").read_text())
    assert results["global_step"] == 45 and best.value == results["eval_loss"]
    assert sum(t.state.name == "COMPLETE" for t in trials) < 9  # not all trained to the end
