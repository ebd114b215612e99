"""Sick devices: the verdicts (pure), NVML's Xid events and counters on the fake pynvml, and
the driver's loop taking a device out and running its trials' params again elsewhere."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from conftest import load_trials, run_cli

from sweep._core import names
from sweep.gpus import health, sicklist
from sweep.gpus.health import FailingDevices, Kind, Sick
from sweep.gpus.hostlock import lock_dir
from sweep.gpus.nvml import Counters, Nvml
from sweep.study.ownership import host_name
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep

CUDA_CRASH = ("Traceback (most recent call last):\n  File \"train.py\", line 9\n"
              "RuntimeError: CUDA error: an illegal memory access was encountered\n")
OOM_CRASH = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"

# ---- verdicts -------------------------------------------------------------------------------


def test_xids_a_program_causes_do_not_make_a_card_sick():
    assert health.xid_verdict([]) is None
    assert health.xid_verdict([13, 31, 43, 45]) is None
    assert health.xid_verdict([45, 79]) == (
        "critical Xid 79 (GPU has fallen off the bus) reported by NVML")
    assert health.xid_verdict([999]) == "critical Xid 999 reported by NVML"


def test_counters_that_need_a_reset_make_a_card_sick():
    assert health.counters_verdict(Counters()) is None  # a card that cannot say
    assert health.counters_verdict(Counters(0, False, False, False)) is None
    assert health.counters_verdict(Counters(ecc_uncorrected=1)) == (
        "1 uncorrectable (double-bit) ECC error since the driver loaded")
    assert health.counters_verdict(Counters(ecc_uncorrected=3)).startswith(  # type: ignore[union-attr]
        "3 uncorrectable (double-bit) ECC errors")
    assert health.counters_verdict(Counters(retired_pending=True)) == (
        "memory pages are pending retirement (reset the GPU)")
    assert health.counters_verdict(Counters(remap_pending=True)) == (
        "memory rows are pending remapping (reset the GPU)")
    assert health.counters_verdict(Counters(remap_failed=True)) == (
        "a memory row could not be remapped (the card needs service)")


WHY_1 = ("2 trials in a row failed on it with a CUDA error (not out of memory) while trials on "
         "GPU 0 completed")


def test_two_cuda_failures_in_a_row_while_another_device_works():
    watch: FailingDevices[str] = FailingDevices()
    assert watch.seen([1], Kind.CUDA_ERROR, "a") == []
    assert watch.seen([1], Kind.CUDA_ERROR, "b") == []  # no other device worked since "a"
    assert watch.seen([0], Kind.WORKED, "c") == [Sick(1, WHY_1, ("a", "b"))]
    assert watch.seen([1], Kind.CUDA_ERROR, "d") == []  # said once
    assert watch.forget(1) == ("a", "b", "d")


def test_a_streak_is_broken_by_anything_else_on_that_device_and_old_work_does_not_count():
    watch: FailingDevices[str] = FailingDevices()
    watch.seen([0], Kind.WORKED, "w")  # before the streak: says nothing of it
    watch.seen([1], Kind.CUDA_ERROR, "a")
    watch.seen([1], Kind.OTHER, "oom")  # out of memory, or the trainer's own error
    assert watch.seen([1], Kind.CUDA_ERROR, "b") == []
    watch.seen([1], Kind.CUDA_ERROR, "c")
    assert watch.seen([0, 2], Kind.WORKED, "w2") == [Sick(1, WHY_1, ("b", "c"))]


def test_failures_on_every_device_take_none_out():
    watch: FailingDevices[int] = FailingDevices()
    for n in range(6):
        assert watch.seen([n % 2], Kind.CUDA_ERROR, n) == []
    assert watch.forget(0) == (0, 2, 4)


# ---- NVML on the fake pynvml ----------------------------------------------------------------


def test_xid_events_are_read_per_gpu_once_listening(monkeypatch):
    gpus = [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", events=False),
            FakeGpu(uuid="GPU-c", mig=[FakeGpu(uuid="MIG-c0")])]
    fake_pynvml.install(monkeypatch, gpus)
    nvml = Nvml()
    fake_pynvml.xid(gpus[0], 79)  # before listening: not seen, as in NVML
    assert nvml.critical_xids(0) == [] and nvml.critical_xids(1) == []
    assert nvml.critical_xids(3000) == []  # MIG instance 0 of GPU 2: its GPU's events
    fake_pynvml.xid(gpus[0], 45)
    fake_pynvml.xid(gpus[0], 48)
    fake_pynvml.xid(gpus[1], 79)  # this card gives no events
    fake_pynvml.xid(gpus[2], 94)
    assert nvml.critical_xids(0) == [45, 48]
    assert nvml.critical_xids(0) == []
    assert nvml.critical_xids(1) == []
    assert nvml.critical_xids(3000) == [94]
    nvml.close()
    assert fake_pynvml._state.event_sets == []  # every set freed


def test_memory_counters_are_read_and_unsupported_is_none(monkeypatch):
    gpus = [FakeGpu(uuid="GPU-a", ecc_uncorrected=2, retired_pending=1,
                    remapped_rows=(0, 1, 1, 0)),
            FakeGpu(uuid="GPU-b", ecc_uncorrected=None, retired_pending=None,
                    remapped_rows=None)]
    fake_pynvml.install(monkeypatch, gpus)
    nvml = Nvml()
    assert nvml.counters(0) == Counters(2, True, True, False)
    assert nvml.counters(1) == Counters()
    nvml.close()


def test_sweep_gpus_shows_sick_cards_and_those_a_sweep_took_out(monkeypatch, capsys):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_pynvml.install(monkeypatch, [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b"),
                                      FakeGpu(uuid="GPU-c", ecc_uncorrected=2)])
    sicklist.mark(lock_dir(host_name()), "GPU-b", 1, "critical Xid 79 (GPU has fallen off "
                  "the bus) reported by NVML")
    monkeypatch.setenv("COLUMNS", "300")
    assert run_cli("gpus") == 0
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.count("│") > 3}
    assert "sick" not in rows["0"] and "taken out" not in rows["0"]
    assert f"taken out by sweep pid {os.getpid()} at " in rows["1"]
    assert "critical Xid 79 (GPU has fallen off the bus)" in rows["1"]
    assert "no: sick: 2 uncorrectable (double-bit) ECC errors since the driver loaded" in rows["2"]


def test_a_device_taken_out_is_given_back_by_sweep_gpus_clear_or_after_max_age(monkeypatch,
                                                                               capsys):
    """Issue 32: the sick-device record was never cleared, and no documented way gave a
    repaired card back."""
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_pynvml.install(monkeypatch, [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    folder = lock_dir(host_name())
    sicklist.mark(folder, "GPU-a", 0, "critical Xid 79")
    sicklist.mark(folder, "GPU-b", 1, "critical Xid 48")
    assert sorted(sicklist.marks(folder)) == ["GPU-a", "GPU-b"]
    later = time.time() + sicklist.MAX_AGE + 1
    assert sicklist.marks(folder, now=later) == {}  # the record expires
    monkeypatch.setenv("COLUMNS", "300")
    assert run_cli("gpus", "--clear", "1") == 0
    out = capsys.readouterr().out
    assert "GPU 1: its sick record is cleared" in out
    assert list(sicklist.marks(folder)) == ["GPU-a"]
    assert run_cli("gpus", "--clear", "7") == 2
    assert "sweep gpus --clear: no device '7' in this pool" in capsys.readouterr().err
    assert run_cli("gpus", "--clear", "all") == 0 and sicklist.marks(folder) == {}


# ---- the loop ---------------------------------------------------------------------------------


def by_device(s: Sweep, scripts: dict[str, list[Script]], default: Script) -> None:
    """Each device's trials follow its list of scripts in turn, then `default`."""
    def script(params: dict) -> Script:
        queue = scripts.get(s.spawn.plan.env["CUDA_VISIBLE_DEVICES"], [])
        return queue.pop(0) if queue else default
    s.spawn.script = script


