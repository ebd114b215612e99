"""Issue 24: the readers of `trainer.report` (stdout/stderr patterns, a keyed JSON-lines file,
TensorBoard event files), their bounds and their errors, and the study-file keys."""

from __future__ import annotations

import json
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import TRAINERS

from sweep._core import names
from sweep._core.errors import ConfigError
from sweep.spec import config, schema
from sweep.trial import _results
from sweep.trial.folders import TrialPaths
from sweep.trial.intermediate import (
    KeyedLinesReader,
    OutputReader,
    TensorboardReader,
    reader_for,
)

LINE = r"epoch (?P<step>\d+) .* valid loss (?P<value>\S+)"


def test_output_lines_give_steps_and_values_and_a_line_being_written_waits(tmp_path):
    log = tmp_path / "stdout.log"
    reader = OutputReader(log, [LINE], "loss")
    assert reader.read() == [] and reader.error is None  # no log yet
    log.write_text("starting\nepoch 1 | train 0.9 | valid loss 0.8\nepoch 2 | valid loss 0.")
    assert reader.read() == [(1, 0.8)]
    with log.open("a") as f:
        f.write("7\r\nepoch 2 | valid loss 9\nepoch 3 | x | valid loss 1.2e-05\n")
    assert reader.read() == [(2, 0.7), (3, 1.2e-05)]  # the second step 2 is ignored
    assert reader.read() == [] and not reader.more


def test_without_a_step_group_the_match_count_is_the_step_and_the_metric_names_the_value(
        tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text("loss=0.5\nother\nloss=0.25\rloss=0.125\n")
    reader = OutputReader(log, [r"loss=(?P<val_loss>\S+)"], "val_loss", name="stderr")
    assert reader.read() == [(1, 0.5), (2, 0.25), (3, 0.125)]


def test_a_report_section_says_whether_sweep_counts_its_steps():
    """What `schedulers` and `exploit_copy.choose` need to know before any value is read: a
    pattern with no `step` group gives counts (no step of the trainer's)."""
    section = schema.ReportSection
    assert section(stdout=r"loss=(?P<value>\S+)").counts_steps
    assert section(stdout=[r"step (?P<step>\d+) loss=(?P<value>\S+)",
                           r"eval=(?P<value>\S+)"]).counts_steps
    assert not section(stdout=r"step (?P<step>\d+) loss=(?P<value>\S+)").counts_steps
    assert not section(file="{trial_dir}/log.jsonl").counts_steps


@pytest.mark.parametrize(("text", "error"), [
    ("epoch 1 | valid loss 0.5\nepoch 2 | valid loss nan\n",
     "stdout line 2: the value diverged (nan)"),
    ("epoch 1 | valid loss -inf\n", "stdout line 1: the value diverged (-inf)"),
    ("epoch 1 | valid loss 0.5,\n", "stdout line 1: the value is not a number ('0.5,')"),
    ("epoch 99999999999 | valid loss 0.5\n",
     "stdout line 1: step must be a whole number from 0 to 2147483647 (got '99999999999')"),
])
def test_a_diverged_or_unreadable_value_stops_the_reading_with_its_reason(tmp_path, text, error):
    log = tmp_path / "stdout.log"
    log.write_text(text)
    reader = OutputReader(log, [LINE], "loss")
    found = reader.read()
    assert reader.error == error
    assert found == ([(1, 0.5)] if "nan" in text else [])
    assert reader.read() == []  # stopped


def test_output_reading_is_bounded_per_pass(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"epoch {i} | valid loss {i / 10}\n" for i in range(250)))
    reader = OutputReader(log, [LINE], "loss", batch=100)
    first = reader.read()
    assert len(first) == 100 and reader.more and first[-1] == (99, 9.9)
    assert len(reader.read()) == 100 and reader.more
    assert [s for s, _ in reader.read()] == list(range(200, 250)) and not reader.more
    big = tmp_path / "big.log"  # more than a chunk of progress bar: read a chunk per pass
    big.write_bytes(b"x" * (_results.CHUNK * 2 + 10) + b" valid loss 3\n")
    long = OutputReader(big, [r"valid loss (?P<value>\S+)"], "loss")
    assert long.read() == [] and long.more
    assert long.read_rest() == [(1, 3.0)] and long.error is None


