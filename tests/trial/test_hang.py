"""Hung trials: the rule (fake clock), the silence watch, py-spy dumps, and the driver's loop
that dumps, stops and tells them FAIL `hung: ...` (fake processes), then a few real runs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import load_trials, run_cli, spawn_cli

from sweep._core import names
from sweep._core.errors import UsageError
from sweep.gpus.monitor import Monitor
from sweep.gpus.nvml import GpuReading
from sweep.spec import config
from sweep.testing.fakes import FakeProcess, Script
from sweep.testing.harness import Sweep
from sweep.trial import folders, hang, stacks

# ---- the rule -----------------------------------------------------------------------------


def test_silent_for_hang_after_with_no_gpu_figures_is_hung():
    assert hang.judge(10.0, [], 14.9, 5.0, 5.0) is None
    found = hang.judge(10.0, [], 15.0, 5.0, 5.0)
    assert found == hang.Hang(5.0, None, 5.0)
    assert found.reason() == ("hung: no output (stdout, stderr, reports, result) for 5 s, GPU "
                              "use not known (no NVML), so silence alone decided")


def test_a_busy_gpu_in_the_window_is_not_hung_an_idle_one_is():
    samples = [(1.0, 90.0), (6.0, 3.0), (8.0, 4.0), (9.0, math.nan)]
    assert hang.judge(0.0, samples, 10.0, 5.0, 5.0) == hang.Hang(10.0, 4.0, 5.0)
    assert hang.judge(0.0, samples, 10.0, 5.0, 4.0) is None  # 4 % is not below 4 %
    assert hang.judge(0.0, samples, 6.0, 5.0, 5.0) is None  # 90 % at 1 s is in the window
    assert hang.judge(0.0, [(9.0, math.nan)], 10.0, 5.0, 5.0) == hang.Hang(10.0, None, 5.0)
    assert hang.judge(0.0, samples, 10.0, 5.0, 5.0).reason().endswith(  # type: ignore[union-attr]
        "GPU use at most 4 % (below 5 %) meanwhile")


def test_the_watch_sees_each_change_of_size_or_time_and_nothing_else(tmp_path):
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    out.write_text("")
    watch = hang.OutputWatch([out, err, tmp_path / "result.json"], 100.0, 5.0, 0.5)
    assert watch.every == 0.5 and watch.next_look() == 100.5 and not watch.due(100.4)
    assert watch.look(101.0) == 100.0  # nothing changed since the start
    out.write_text("a line\n")
    assert watch.look(101.5) == 101.5
    assert watch.look(103.0) == 101.5
    err.write_text("")  # created, empty: a change
    assert watch.look(104.0) == 104.0 and watch.silent_for(110.0) == 6.0
    assert hang.OutputWatch([out], 0.0, 1800.0, 0.5).every == 90.0  # 20 looks per window


def test_a_report_source_is_output_too_a_new_file_of_it_included(tmp_path):
    """A trainer whose only output is TensorBoard scalars or its own JSON-lines log (a
    `trainer.report` source) is not silent while it writes them."""
    from sweep.spec.schema import ReportSection
    from sweep.trial import intermediate

    runs = tmp_path / "runs"
    source = intermediate.reader_for(
        ReportSection.model_validate({"tensorboard": {"dir": str(runs), "tag": "loss"}}),
        folders.TrialPaths(tmp_path / "trial"), "loss", {})
    watch = hang.OutputWatch([tmp_path / "stdout.log"], 0.0, 5.0, 0.5, source.watched)
    assert watch.look(1.0) == 0.0  # no event file yet
    runs.mkdir()
    events = runs / "events.out.tfevents.1.host"
    events.write_bytes(b"x")  # a new event file: output
    assert watch.look(2.0) == 2.0
    assert watch.look(3.0) == 2.0
    with events.open("ab") as f:  # appended: output
        f.write(b"y")
    assert watch.look(4.0) == 4.0
    log = tmp_path / "metrics.jsonl"
    keyed = intermediate.reader_for(ReportSection.model_validate({"file": str(log)}),
                                     folders.TrialPaths(tmp_path / "trial"), "loss", {})
    assert keyed.watched() == [log]


def test_status_silence_is_from_file_times(tmp_path):
    f = tmp_path / "stdout.log"
    f.write_text("x")
    os.utime(f, (1000.0, 1000.0))
    assert hang.silence([f, tmp_path / "missing"], 1012.5) == 12.5
    assert hang.silence([tmp_path / "missing"], 5.0) is None


def test_hang_settings_are_checked_like_every_key(write_study):
    assert config.load(write_study()).trainer.hang_after == 1800.0
    assert config.load(write_study(trainer={"hang_after": None})).trainer.hang_after is None
    with pytest.raises(UsageError, match=r"trainer\.hang_after"):
        config.load(write_study(trainer={"hang_after": 0}))
    with pytest.raises(UsageError, match=r"trainer\.hang_gpu_util"):
        config.load(write_study(trainer={"hang_gpu_util": 101}))


# ---- stack dumps ----------------------------------------------------------------------------


def test_a_dump_says_for_each_process_what_it_got(tmp_path):
    def run(argv: list[str], timeout: float) -> tuple[int, str, str]:
        pid = int(argv[-1])
        if pid == 1:
            return 0, "Thread 1 (idle)\n    stuck_here (train.py:3)\n", ""
        if pid == 2:
            return 1, "", "Error: Permission Denied: Try running again with elevated permissions"
        raise subprocess.TimeoutExpired(argv, timeout)

    path = tmp_path / "stack.txt"
    text = stacks.dump([(1, "python train.py"), (2, "python a.py"), (3, "python b.py")], path,
                       "hung: ...", find=lambda: "py-spy", run=run, timeout=2)
    assert path.read_text() == text
    assert text.splitlines() == [
        "# sweep: Python stacks of the trial's processes, taken before stopping it: hung: ...",
        "", "## pid 1: python train.py", "Thread 1 (idle)", "    stuck_here (train.py:3)",
        "", "## pid 2: python a.py",
        "py-spy could not read it: Error: Permission Denied: Try running again with elevated "
        f"permissions ({stacks.NO_RIGHTS})",
        "", "## pid 3: python b.py", "py-spy did not finish within 2 s: no stack taken"]
    none = stacks.dump([(1, "python x.py")], tmp_path / "s2.txt", "why", find=lambda: None)
    assert "py-spy is not installed (pip install py-spy): no stack taken" in none


def test_a_dump_py_spy_failed_says_its_error_not_the_backtrace_after_it(tmp_path):
    """Hostile pass: of a stopped (SIGSTOP) trainer, stack.txt said `py-spy could not read it:
    9: main`, the last frame of py-spy's own backtrace, not its error."""
    said = ("Error: Failed to find python version from target process\n"
            "Stack backtrace:\n   0: anyhow::error\n   9: main\n")

    def run(argv: list[str], timeout: float) -> tuple[int, str, str]:
        return 1, "", said

    text = stacks.dump([(1, "python t.py")], tmp_path / "stack.txt", "hung", find=lambda: "x",
                       run=run, timeout=2)
    assert ("py-spy could not read it: Error: Failed to find python version from target "
            "process") in text.splitlines()
    assert stacks.said_error([]) is None and stacks.said_error(["a", "b"]) == "b"