def said(s: Sweep) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    s.driver.events.message = lambda text: out.append((s.clock.t, text))  # type: ignore[method-assign]
    return out


def test_two_cuda_failures_in_a_row_take_a_device_out_and_its_trials_run_elsewhere(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(), gpus=2,
              study={"n_trials": 4, "max_consecutive_failures": 2})
    crash = Script(runs=0.4, code=1, stderr=CUDA_CRASH, result=None)
    by_device(s, {"1": [crash, crash]}, Script(runs=0.5))
    messages = said(s)
    assert s.run() == 0
    assert messages == [
        (pytest.approx(0.8), f"GPU 1 taken out of the pool: {WHY_1}"),
        # each runs again as its lineage's continuation (no retry spent; nothing saved yet)
        (pytest.approx(1.0), "trial 4 continues trial 1 (attempt 1 of trial 1) from scratch"),
        (pytest.approx(1.5), "trial 5 continues trial 2 (attempt 1 of trial 2) from scratch")]
    assert s.pool.quarantined == {1: WHY_1}
    failed = [t for t in s.trials if t.state.name == "FAIL"]
    assert [t.user_attrs[names.GPU] for t in failed] == [1, 1]
    assert failed[0].user_attrs[names.FAIL_REASON].endswith(
        "RuntimeError: CUDA error: an illegal memory access was encountered")
    done = [t for t in s.trials if t.state.name == "COMPLETE"]
    assert len(done) == 4 and {t.user_attrs[names.GPU] for t in done} == {0}
    again = {t.user_attrs.get(names.RETRY_OF): t.params for t in done
             if names.RETRY_OF in t.user_attrs}
    assert again == {t.number: t.params for t in failed}  # each one's params, run again
    assert [t.user_attrs[names.RETRIES] for t in done if names.RETRY_OF in t.user_attrs] == [0, 0]
    assert s.driver.policy.streak == 0