def test_a_keyed_lines_file_reports_its_named_keys_and_skips_other_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [
        {"epoch": 1, "train_loss": 0.9}, {"epoch": 1, "eval": {"loss": 0.8}},
        {"eval": {"loss": 0.7}}, {"epoch": 3, "eval": {"loss": 0.6}}]) + "\n")
    reader = KeyedLinesReader(path, "epoch", "eval.loss")
    assert reader.read() == [(1, 0.8), (2, 0.7), (3, 0.6)]
    with path.open("a") as f:
        f.write('{"epoch": 4, "eval": {"loss": NaN}}\n')
    assert reader.read() == [] and reader.error == "metrics.jsonl line 5: the value diverged (nan)"


def write_events(folder: Path, tag: str, points: list[tuple[int, float]]) -> None:
    """Scalars written as SummaryWriter writes them, through tensorboard's own writer."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    for step, value in points:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary))
    writer.flush()
    writer.close()


def test_tensorboard_scalars_of_one_tag_are_read_incrementally_in_any_subfolder(tmp_path):
    runs = tmp_path / "runs"
    reader = TensorboardReader(runs, "eval/loss", batch=2)
    assert reader.read() == [] and reader.error is None  # no folder yet
    write_events(runs / "Dec01_host", "eval/loss", [(0, 0.5), (100, 0.25), (200, 0.125)])
    write_events(runs / "Dec01_host", "train/loss", [(0, 9.0)])
    assert reader.read() == [(0, 0.5), (100, 0.25)] and reader.more
    assert reader.read_rest() == [(200, 0.125)]
    write_events(runs / "Dec01_host", "eval/loss", [(300, float("inf"))])
    assert reader.read() == []
    assert reader.error == "tensorboard tag 'eval/loss' at step 300: the value diverged (inf)"


def test_reader_for_fills_placeholders_and_defaults_to_the_report_file(tmp_path):
    paths = TrialPaths.of(tmp_path, 3)
    places = {"trial_dir": str(paths.dir), "trial_number": "3"}
    assert isinstance(reader_for(None, paths, "loss", places), _results.ReportReader)
    report = schema.ReportSection(tensorboard={"dir": "{trial_dir}/runs", "tag": "t"})
    board = reader_for(report, paths, "loss", places)
    assert isinstance(board, TensorboardReader) and board.folder == paths.dir / "runs"
    keyed = reader_for(schema.ReportSection(file="{trial_dir}/m.jsonl"), paths, "loss", places)
    assert isinstance(keyed, KeyedLinesReader)
    assert (keyed.path, keyed.step_key, keyed.value_key) == (paths.dir / "m.jsonl", "step",
                                                             "loss")
    here = reader_for(schema.ReportSection(file="m.jsonl"), paths, "loss", places, tmp_path)
    assert isinstance(here, KeyedLinesReader) and here.path == tmp_path / "m.jsonl"  # workdir
    out = reader_for(schema.ReportSection(stderr=LINE), paths, "loss", places)
    assert isinstance(out, OutputReader) and out.name == "stderr"


def problems(write_study, **trainer) -> list[str]:
    study = write_study(trainer=trainer)
    with pytest.raises(ConfigError) as e:
        config.load(study)
    return [f"{p.key}: {p.message}" for p in e.value.problems]


@pytest.mark.parametrize(("report", "said"), [
    ({"stdout": LINE, "file": "x"},
     "trainer.report: give exactly one of stdout, stderr, tensorboard or file (got stdout, "
     "file)"),
    ({"stdout": r"loss (?P<loss>\S+)"},
     r"trainer.report.stdout: a report pattern needs a named group for the value: "
     r"(?P<value>...) or (?P<score>...): loss (?P<loss>\S+)"),
    ({"stdout": LINE, "step": "epoch"},
     "trainer.report: step and value name the keys of a report file: give them with file only"),
    ({"tensorboard": {"dir": "{nowhere}/runs", "tag": "t"}},
     "trainer.report.tensorboard.dir: unknown placeholder {nowhere}: use {trial_dir}, "
     "{trial_number}, {study_dir}, {output_dir}, {checkpoint_dir}; a literal brace is doubled "
     "({{ }})"),
    ({"tensorboard": {"dir": "runs"}}, "trainer.report.tensorboard.tag: required key is missing"),
])
def test_bad_report_keys_are_one_line_each(write_study, report, said):
    assert problems(write_study, report=report) == [said]


def test_a_missing_tensorboard_package_refuses_the_key_in_one_line(write_study, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert problems(write_study, report={"tensorboard": {"dir": "runs", "tag": "t"}}) == [
        "trainer.report.tensorboard: reading TensorBoard event files needs the tensorboard "
        "package: pip install 'sweep[tensorboard]'"]


def test_a_stream_report_makes_python_write_each_line_at_once(write_study):
    from sweep.trial import launch_plan

    spec = config.load(write_study(trainer={"report": {"stdout": LINE}}))
    assert launch_plan.plan_trial(spec, 0, {"x": 0.5}, 0).env["PYTHONUNBUFFERED"] == "1"
    mine = config.load(write_study(trainer={"report": {"stdout": LINE},
                                            "env": {"PYTHONUNBUFFERED": ""}}))
    assert launch_plan.plan_trial(mine, 0, {"x": 0.5}, 0).env["PYTHONUNBUFFERED"] == ""
    plain = config.load(write_study())
    assert "PYTHONUNBUFFERED" not in launch_plan.plan_trial(plain, 0, {"x": 0.5}, 0).env


def test_a_report_source_in_the_checkpoint_folder_is_followed(tmp_path):
    """{checkpoint_dir} passed the study file's check but the driver filled a source's path
    without it: the trial's start raised KeyError (its trainer already spawned)."""
    from sweep.testing.fakes import Script
    from sweep.testing.harness import Sweep

    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=1, study={"n_trials": 1},
              trainer={"report": {"file": "{checkpoint_dir}/metrics.jsonl"}})
    assert s.run() == 0
    assert s.states() == ["COMPLETE"]