def test_py_spy_reads_a_real_sleeping_process(tmp_path):
    code = ("import time\ndef stuck_here():\n    time.sleep(60)\nprint('up', flush=True)\n"
            "stuck_here()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        found = stacks.python_pids({proc.pid, 999_999_999})
        assert [pid for pid, _ in found] == [proc.pid]
        text = stacks.dump(found, tmp_path / "stack.txt", "hung")
        assert "stuck_here (<string>:3)" in text, text
    finally:
        proc.kill()
        proc.wait()


# ---- the loop, on fakes ---------------------------------------------------------------------


class Dumps:
    """Stands in for `stacks.dump`; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[int, str]], Path, str]] = []

    def __call__(self, processes: list[tuple[int, str]], path: Path, why: str) -> str:
        self.calls.append((processes, path, why))
        path.write_text("dumped\n")
        return "dumped\n"


def hung_sweep(tmp_path, script, gpus: int = 1, **sections) -> tuple[Sweep, Dumps]:
    trainer = {"hang_after": 5, "grace_period": 1, **sections.pop("trainer", {})}
    s = Sweep(tmp_path, script, gpus=gpus, trainer=trainer, **sections)
    dumps = Dumps()
    s.driver.follow.dump_stacks = dumps  # type: ignore[assignment]
    s.driver.follow.python_pids = lambda pids: [(p, "python train.py") for p in sorted(pids)]
    return s, dumps


def test_a_silent_trial_is_dumped_stopped_and_failed_hung_and_its_device_goes_on(
        tmp_path, monkeypatch):
    # each fake trial: its guard (its pid) and one child; the guard is sweep's, not dumped
    monkeypatch.setattr(FakeProcess, "tree_pids",
                        lambda self: set() if self.ended else {self.pid, self.pid + 50_000})

    def script(params):
        if params["x"] < 0.5:  # the first trial (seed 0) hangs after one line
            return Script(runs=1e6, output=[(0.2, "epoch 0")], result=None)
        return Script(runs=1.0)

    s, dumps = hung_sweep(tmp_path, script, study={"n_trials": 2, "max_consecutive_failures": 3},
                          params={"x": {"type": "categorical", "choices": [0.1, 0.9]}},)
    s.store.study.enqueue_trial({"x": 0.1})
    s.store.study.enqueue_trial({"x": 0.9})
    assert s.run() == 0
    first, second = s.trials[0], s.trials[1]
    assert first.state.name == "FAIL"
    reason = first.user_attrs[names.FAIL_REASON]
    assert reason.startswith("hung: no output (stdout, stderr, reports, result) for 5 s, GPU use "
                             "not known"), reason
    assert reason.endswith(f"stacks in {tmp_path / 'probe' / 'trials' / '0' / 'stack.txt'}")
    (processes, path, why), = dumps.calls
    assert why.startswith("hung: no output")
    assert path == tmp_path / "probe" / "trials" / "0" / "stack.txt"
    assert processes == [(s.spawn.processes[0].pid + 50_000, "python train.py")]
    hung = s.spawn.processes[0]
    assert hung.signals == ["TERM"]
    # found at the first look after 0.2 + 5 s of silence (looks every 0.5 s), told at once
    assert hung.ended_at == pytest.approx(5.5)
    assert second.state.name == "COMPLETE" and second.user_attrs[names.GPU] == 0
    assert s.spawn.processes[1].started == pytest.approx(5.5)


def test_a_hang_is_retried_as_any_failure(tmp_path):
    calls = []

    def script(params):
        calls.append(params)
        return Script(runs=1e6, result=None) if len(calls) == 1 else Script(runs=1.0)

    s, _ = hung_sweep(tmp_path, script, study={"n_trials": 1},
                      trainer={"max_retries": 1})
    s.run()
    assert s.states() == ["FAIL", "COMPLETE"]
    assert s.trials[1].params == s.trials[0].params
    assert s.trials[1].user_attrs[names.ATTEMPT] == 1


def test_chatty_trainers_are_never_hung(tmp_path):
    """A line every second for 20 s, or a report every second: never taken for hung with
    hang_after 5 (nor with hang_after 1.5)."""
    lines = Script(runs=20.0, output=[(float(t), f"step {t}") for t in range(20)])
    reports = Script(runs=20.0, reports=[(float(t), t, 0.1 * t) for t in range(20)])
    for hang_after in (5, 1.5):
        for i, chatty in enumerate((lines, reports)):
            folder = tmp_path / f"{hang_after}-{i}"
            folder.mkdir()
            s, dumps = hung_sweep(folder, lambda p, c=chatty: c, study={"n_trials": 1},
                                  trainer={"hang_after": hang_after})
            assert s.run() == 0
            assert s.states() == ["COMPLETE"] and dumps.calls == []


def test_a_silent_trial_with_a_busy_gpu_is_not_hung_until_the_gpu_idles(tmp_path):
    class Busy:
        util = 90.0

        def read(self, index: int) -> GpuReading:
            return GpuReading(util_gpu=self.util)

        def energy_mj(self, index: int) -> float | None:
            return None

        def compute_processes(self, index: int) -> dict[int, float | None]:
            return {}

    reader = Busy()
    s, dumps = hung_sweep(tmp_path, lambda p: Script(runs=1e6, result=None),
                          study={"n_trials": 1, "max_consecutive_failures": 1}, reader=reader)
    s.clock.at(24.4, lambda: setattr(dumps, "before", list(dumps.calls)))
    monitor = s.driver.monitor
    assert isinstance(monitor, Monitor)
    for t in range(40):  # a sample a second; the GPU idles from 20 s on
        s.clock.at(t + 0.25, monitor.sample_once)
    s.clock.at(19.5, lambda: setattr(reader, "util", 1.0))
    s.run()
    reason = s.trials[0].user_attrs[names.FAIL_REASON]
    # the last busy sample, at 19.25 s, leaves the 5 s window after 24.25 s: the next look
    assert reason.startswith("hung: no output (stdout, stderr, reports, result) for 24 s, GPU "
                             "use at most 1 % (below 5 %) meanwhile"), reason
    assert s.spawn.processes[0].ended_at == pytest.approx(24.5)
    assert dumps.before == [] and len(dumps.calls) == 1  # type: ignore[attr-defined]


def test_hang_after_null_never_stops_a_silent_trial(tmp_path):
    s, dumps = hung_sweep(tmp_path, lambda p: Script(runs=100.0), study={"n_trials": 1},
                          trainer={"hang_after": None})
    assert s.run() == 0 and s.states() == ["COMPLETE"] and dumps.calls == []


# ---- real runs --------------------------------------------------------------------------------

SLEEPER = """\
import os, sys, time

def wait_for_the_lock_that_never_comes():
    time.sleep(600)

print("epoch 0 done", flush=True)
if os.environ.get("SWEEP_TRIAL_NUMBER") == "0" or "--hang" in sys.argv:
    wait_for_the_lock_that_never_comes()
from sweep.protocol import write_result
write_result({"score": 1.0})
"""


@pytest.mark.slow
def test_a_real_hung_trainer_is_failed_with_its_stack_and_its_device_takes_the_next(
        write_study, tmp_path, fake_gpus):
    fake_gpus(1)
    trainer = tmp_path / "sleeper.py"
    trainer.write_text(SLEEPER)
    study = write_study(study={"n_trials": 1},
                        trainer={"script": str(trainer), "hang_after": 5, "grace_period": 1})
    assert run_cli("run", str(study)) == 0
    first, second = load_trials(study)
    assert first.state.name == "FAIL" and second.state.name == "COMPLETE"
    assert first.user_attrs[names.FAIL_REASON].startswith("hung: no output"), first.user_attrs
    stack = (tmp_path / "probe" / "trials" / "0" / "stack.txt").read_text()
    assert "wait_for_the_lock_that_never_comes" in stack, stack
    assert second.user_attrs[names.GPU] == 0
    took = (first.datetime_complete - first.datetime_start).total_seconds()
    assert took < 30, took  # hang_after + grace + a look, and start-up: not the 600 s sleep


DDP_HANG = """\
import time
print("rank starting", flush=True)  # the imports that follow are long on a busy machine
import torch
from accelerate import Accelerator

def rank_waits_forever(rank):
    time.sleep(600)

acc = Accelerator(cpu=True)
acc.wait_for_everyone()
print("joined", acc.process_index, flush=True)
rank_waits_forever(acc.process_index)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("rendezvous")
def test_every_rank_of_a_hung_two_process_trial_is_dumped(write_study, tmp_path):
    trainer = tmp_path / "ddp_hang.py"
    trainer.write_text(DDP_HANG)
    study = write_study(study={"n_trials": 1, "max_consecutive_failures": 1},
                        trainer={"script": str(trainer), "launcher": "accelerate",
                                 "gpus_per_trial": 2, "hang_after": 30, "grace_period": 1})
    # hang_after 30: on a busy machine `accelerate launch` imports torch, silent, for over 10 s
    run = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    _, err = run.communicate(timeout=240)
    trial, = load_trials(study)
    assert trial.state.name == "FAIL", err
    assert trial.user_attrs[names.FAIL_REASON].startswith("hung:"), err
    stack = (tmp_path / "probe" / "trials" / "0" / "stack.txt").read_text()
    sections = stack.split("\n## pid ")[1:]
    ranks = [s for s in sections if "rank_waits_forever" in s]
    assert len(ranks) == 2, stack


def test_a_chatty_real_trainer_is_not_hung(write_study, tmp_path, fake_gpus):
    trainer = tmp_path / "chatty.py"
    trainer.write_text(textwrap.dedent("""\
        import time
        from sweep.protocol import write_result
        for step in range(8):
            print("step", step, flush=True)
            time.sleep(0.5)
        write_result({"score": 1.0})
        """))
    study = write_study(study={"n_trials": 1},
                        trainer={"script": str(trainer), "hang_after": 1.5})
    assert run_cli("run", str(study)) == 0
    trial, = load_trials(study)
    assert trial.state.name == "COMPLETE", trial.user_attrs
    assert not (tmp_path / "probe" / "trials" / "0" / "stack.txt").exists()


@pytest.mark.slow
def test_status_shows_how_long_a_running_trial_has_been_silent(write_study, tmp_path, capsys,
                                                               fake_gpus):
    trainer = tmp_path / "sleeper.py"
    trainer.write_text(SLEEPER)
    study = write_study(study={"n_trials": 1}, trainer={"script": str(trainer)})
    run = spawn_cli("run", str(study))
    try:
        stdout = tmp_path / "probe" / "trials" / "0" / "stdout.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (stdout.exists() and stdout.read_text()):
            time.sleep(0.1)
        time.sleep(1.2)
        capsys.readouterr()
        assert run_cli("status", str(study)) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("trial 0 RUNNING"))
        silent = int(line.split("silent for ")[1].split(" s")[0])
        assert silent >= 1, line
    finally:
        run.terminate()
        run.communicate(timeout=60)




def test_status_silence_counts_a_result_file_of_its_own_in_the_workdir(write_study, tmp_path):
    """Hostile pass: with `result.file: out.json` and `workdir: "{trial_dir}/wd"`, a trainer
    rewriting out.json every 0.5 s was shown silent for 5 s (status looked at result.json)."""
    from sweep.analysis import status

    study = write_study(trainer={"workdir": "{trial_dir}/wd",
                                 "result": {"file": "out.json"}})
    spec = config.load(study, runnable=False)
    folder = tmp_path / "probe" / "trials" / "0"
    (folder / "wd").mkdir(parents=True)
    for name in ("stdout.log", "stderr.log"):
        (folder / name).write_text("")
        os.utime(folder / name, (time.time() - 100, time.time() - 100))
    (folder / "wd" / "out.json").write_text("{}")
    assert status._silent(spec, 0) < 50
    os.utime(folder / "wd" / "out.json", (time.time() - 100, time.time() - 100))
    assert status._silent(spec, 0) >= 99