def test_out_of_memory_twice_does_not_take_a_device_out(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(), gpus=2,
              study={"n_trials": 4, "max_consecutive_failures": 3})
    oom = Script(runs=0.4, code=1, stderr=OOM_CRASH, result=None)
    by_device(s, {"1": [oom, oom]}, Script(runs=0.5))
    messages = said(s)
    assert s.run() == 0
    assert messages == [] and s.pool.quarantined == {}
    assert [t.user_attrs[names.GPU] for t in s.trials if t.state.name == "FAIL"] == [1, 1]
    assert 1 in {t.user_attrs[names.GPU] for t in s.trials if t.state.name == "COMPLETE"}
    assert not any(names.RETRY_OF in t.user_attrs for t in s.trials)


def xid_sweep(tmp_path, monkeypatch, gpus: list[FakeGpu], **sections) -> Sweep:
    """A sweep on the fake NVML whose monitor samples every 0.5 s of the fake clock."""
    fake_pynvml.install(monkeypatch, gpus)
    nvml = Nvml()
    s = Sweep(tmp_path, lambda p: Script(), gpus=len(gpus), reader=nvml, **sections)
    monitor = s.driver.monitor
    assert monitor is not None
    monitor.start = monitor.create_csv  # type: ignore[method-assign]  # no thread: the clock
    for k in range(200):
        s.clock.at(0.25 + 0.5 * k, monitor.sample_once)
    return s