def test_a_json_lines_line_longer_than_a_pass_is_read_and_one_past_the_bound_skipped(
        tmp_path, monkeypatch, capsys):
    """Issue 32: a valid JSON-lines line over 256 KiB (a log line with a big histogram)
    failed the trial. It is read whole, up to LONGEST_LINE; a longer one is skipped, said once,
    and the lines after it are read."""
    path = tmp_path / "metrics.jsonl"
    big = json.dumps({"epoch": 1, "eval": {"loss": 0.5}, "histogram": [0.125] * 100_000})
    assert len(big) > _results.CHUNK
    path.write_text(big + "\n" + json.dumps({"epoch": 2, "eval": {"loss": 0.25}}) + "\n")
    reader = KeyedLinesReader(path, "epoch", "eval.loss")
    assert reader.read_rest() == [(1, 0.5), (2, 0.25)] and reader.error is None

    monkeypatch.setattr(_results, "LONGEST_LINE", 300_000)
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"epoch": 1, "eval": {"loss": 0.5}}) + "\n"
                    + json.dumps({"epoch": 2, "histogram": [0.125] * 500_000}) + "\n"
                    + json.dumps({"epoch": 3, "eval": {"loss": 0.125}}) + "\n")
    reader = KeyedLinesReader(huge, "epoch", "eval.loss")
    assert reader.read_rest() == [(1, 0.5), (3, 0.125)] and reader.error is None
    err = capsys.readouterr().err
    assert err == f"sweep: {huge}: line 2 is longer than 300000 bytes: skipped\n"


