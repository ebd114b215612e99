"""The GPU monitor against a fake pynvml: samples, per-trial aggregates, per-GPU busy time."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import load_trials, run_cli

from sweep._core import names
from sweep.analysis import summary
from sweep.gpus.monitor import Monitor, NoReader
from sweep.gpus.nvml import Nvml
from sweep.gpus.pool import Pool, fake_devices
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu
from sweep.testing.fakes import lease


class Pids:
    def __init__(self, pids: set[int]) -> None:
        self.pids = pids

    def tree_pids(self) -> set[int]:
        return self.pids


def test_per_trial_aggregates_follow_the_samples_of_its_device(monkeypatch, tmp_path):
    gpus = [FakeGpu(uuid="GPU-a", energy_mj=1_000_000), FakeGpu(uuid="GPU-b", power_mw=None)]
    fake_pynvml.install(monkeypatch, gpus)
    nvml = Nvml()
    devices = Pool(fake_devices("2"))
    monitor = Monitor(nvml, devices, tmp_path / "gpu_samples.csv")
    monitor.create_csv()  # no thread: the test samples by hand
    lease(devices, 7, Pids({111, 112}))
    monitor.trial_started(7, 0)
    for t, (util, used) in enumerate([(10, 1), (90, 3), (50, 2)]):
        gpus[0].util_gpu = util
        gpus[0].processes = [(111, used * 2**30), (999, 5 * 2**30)]  # 999 is not the trial's
        monitor.sample_once(now=1000.0 + t)
    gpus[0].energy_mj = 1_250_000
    stats = monitor.trial_finished(7, shared=False)
    assert stats[names.GPU_UTIL_MEAN] == pytest.approx(50)
    assert stats[names.GPU_UTIL_MAX] == 90
    assert stats[names.GPU_MEM_PEAK_MB] == pytest.approx(3 * 1024)
    assert stats[names.ENERGY_J] == pytest.approx(250)

    samples = summary.read_samples(tmp_path)
    assert len(samples) == 6
    held = samples[samples["gpu"] == 0]
    assert list(held["trials"]) == ["7", "7", "7"]
    assert list(held["util_gpu"]) == [10, 90, 50]
    other = samples[samples["gpu"] == 1]
    assert list(other["trials"]) == ["", "", ""] and other["power_w"].isna().all()


def test_without_nvml_figures_are_nan_but_holders_are_recorded(tmp_path):
    devices = Pool(fake_devices("1"))
    monitor = Monitor(NoReader(), devices, tmp_path / "gpu_samples.csv")
    monitor.create_csv()
    lease(devices, 3)
    monitor.trial_started(3, 0)
    monitor.sample_once(now=5.0)
    stats = monitor.trial_finished(3, shared=False)
    assert all(math.isnan(v) for v in stats.values())
    samples = summary.read_samples(tmp_path)
    assert list(samples["trials"]) == ["3"] and samples["util_gpu"].isna().all()


def test_a_sweep_on_fake_nvml_stores_utilisation_and_busy_fractions(monkeypatch, write_study):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(uuid="GPU-a", util_gpu=40, memory_used=2**30),
            FakeGpu(uuid="GPU-b", util_gpu=80, memory_used=2 * 2**30)]
    fake_pynvml.install(monkeypatch, gpus)
    study = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "0.8"]},
                        gpus={"sample_interval": 0.1, "skip_busy": False})  # memory is static
    assert run_cli("run", str(study)) == 0

    trials = load_trials(study)
    for t in trials:
        expected = {0: 40, 1: 80}[t.user_attrs[names.GPU]]
        assert t.user_attrs[names.GPU_UTIL_MEAN] == expected
        assert t.user_attrs[names.GPU_UTIL_MAX] == expected
        assert t.user_attrs[names.GPU_MEM_PEAK_MB] == 1024 * (1 + t.user_attrs[names.GPU])
        assert t.user_attrs[names.ENERGY_J] == 0  # the fake's energy counter does not move

    s = summary.load(study)
    wall = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials))
    for gpu in (0, 1):
        mine = sorted((t.datetime_start, t.datetime_complete) for t in trials
                      if t.user_attrs[names.GPU] == gpu)
        busy = sum((b - a).total_seconds() for a, b in mine)  # one trial per GPU: no overlap
        row = s.gpus[s.gpus["gpu"] == gpu].iloc[0]
        assert row["trials"] == len(mine)
        assert row["busy_fraction"] == pytest.approx(busy / wall.total_seconds(), rel=1e-6)
        assert row["util_mean_busy"] == {0: 40, 1: 80}[gpu]
        assert row["idle_gpu_hours"] == pytest.approx((wall.total_seconds() - busy) / 3600)


def test_busy_time_is_the_union_of_overlapping_trials():
    t0 = pd.Timestamp("2026-01-01 00:00:00")
    sec = pd.Timedelta(seconds=1)
    trials = pd.DataFrame({
        "gpu": pd.array([0, 0, 1], dtype="Int64"),
        "datetime_start": [t0, t0 + 5 * sec, t0],
        "datetime_complete": [t0 + 10 * sec, t0 + 20 * sec, t0 + 5 * sec],
    })
    table = summary.gpu_table(trials, summary.read_samples(pd.io.common.Path("/nonexistent")))
    g0, g1 = table.iloc[0], table.iloc[1]
    assert g0["busy_s"] == 20 and g0["busy_fraction"] == 1.0
    assert g1["busy_s"] == 5 and g1["busy_fraction"] == 0.25
    assert g1["idle_gpu_hours"] == pytest.approx(15 / 3600)
    assert math.isnan(g0["util_mean_busy"])


def test_a_gpu_still_holding_a_trials_process_is_cleaned_then_quarantined(monkeypatch,
                                                                         write_study, capsys):
    import subprocess
    import sys

    from sweep.trial import process

    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gpus = [FakeGpu(uuid="GPU-a", processes=[(leftover.pid, 2**30)]), FakeGpu(uuid="GPU-b")]
    fake_pynvml.install(monkeypatch, gpus)
    real_seen = process.TrialProcess.seen_pids
    monkeypatch.setattr(process.TrialProcess, "seen_pids", property(
        lambda self: real_seen.fget(self) | {leftover.pid}))
    # the fake shows the "leftover" from the start: it is the trials', not another user's
    study = write_study(study={"n_trials": 4}, gpus={"skip_busy": False})
    try:
        assert run_cli("run", str(study)) == 0
        assert leftover.wait(timeout=5) == -9  # the driver killed the trial's GPU process
    finally:
        leftover.kill()
    err = capsys.readouterr().err
    # the fake still lists the pid after the kill: the device leaves the pool, with a warning
    assert "GPU 0 taken out of the pool" in err
    trials = load_trials(study)
    assert [t.user_attrs[names.GPU] for t in trials].count(0) == 1
    assert all(t.state.name == "COMPLETE" for t in trials)
