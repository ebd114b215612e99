"""The other verbs, and what the driver process loads."""

from __future__ import annotations

import subprocess
import sys

from conftest import run_cli

from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu


def test_gpus_lists_a_simulated_pool(fake_gpus, capsys):
    fake_gpus(3)
    assert run_cli("gpus") == 0
    out = capsys.readouterr().out
    assert "GPU pool (simulated)" in out and out.count("simulated GPU") == 3


def test_gpus_lists_nvml_devices_with_memory_and_state(monkeypatch, capsys):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake_pynvml.install(monkeypatch, [
        FakeGpu(name="NVIDIA A", uuid="GPU-a"),
        FakeGpu(name="NVIDIA B", uuid="GPU-b", memory_used=3 * 2**30, util_gpu=70,
                processes=[(42, 3 * 2**30)]),
    ])
    assert run_cli("gpus") == 0
    out = capsys.readouterr().out
    assert "NVIDIA B" in out and "NVIDIA A" not in out
    assert "3072" in out and "70" in out and "busy" in out


def test_no_gpu_and_no_simulation_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    fake_pynvml.install(monkeypatch, None)
    assert run_cli("gpus") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SWEEP_FAKE_GPUS=N" in err


def test_status_counts_states(write_study, fake_gpus, capsys):
    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study)) == 0
    capsys.readouterr()
    assert run_cli("status", str(study)) == 0
    assert "COMPLETE" in capsys.readouterr().out


def test_the_driver_does_not_import_torch_or_accelerate():
    code = ("import sys, sweep.cli, sweep.driver, sweep.monitor, sweep.progress, sweep.pool\n"
            "print(sorted(m for m in ('torch', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_and_help():
    out = subprocess.run([sys.executable, "-m", "sweep", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for verb in ("run", "summary", "gpus", "status"):
        assert verb in out


def test_on_a_terminal_run_shows_a_live_table_of_budget_gpus_and_best(write_study, fake_gpus,
                                                                      monkeypatch):
    import io

    from rich.console import Console

    from sweep import cli

    screen = io.StringIO()
    monkeypatch.setattr(cli, "Console", lambda **kw: Console(
        file=screen, force_terminal=True, width=120, **kw))
    study = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "1.5"]})
    assert run_cli("run", str(study)) == 0
    out = screen.getvalue()
    assert "0/4 finished, 2 running" in out or "1/4 finished" in out
    assert "best #" in out
    for column in ("GPU", "trial", "elapsed", "util %", "mem MB", "params"):
        assert column in out
    assert "x=0." in out