def test_a_file_that_ends_inside_a_line_too_long_to_read_has_nothing_more_waiting(
        tmp_path, monkeypatch, capsys):
    """A trainer killed while writing a line longer than LONGEST_LINE: the reader said
    `more` forever at the end of the file, so the driver never judged the trial (and spun)."""
    monkeypatch.setattr(_results, "LONGEST_LINE", 1000)
    monkeypatch.setattr(_results, "CHUNK", 512)
    path = tmp_path / "reports.jsonl"
    path.write_text('{"step": 1, "value": 0.5}\n' + "x" * 5000)  # no newline at its end
    reader = _results.ReportReader(path)
    got = [reader.read() for _ in range(12)]
    assert got[0] == [(1, 0.5)] and not any(got[1:]) and reader.error is None
    assert reader.more is False
    assert "line 2 is longer than 1000 bytes: skipped" in capsys.readouterr().err


ECHOED = ("epoch 1 loss 1.0\nepoch 2 loss 0.5\nRuntimeError: oops\nepoch 3 loss 0.3\n"
          "RuntimeError: epoch 2 loss 0.5\nRuntimeError: oops\nepoch 3 loss 0.3\n\n"
          "The above exception was the direct cause of the following exception:\n\n"
          "Traceback (most recent call last):\n  File \"accelerate\", line 1\n"
          "subprocess.CalledProcessError: Command '[...]' returned non-zero exit status 3.\n")


def test_stderr_reports_end_where_the_launchers_copy_of_its_tail_begins(tmp_path):
    """Item 6 of issue 38: accelerate 1.16 repeats the trainer's last stderr lines after it
    ended, and those were read as new reports (counted steps 4, 5). A line that starts
    `RuntimeError: ` waits while it may begin that copy; the trainer's own such line is read."""
    log = tmp_path / "stderr.log"
    reader = OutputReader(log, [r"loss (?P<value>\S+)"], "loss", name="stderr")
    cut = ECHOED.index("RuntimeError: epoch 2")
    log.write_text(ECHOED[: cut + len("RuntimeError: epoch 2 loss 0.5\n")])
    assert reader.read() == [(1, 1.0), (2, 0.5), (3, 0.3)]  # the copy's first line waits
    log.write_text(ECHOED)
    assert reader.read() == [] and reader.read_rest() == []
    own = tmp_path / "own.log"  # the trainer's own line, however it looked, once it exited
    own.write_text("epoch 1 loss 1.0\nRuntimeError: epoch 1 loss 1.0\n")
    reader = OutputReader(own, [r"loss (?P<value>\S+)"], "loss", name="stderr")
    assert reader.read() == [(1, 1.0)]
    assert reader.read_rest() == [(2, 1.0)]


def test_accelerate_launchs_copy_of_stderr_is_no_report_and_no_fail_reason(
        write_study, fake_gpus):
    """Item 6 of issue 38, against the accelerate installed (1.16.0 when written): a trainer
    under `accelerate launch` logs 3 epochs on stderr and fails; the launcher prints its last
    lines again. The trial has 3 steps, not 3 + the copy, and its fail reason is its own
    last line; a trainer that ends 0 has its 3 steps too (the second trial of the run)."""
    from conftest import load_trials, run_cli

    trainer = TRAINERS / "stderr_epochs.py"
    study = write_study(study={"name": "echo", "n_trials": 1, "max_consecutive_failures": 2,
                               "pruner": {"type": "median"},  # every value stored
                               "enqueue": [{"ok": False}, {"ok": True}]},
                        trainer={"script": str(trainer), "launcher": "accelerate",
                                 "report": {"stderr": r"loss (?P<value>\S+)"}},
                        params={"ok": {"type": "bool"}})
    fake_gpus(1)
    run_cli("run", str(study))  # both fail (the second leaves no result): the run gives up
    trials = load_trials(study, "echo")
    assert [t.params["ok"] for t in trials] == [False, True]
    for trial in trials:
        log = (study.parent / "echo" / "trials" / str(trial.number) / "stderr.log").read_text()
        if not trial.params["ok"]:  # the launcher did repeat them (accelerate 1.16 and later)
            assert log.count("epoch 3 loss") == 2, (metadata.version("accelerate"), log)
            assert trial.user_attrs[names.FAIL_REASON] == "exit code 3: giving up"
        assert trial.intermediate_values == {1: 1.0, 2: 0.5, 3: 0.3333}
