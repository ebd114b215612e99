"""Issue 24: scripts not written for sweep, pruned from what they already write (stdout lines,
TensorBoard scalars), a diverged last value that fails the trial, a result read from stderr.

Each runs the real driver on a tiny study (launcher: python, one fake device, so the trials
run one after another and the median pruner has two finished trials to compare with)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, load_trials, run_cli

from sweep._core import names

NUMBER = r"[-+.0-9eE]+|nan|inf"  # the pattern docs/how-to/prune.md gives for a number
PRUNER = {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 0}


def pruned_study(write_study: Any, script: str, report: dict[str, Any], result: dict[str, Any],
                 args: list[str], enqueue: list[dict[str, Any]], params: dict[str, Any],
                 **study: Any) -> Path:
    return write_study(
        study={"metric": "loss", "n_trials": len(enqueue), "enqueue": enqueue,
               "pruner": PRUNER, **study},  # `study` may replace the pruner
        trainer={"script": str(EXAMPLES / script), "args": args, "result": result,
                 "report": report},
        params=params)


def steps_printed(trial_dir: Path, pattern: str) -> dict[int, float]:
    text = (trial_dir / "stdout.log").read_text()
    return {int(m["step"]): float(m["value"]) for m in re.finditer(pattern, text)}


@pytest.mark.slow
def test_epoch_lines_on_stdout_are_reported_and_a_bad_trial_is_pruned(write_study, fake_gpus):
    fake_gpus(1)
    line = r"epoch (?P<step>\d+) .* valid loss (?P<value>" + NUMBER + ")"
    study = pruned_study(
        write_study, "epoch_log.py", {"stdout": line},
        {"stdout": "best valid loss (?P<loss>" + NUMBER + ")"},
        ["--epochs", "10", "--epoch-seconds", "0.15"],
        [{"lr": 0.5}, {"lr": 0.6}, {"lr": 0.001}],
        {"lr": {"type": "float", "low": 0.0001, "high": 1.0, "log": True}})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    for t in trials:
        printed = steps_printed(study.parent / "probe" / "trials" / str(t.number),
                                r"epoch (?P<step>\d+) .* valid loss (?P<value>\S+)")
        assert t.intermediate_values and all(
            printed[s] == v for s, v in t.intermediate_values.items())
    assert 10 in trials[0].intermediate_values and 10 in trials[1].intermediate_values
    assert max(trials[2].intermediate_values) < 10  # stopped before its end
    assert trials[2].value == trials[2].intermediate_values[max(trials[2].intermediate_values)]


@pytest.mark.slow
def test_word_language_model_output_with_exponents_is_reported_as_printed(
        write_study, fake_gpus):
    fake_gpus(1)
    line = r"\| end of epoch +(?P<step>\d+) .* valid loss +(?P<value>\S+)"  # the issue's
    study = pruned_study(
        write_study, "word_language_model.py", {"stdout": line},
        {"stdout": r"\| End of training \| test loss +(?P<loss>" + NUMBER + ")"},
        ["--epochs", "8", "--epoch-seconds", "0.15", "--lr", "5"],
        [{"dropout": 0.1}, {"dropout": 0.2}, {"dropout": 0.9}],
        {"dropout": {"type": "float", "low": 0.0, "high": 0.9}})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    first = trials[0].intermediate_values
    assert 1e-7 < first[1] < 1e-4  # 7.01e-06, not 7.01
    assert trials[0].value == pytest.approx(first[8])
    out = (study.parent / "probe" / "trials" / "0" / "stdout.log").read_text()
    assert f"valid loss {first[1]:.3g} " in out and "e-06 " in f"{first[1]:.3g} "


@pytest.mark.slow
def test_tensorboard_scalars_are_reported_with_their_steps_and_prune(write_study, fake_gpus):
    fake_gpus(1)
    study = pruned_study(
        write_study, "tensorboard_scalars.py",
        {"tensorboard": {"dir": "{trial_dir}/out/runs", "tag": "eval/loss"}},
        {"file": "{trial_dir}/out/all_results.json"},
        ["--epochs", "10", "--epoch-seconds", "0.15", "--output-dir", "{trial_dir}/out"],
        [{"lr": 0.5}, {"lr": 0.001}],  # two trials: each imports torch, which takes seconds
        {"lr": {"type": "float", "low": 0.0001, "high": 1.0, "log": True}},
        metric="eval_loss", pruner={**PRUNER, "n_startup_trials": 1})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert 900 in trials[0].intermediate_values  # the SummaryWriter's own steps
    assert set(trials[0].intermediate_values) <= {s * 100 for s in range(10)}
    assert trials[0].value == pytest.approx(trials[0].intermediate_values[900], rel=1e-6)
    assert max(trials[1].intermediate_values) < 900


def test_a_nan_after_a_number_fails_the_trial(write_study, fake_gpus):
    study = write_study(
        study={"metric": "loss", "n_trials": 1, "enqueue": [{"lr": 2.0}],
               "max_consecutive_failures": 1},
        trainer={"script": str(EXAMPLES / "diverges.py"),
                 "result": {"stdout": "loss (?P<loss>" + NUMBER + ")"}},
        params={"lr": {"type": "float", "low": 0.01, "high": 10.0}})
    run_cli("run", str(study))
    trial = load_trials(study)[0]
    assert trial.state.name == "FAIL"  # not COMPLETE with the 2.5 printed before
    assert trial.user_attrs[names.FAIL_REASON] == (
        "metric 'loss' matched in stdout but diverged: 'nan'")


@pytest.mark.slow
def test_a_timm_style_script_logging_to_stderr_has_its_result_read_there(
        write_study, fake_gpus, capsys):
    best = r"\*\*\* Best metric: (?P<top1>" + NUMBER + ")"
    base = {"metric": "top1", "direction": "maximize", "n_trials": 2,
            "enqueue": [{"lr": 0.1}, {"lr": 0.2}], "max_consecutive_failures": 1,
            "pruner": {"type": "median"}}
    script = {"script": str(EXAMPLES / "timm_style.py"), "args": ["--epochs", "3"]}
    params = {"lr": {"type": "float", "low": 0.01, "high": 1.0}}
    study = write_study(study=base, trainer={**script, "result": {"stderr": best}},
                        params=params)
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert [(t.state.name, t.value) for t in trials] == [("COMPLETE", 70.0), ("COMPLETE", 90.0)]
    said = capsys.readouterr().err
    assert said.count("ended without reporting an intermediate value") == 1  # said once,
    assert re.search(r"^trial [01] ended without reporting an intermediate value to "  # by the
                     r"\$SWEEP_REPORT_FILE \(sweep\.protocol\.report\): the median pruner "
                     r"cannot prune this study", said, re.M)  # first of the two to end

    wrong = write_study(study={**base, "name": "wrong", "n_trials": 1},
                        trainer={**script, "result": {"stdout": best}}, params=params,
                        name="wrong.yaml")
    run_cli("run", str(wrong))
    reason = load_trials(wrong, "wrong")[0].user_attrs[names.FAIL_REASON]
    assert reason.startswith("no result: no line of ")
    assert reason.endswith("; stdout is empty; they match in stderr.log: set "
                           "trainer.result.stderr instead")