def test_an_xid_takes_the_device_out_within_a_sample_and_its_trials_run_again(
        tmp_path, monkeypatch):
    gpus = [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")]
    s = xid_sweep(tmp_path, monkeypatch, gpus, study={"n_trials": 3})
    crash = Script(runs=0.5, code=1, stderr=CUDA_CRASH, result=None)
    by_device(s, {"1": [crash]}, Script(runs=2.0))
    s.clock.at(1.0, lambda: fake_pynvml.xid(gpus[0], 45))  # a killed program's: nothing
    s.clock.at(1.1, lambda: fake_pynvml.xid(gpus[1], 79))
    messages = said(s)
    assert s.run() == 0
    why = "critical Xid 79 (GPU has fallen off the bus) reported by NVML"
    assert messages == [
        (pytest.approx(1.25), f"GPU 1 taken out of the pool: {why}"),
        (pytest.approx(1.25), "trial 2 failed on a GPU taken out of the pool: queued to "
         "continue (same params, its checkpoint folder)"),
        (pytest.approx(2.0), "trial 3 continues trial 1 (attempt 1 of trial 1) from scratch"),
        (pytest.approx(4.0), "trial 4 continues trial 2 (attempt 1 of trial 2) from scratch")]
    first, second, third = s.trials[:3]
    assert first.state.name == "COMPLETE" and first.user_attrs[names.GPU] == 0
    assert second.state.name == "FAIL" and second.user_attrs[names.GPU] == 1  # the CUDA crash
    assert third.state.name == "FAIL" and third.user_attrs[names.GPU] == 1  # running at the Xid
    assert third.user_attrs[names.FAIL_REASON] == f"GPU 1 was taken out of the pool: {why}"
    done = [t for t in s.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and {t.user_attrs[names.GPU] for t in done} == {0}
    assert {t.user_attrs.get(names.RETRY_OF) for t in done} == {None, 1, 2}
    assert s.driver.policy.streak == 0  # neither failure counted


def test_a_pool_that_loses_every_device_stops_the_run_in_one_line(tmp_path, monkeypatch):
    gpus = [FakeGpu(uuid="GPU-a")]
    s = xid_sweep(tmp_path, monkeypatch, gpus, study={"n_trials": 3})
    s.spawn.script = lambda p: Script(runs=2.0)
    s.clock.at(3.0, lambda: setattr(gpus[0], "ecc_uncorrected", 1))
    result = s.driver.run()
    why = "1 uncorrectable (double-bit) ECC error since the driver loaded"
    assert result.exit_code == 1
    assert result.message == (f"no GPU left in the pool (taken out: GPU 0: {why}); "
                              "1/3 trials finished")


@pytest.mark.slow
def test_a_real_sweep_on_fake_nvml_loses_a_card_to_an_xid_and_finishes(
        monkeypatch, write_study, tmp_path):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")]
    fake_pynvml.install(monkeypatch, gpus)
    study = write_study(study={"n_trials": 3}, trainer={"args": ["--sleep", "2"]},
                        gpus={"sample_interval": 0.2, "skip_busy": False})
    trials = tmp_path / "probe" / "trials"

    over = threading.Event()

    def xid_once_a_trial_runs_on_gpu_b() -> None:
        while not any(json.loads(f.read_text())["cvd"] == "GPU-b"
                      for f in trials.glob("*/probe_start.json") if f.stat().st_size):
            if over.wait(0.05):
                return
        fake_pynvml.xid(gpus[1], 79)

    threading.Thread(target=xid_once_a_trial_runs_on_gpu_b, daemon=True).start()
    try:
        assert run_cli("run", str(study)) == 0
    finally:
        over.set()
    done = load_trials(study)
    on_b = [t for t in done if t.user_attrs[names.GPU] == 1]
    assert [t.state.name for t in on_b] == ["FAIL"]
    assert on_b[0].user_attrs[names.FAIL_REASON] == (
        "GPU 1 was taken out of the pool: critical Xid 79 (GPU has fallen off the bus) "
        "reported by NVML")
    complete = [t for t in done if t.state.name == "COMPLETE"]
    assert len(complete) == 3 and {t.user_attrs[names.GPU] for t in complete} == {0}
    assert any(t.user_attrs.get(names.RETRY_OF) == on_b[0].number for t in complete)
    assert list(sicklist.marks(lock_dir(host_name()))) == ["GPU-b"]


@pytest.mark.parametrize(("stderr", "cuda"), [
    (CUDA_CRASH, True),
    ("RuntimeError: CUDA error: unspecified launch failure\n", True),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered\n", True),
    (OOM_CRASH, False),  # out of memory: its own verdict, never the card's
    ("RuntimeError: CUDA error: device-side assert triggered\n", False),  # the program's
    ("ValueError: bad lr\n", False),
    # issue 32: judged by the error it died of, not by words it printed along the way
    ("checking for ECC errors on the card: none\nTraceback (most recent call last):\n"
     '  File "t.py", line 3, in <module>\n    raise ValueError("bad lr")\n'
     "ValueError: bad lr\n", False),
    ("warning: CUDA error: unspecified launch failure seen once, retried\n"
     "ValueError: bad lr\n", True),  # no traceback: its last lines are all there is
    ("Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
     "RuntimeError: CUDA error: an illegal memory access was encountered\n"
     "CUDA kernel errors might be asynchronously reported at some other API call\n\n"
     "Traceback (most recent call last):\n  File \"run.py\", line 2, in <module>\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED\n",
     True),  # a rank's CUDA error, before the launcher's own traceback
])
def test_which_crashes_are_cuda_errors_that_may_be_the_cards(stderr, cuda):
    from sweep.trial.outcome import judge

    verdict = judge(1, stderr, None, ["score"])
    assert verdict.state.name == "FAIL" and verdict.cuda_error is cuda
    assert verdict.oom is (stderr == OOM_CRASH)


def test_forgiven_failures_leave_the_streak_others_stay():
    from optuna.trial import TrialState

    from sweep.runner.policy import Policy

    policy = Policy(n_trials=10, max_consecutive_failures=3)
    policy.after(TrialState.FAIL, 0, number=1)
    policy.after(TrialState.FAIL, 0, number=2)
    policy.forgive({1, 7})
    assert (policy.streak, policy.streak_of) == (1, [2])
    assert policy.after(TrialState.FAIL, 0, number=3).give_up is None  # 2 of 3, not 3
    assert policy.after(TrialState.FAIL, 0, device_fault=True, number=4).retry
    assert (policy.streak, policy.streak_of) == (2, [2, 3])  # a device's fault is not counted
