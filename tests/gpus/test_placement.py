"""Placement beyond slot counts (issue 11): cards others use, memory promised to trials,
`gpu_memory_gb: auto`, devices that ran out of memory, a sweep that can never start, UUID
pinning. Pool decisions with a fake probe; the sweep end to end on the fake NVML."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterable
from typing import Any

import pytest
from conftest import load_trials, run_cli, wait_until

from sweep._core import names
from sweep.gpus import placement
from sweep.gpus.monitor import Monitor, NoReader, NvmlProbe
from sweep.gpus.nvml import Nvml
from sweep.gpus.placement import DeviceLook, Held, Refusal, Why
from sweep.gpus.pool import Device, Lease, Pool, Rules
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu
from sweep.testing.fakes import Script, lease
from sweep.testing.harness import Sweep

GB = 1024.0


class FakeProbe:
    """Devices as the pool would see them through NVML; edit `looks` between calls."""

    def __init__(self, looks: dict[int, DeviceLook], sweeps: Iterable[int] = ()) -> None:
        self.looks, self.sweeps = looks, set(sweeps)

    def look(self, index: int) -> DeviceLook | None:
        return self.looks[index]

    def closeness(self, a: int, b: int) -> int:
        return 100

    def sweep_pids(self, pids: Iterable[int]) -> tuple[set[int], set[int]]:
        pids = set(pids)
        return pids & self.sweeps, pids


def devices(n: int) -> list[Device]:
    return [Device(i, "H200", f"GPU-{i}", 141 * GB) for i in range(n)]


def idle(total_gb: float = 141) -> DeviceLook:
    return DeviceLook(total_gb * GB, 300.0, {})


def test_a_card_others_use_is_left_out_and_taken_back_once_freed():
    probe = FakeProbe({0: DeviceLook(141 * GB, 20 * GB, {4242: 20 * GB}), 1: idle()})
    pool = Pool(devices(2), 1, probe=probe, rules=Rules(skip_busy=True))
    assert lease(pool, 1).device == 1  # GPU 0 is a colleague's
    busy = Refusal(Why.IN_USE_BY_OTHERS, "in use by others (pid 4242)")
    assert pool.out == {0: busy} and pool.left_out() == {0: busy.text}
    assert pool.acquire() == Refusal(Why.BLOCKED, f"GPU 0: {busy.text}")
    probe.looks[0] = idle()  # the colleague's job ended
    assert lease(pool, 2).device == 0 and pool.out == {} and pool.left_out() == {}


def test_memory_in_use_with_no_process_shown_is_busy_unless_a_sweep_holds_the_card():
    probe = FakeProbe({0: DeviceLook(141 * GB, 5000.0, {}), 1: idle()})
    pool = Pool(devices(2), 2, probe=probe, rules=Rules(skip_busy=True, busy_memory_mb=1024))
    assert lease(pool, 1).device == 1 and pool.out[0] == Refusal(
        Why.IN_USE_BY_OTHERS, "in use by others (5000 MB used, over gpus.busy_memory_mb)")
    probe.looks[1] = DeviceLook(141 * GB, 30 * GB, {777: None})  # our trial's own memory and pid
    probe.sweeps = {777}
    assert lease(pool, 2).device == 1  # its own trial's memory does not make a card busy


def test_processes_of_other_sweeps_on_this_host_do_not_make_a_card_busy():
    probe = FakeProbe({0: DeviceLook(141 * GB, 9 * GB, {555: 9 * GB})}, sweeps={555})
    pool = Pool(devices(1), 2, probe=probe, rules=Rules(skip_busy=True))
    assert lease(pool, 1).device == 0


def test_with_skip_busy_off_a_busy_card_is_used():
    probe = FakeProbe({0: DeviceLook(141 * GB, 20 * GB, {4242: 20 * GB})})
    assert lease(Pool(devices(1), 1, probe=probe, rules=Rules(skip_busy=False)), 1).device == 0


def test_memory_promised_to_running_trials_is_respected():
    """40 GB per trial on a 141 GB card: the promises fill it, not what NVML shows yet."""
    probe = FakeProbe({0: idle()})
    pool = Pool(devices(1), 16, probe=probe, rules=Rules(want_mb=40 * GB))
    held = [lease(pool, n) for n in range(3)]
    assert [x.device for x in held] == [0, 0, 0]
    # 141 - 0.3 - 3 x 40 promised = 20.7 GB < 40; ours will end: waited for, not "out"
    full = Refusal(Why.NO_FREE_MEMORY, "21204 MB free for a trial that needs 40960 MB")
    assert pool.acquire() == Refusal(Why.BLOCKED, f"GPU 0: {full.text}")
    assert pool.verdicts[0] == full and pool.out == {}
    for x in held:  # the trials allocated what they were promised
        x.used_mb[0] = 40 * GB
    probe.looks[0] = DeviceLook(141 * GB, 120.3 * GB, {})
    assert not isinstance(pool.acquire(), Lease)
    pool.release(held[0])
    probe.looks[0] = DeviceLook(141 * GB, 80.3 * GB, {})
    assert lease(pool, 3).device == 0


def test_a_device_smaller_than_a_trial_stops_the_sweep_at_once():
    probe = FakeProbe({0: idle(80), 1: idle(80)})
    pool = Pool(devices(2), 16, probe=probe, rules=Rules(want_mb=100 * GB))
    refusal = pool.acquire()
    assert isinstance(refusal, Refusal) and refusal.kind is Why.NEVER and refusal.permanent
    assert refusal.text == (
        "no device can ever take a trial: GPU 0: 81920 MB in all, a trial needs 102400 MB; "
        "GPU 1: 81920 MB in all, a trial needs 102400 MB (lower trainer.gpu_memory_gb, or "
        "use cards with more memory)")


def test_cards_all_in_use_by_others_stop_the_sweep_after_a_while_never_forever():
    now = [0.0]
    probe = FakeProbe({0: DeviceLook(141 * GB, GB, {1: GB}), 1: DeviceLook(141 * GB, GB, {2: GB})})
    pool = Pool(devices(2), 1, probe=probe, rules=Rules(skip_busy=True, hopeless_after=10),
                clock=lambda: now[0])
    waiting = Refusal(Why.BLOCKED, "GPU 0: in use by others (pid 1); "
                      "GPU 1: in use by others (pid 2)")
    assert pool.acquire() == waiting  # a colleague's job may end soon
    now[0] = 9.9
    assert pool.acquire() == waiting
    now[0] = 10.0
    assert pool.acquire() == Refusal(Why.GIVE_UP, (
        "no device can take a trial: GPU 0: in use by others (pid 1); GPU 1: in use by others "
        "(pid 2) (gpus.skip_busy: false shares cards with others; gpus.busy_memory_mb sets "
        "what counts as in use)"))
    probe.looks[1] = idle()  # freed: the wait starts again
    freed = pool.acquire()
    assert isinstance(freed, Lease) and freed.device == 1
    pool.release(freed)
    probe.looks[1] = DeviceLook(141 * GB, GB, {2: GB})
    now[0] = 19.9
    assert pool.acquire() == waiting


def test_a_device_that_ran_out_of_memory_takes_no_trial_until_one_of_its_trials_ends():
    pool = Pool(devices(2), 4)
    held = [lease(pool, n) for n in range(3)]
    assert [x.device for x in held] == [0, 1, 0]
    pool.release(held[2], oom=True)  # trial 2 ran out of memory on GPU 0, beside trial 0
    assert [lease(pool, n).device for n in (3, 4)] == [1, 1]
    assert pool.verdicts[0] == Refusal(
        Why.OOM_BLOCKED, "a trial ran out of memory here; waiting for memory to be freed")
    pool.release(held[0])  # memory freed on GPU 0
    fifth = lease(pool, 5)
    assert fifth.device == 0
    pool.release(fifth, oom=True)  # alone on it: nothing to wait for, nothing blocked
    assert 0 not in pool.oom_blocked


def test_auto_runs_one_trial_per_device_until_a_peak_is_known():
    probe = FakeProbe({0: idle()})
    pool = Pool(devices(1), 16, probe=probe, rules=Rules(alone=True))
    assert lease(pool, 1).device == 0
    assert pool.acquire() == Refusal(
        Why.BLOCKED, "GPU 0: one trial per device until a trial's peak memory is known")
    pool.expect(placement.learned_mb([10 * GB]))
    assert (pool.rules.want_mb, pool.rules.alone) == (10 * GB * 1.2 + 512, False)
    assert [lease(pool, n).device for n in range(2, 12)] == [0] * 10  # 141 / 12.5 GB: 11
    assert not isinstance(pool.acquire(), Lease)


@pytest.mark.parametrize(("peaks", "expected"), [
    ([], None), ([math.nan], None), ([1000.0, 2000.0], 2000 * 1.2 + 512),
])
def test_auto_promises_the_largest_peak_with_a_margin(peaks, expected):
    assert placement.learned_mb(peaks) == expected


def test_outstanding_memory_is_what_was_promised_and_not_yet_allocated():
    assert placement.outstanding([Held(100, None), Held(100, 30), Held(100, 150)]) == 170


def test_auto_packs_after_the_first_trial_in_the_driver(tmp_path):
    """The first trial runs alone on its device; once its peak is measured, trials pack."""

    class MemoryReader(NoReader):
        """NVML that shows each live trial using 10 GB on its device."""

        def __init__(self, sweep: Sweep) -> None:
            self.sweep = sweep

        def read(self, index: int) -> Any:
            from sweep.gpus.nvml import GpuReading

            used = 10 * GB * len(self.compute_processes(index))
            return GpuReading(0.0, 0.0, used, 141 * GB, math.nan)

        def compute_processes(self, index: int) -> dict[int, float | None]:
            return {p.pid: 10 * GB for p in self.sweep.spawn.processes if not p.ended
                    and int(p.plan.env["CUDA_VISIBLE_DEVICES"]) == index}

    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=1, study={"n_trials": 6},
              trainer={"gpu_memory_gb": "auto"}, reader=NoReader())
    reader = MemoryReader(s)
    s.pool.capacity = 16
    s.pool.probe = NvmlProbe(reader)
    s.driver.monitor.reader = reader  # type: ignore[union-attr]
    s.driver.devices.learns = True
    monitor: Monitor = s.driver.monitor  # type: ignore[assignment]
    s.clock.at(0.5, monitor.sample_once)  # the first trial's peak: 10 GB
    assert s.run() == 0
    starts = sorted(p.started for p in s.spawn.processes)
    assert starts == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # alone, then the other five together


# ---- end to end on the fake NVML ---------------------------------------------------------


@pytest.fixture
def nvml_gpus(monkeypatch):
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(uuid="GPU-aaaa-0000"), FakeGpu(uuid="GPU-bbbb-1111")]
    fake_pynvml.install(monkeypatch, gpus)
    return gpus


def pinned(study: Any) -> dict[int, tuple[str, str]]:
    """Each trial's device (as stored) -> (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER) it saw."""
    seen = {}
    for t in load_trials(study):
        record = json.loads((study.parent / "probe" / "trials" / str(t.number) /
                             "probe.json").read_text())
        seen[t.user_attrs[names.GPU]] = (record["cvd"], record["order"])
    return seen


def test_trials_are_pinned_by_uuid_and_the_summary_shows_the_index(write_study, nvml_gpus):
    from sweep.analysis import summary

    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study)) == 0
    assert pinned(study) == {0: ("GPU-aaaa-0000", "PCI_BUS_ID"),
                             1: ("GPU-bbbb-1111", "PCI_BUS_ID")}
    assert sorted(summary.load(study).trials["gpu"]) == [0, 1]


def test_a_sweep_leaves_a_colleagues_card_alone(write_study, nvml_gpus, capsys):
    colleague = subprocess.Popen(["sleep", "60"])  # a process of no sweep
    try:
        nvml_gpus[0].processes = [(colleague.pid, 20 * 2**30)]
        nvml_gpus[0].memory_used = 20 * 2**30
        study = write_study(study={"n_trials": 3})
        assert run_cli("run", str(study)) == 0
    finally:
        colleague.kill()
        colleague.wait()
    assert [t.user_attrs[names.GPU] for t in load_trials(study)] == [1, 1, 1]
    assert f"GPU 0 left out: in use by others (pid {colleague.pid})" in capsys.readouterr().err


def test_a_trial_bigger_than_every_card_stops_the_sweep_with_one_line(write_study, nvml_gpus,
                                                                      capsys):
    study = write_study(study={"n_trials": 3}, trainer={"gpu_memory_gb": 200})
    assert run_cli("run", str(study)) == 1
    err = capsys.readouterr().err
    assert "no device can ever take a trial: GPU 0: 144384 MB in all, a trial needs " \
           "204800 MB" in err
    assert load_trials(study) == []  # nothing was asked


def test_the_probe_tells_sweep_trials_from_other_processes(tmp_path):
    import os
    import sys

    import psutil

    plain = subprocess.Popen(["sleep", "30"])
    trial = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "SWEEP_TRIAL_DIR": str(tmp_path)})
    try:  # until exec, a child shows its parent's environment
        assert wait_until(lambda: "SWEEP_TRIAL_DIR" in psutil.Process(trial.pid).environ(), 10)
        sweeps, visible = NvmlProbe(NoReader()).sweep_pids({plain.pid, trial.pid, 999_999_999})
        assert sweeps == {trial.pid} and visible == {plain.pid, trial.pid}
    finally:
        for p in (plain, trial):
            p.kill()
            p.wait()


def test_the_probe_reads_memory_and_processes_through_nvml(monkeypatch):
    fake_pynvml.install(monkeypatch, [FakeGpu(memory_used=2**30, processes=[(7, 2**30)])])
    nvml = Nvml()
    try:
        look = NvmlProbe(nvml).look(0)
    finally:
        nvml.close()
    assert look == DeviceLook(141 * 1024, 1024, {7: 1024})


# ---- multi-GPU trials ----------------------------------------------------------------------


class Topology(FakeProbe):
    """Four idle cards; NVLink joins 0-2 and 1-3."""

    def __init__(self) -> None:
        super().__init__({i: idle() for i in range(4)})

    def closeness(self, a: int, b: int) -> int:
        return 0 if {a, b} in ({0, 2}, {1, 3}) else 50


def test_a_two_gpu_trial_gets_two_devices_joined_by_nvlink_where_there_are():
    pool = Pool(devices(4), 1, probe=Topology(), width=2)
    assert pool.slots == 2
    first, second = lease(pool, 1), lease(pool, 2)
    assert (first.devices, second.devices) == ((0, 2), (1, 3))
    assert first.pins == ("GPU-0", "GPU-2")
    assert pool.acquire() == Refusal(Why.FULL, "devices full")
    assert {i: [x.trial for x in leases] for i, leases in pool.holders().items()} == {
        0: [1], 1: [2], 2: [1], 3: [2]}
    pool.release(first)
    assert lease(pool, 3).devices == (0, 2)


def test_without_topology_a_wide_trial_takes_the_least_loaded_devices():
    pool = Pool(devices(3), 2, width=2)
    held = [lease(pool, n) for n in (1, 2, 3)]
    assert [x.devices for x in held] == [(0, 1), (2, 0), (1, 2)]
    pool.release(held[0])  # GPUs 0 and 1 have a slot each again; 2 is full
    assert lease(pool, 4).devices == (0, 1)
    assert not isinstance(pool.acquire(), Lease)


def test_a_trial_wider_than_the_pool_stops_the_sweep_at_once():
    pool = Pool(devices(2), 1, width=4)
    assert pool.acquire() == Refusal(
        Why.NEVER, "trainer.gpus_per_trial is 4, the pool has 2 usable devices")


def test_two_concurrent_two_gpu_trials_get_their_own_devices_and_ports(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(runs=2.0), gpus=4, study={"n_trials": 2},
              trainer={"launcher": "accelerate", "gpus_per_trial": 2})
    assert s.run() == 0
    first, second = s.spawn.processes
    assert first.started == second.started == 0.0  # at the same time
    plans = [p.plan for p in (first, second)]

    def option(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    ids = [option(p.argv, "--gpu_ids") for p in plans]
    ports = [option(p.argv, "--main_process_port") for p in plans]
    assert ids == ["0,1", "2,3"] and [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ids
    assert ports[0] != ports[1] and [p.env["SWEEP_MAIN_PORT"] for p in plans] == ports
    assert all("--multi_gpu" in p.argv and option(p.argv, "--num_processes") == "2"
               for p in plans)
    assert [t.user_attrs[names.GPUS] for t in s.trials] == ["0,1", "2,3"]
    assert [t.user_attrs[names.GPU] for t in s.trials] == [0, 2]


def test_ports_are_leased_host_wide_and_freed_with_the_trial(tmp_path):
    import socket

    from sweep.gpus import hostlock

    a = hostlock.take_port(tmp_path, range(40100, 40110))
    b = hostlock.take_port(tmp_path, range(40100, 40110))
    assert a and b and a[0] != b[0]
    with socket.socket() as busy:  # something outside sweep listens on the next one
        busy.bind(("", 40102))
        busy.listen()
        c = hostlock.take_port(tmp_path, range(40100, 40110))
        assert c and c[0] == 40103
    a[1].release()
    d = hostlock.take_port(tmp_path, range(40100, 40110))
    assert d and d[0] == a[0]


# ---- MIG -----------------------------------------------------------------------------------


@pytest.fixture
def mig_gpus(monkeypatch):
    """GPU 0 in MIG mode with instances in slots 0 and 2; GPU 1 whole."""
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    instances: list[FakeGpu | None] = [
        FakeGpu(name="NVIDIA H200 MIG 3g.71gb", uuid="MIG-aaaa", memory_total=71 * 2**30),
        None,
        FakeGpu(name="NVIDIA H200 MIG 3g.71gb", uuid="MIG-cccc", memory_total=71 * 2**30),
    ]
    gpus = [FakeGpu(uuid="GPU-zero", mig=instances), FakeGpu(uuid="GPU-one")]
    fake_pynvml.install(monkeypatch, gpus)
    return gpus


def test_mig_instances_are_pool_members_of_their_own(mig_gpus):
    from sweep.gpus import pool

    found = pool.discover({})
    assert [(d.index, d.uuid, d.parent) for d in found] == [
        (1000, "MIG-aaaa", 0), (1002, "MIG-cccc", 0), (1, "GPU-one", None)]
    assert found[0].name == "NVIDIA H200 MIG 3g.71gb (GPU 0, MIG 0)"
    assert found[0].memory_total_mb == 71 * 1024
    assert [d.index for d in pool.discover({"CUDA_VISIBLE_DEVICES": "0"})] == [1000, 1002]
    assert [d.index for d in pool.discover({"CUDA_VISIBLE_DEVICES": "MIG-cccc,1"})] == [1002, 1]
    nvml = Nvml()
    try:
        reading = nvml.read(1002)  # a fresh session finds the instance by its pool id
        assert reading.mem_total_mb == 71 * 1024 and math.isnan(reading.util_gpu)
    finally:
        nvml.close()


def test_a_sweep_pins_each_trial_to_its_mig_instance(write_study, mig_gpus):
    study = write_study(study={"n_trials": 3})
    assert run_cli("run", str(study)) == 0
    assert {gpu: cvd for gpu, (cvd, _) in pinned(study).items()} == {
        1000: "MIG-aaaa", 1002: "MIG-cccc", 1: "GPU-one"}


# ---- the rules at work in a sweep -------------------------------------------------------------


def test_after_an_out_of_memory_the_device_waits_for_memory_before_another_trial(tmp_path):
    """Trial 1 runs out of memory beside trial 0; trial 2 waits for trial 0 to end."""
    calls = iter([Script(runs=3.0),
                  Script(runs=1.0, code=1, result=None,
                         stderr="torch.OutOfMemoryError: CUDA out of memory."),
                  Script(runs=1.0)])
    s = Sweep(tmp_path, lambda p: next(calls), gpus=1, study={"n_trials": 2})
    s.pool.capacity = 2  # gpus.trials_per_gpu: 2
    assert s.run() == 0
    starts = [p.started for p in s.spawn.processes]
    assert starts == [0.0, 0.0, 3.0]  # not at 1.0, when the out-of-memory trial ended
    assert s.trials[1].user_attrs[names.FAIL_REASON].startswith("out of memory")


@pytest.mark.slow
def test_a_card_freed_during_the_sweep_joins_it(write_study, nvml_gpus, capsys, tmp_path):
    """The colleague leaves GPU 0 once the sweep's first trial has started (a timer from the
    test's start let a slow start-up find the card free already)."""
    import threading

    colleague = subprocess.Popen(["sleep", "60"])
    nvml_gpus[0].processes = [(colleague.pid, 2**30)]
    over = threading.Event()

    def colleague_done_once_a_trial_runs() -> None:
        first = tmp_path / "probe" / "trials" / "0" / "probe_start.json"
        while not first.exists():
            if over.wait(0.05):
                return
        nvml_gpus[0].processes = []

    threading.Thread(target=colleague_done_once_a_trial_runs, daemon=True).start()
    try:
        study = write_study(study={"n_trials": 8}, trainer={"args": ["--sleep", "0.5"]})
        assert run_cli("run", str(study)) == 0
    finally:
        over.set()
        colleague.kill()
        colleague.wait()
    gpus = [t.user_attrs[names.GPU] for t in load_trials(study)]
    assert gpus[0] == 1 and 0 in gpus  # GPU 0 joined once its user was done
    err = capsys.readouterr().err
    assert "GPU 0 left out: in use by others" in err and "GPU 0 is free again" in err


@pytest.mark.slow
def test_memory_promised_to_trials_caps_how_many_share_a_card(write_study, monkeypatch):
    """60 GB per trial on one 141 GB card: two at a time, never three."""
    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_pynvml.install(monkeypatch, [FakeGpu(uuid="GPU-only")])
    study = write_study(study={"n_trials": 5}, trainer={"args": ["--sleep", "0.6"],
                                                        "gpu_memory_gb": 60})
    assert run_cli("run", str(study)) == 0
    spans = []
    for t in load_trials(study):
        record = json.loads((study.parent / "probe" / "trials" / str(t.number) /
                             "probe.json").read_text())
        spans.append((record["start"], record["end"]))
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    at_once, most = 0, 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    assert most == 2


def test_mig_instances_serve_one_device_trials_only(mig_gpus, write_study, capsys):
    study = write_study(study={"n_trials": 2}, trainer={"gpus_per_trial": 2})
    assert run_cli("run", str(study)) == 1
    err = capsys.readouterr().err
    assert "no device can ever take a trial: a trial needs 2 devices, 1 can take one now" in err
    assert "use whole GPUs for trainer.gpus_per_trial > 1" in err


def test_a_wide_trial_says_how_many_devices_it_needs(write_study, fake_gpus, capsys):
    fake_gpus(4)
    study = write_study(study={"n_trials": 2}, trainer={"gpus_per_trial": 5})
    assert run_cli("run", str(study)) == 1
    assert "trainer.gpus_per_trial is 5, the pool has 4 usable devices" in capsys.readouterr().err
    assert run_cli("run", str(study), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "the next 0 of 2 trials" in out and "gpus_per_trial is 5" in out


def test_a_dry_run_places_wide_trials_and_ports_as_a_run_would(write_study, fake_gpus, capsys):
    fake_gpus(4)
    study = write_study(study={"n_trials": 2}, trainer={"gpus_per_trial": 2})
    assert run_cli("run", str(study), "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for line in lines] == [
        "0,1", "2,3"]
    assert len({line.split("SWEEP_MAIN_PORT=")[1].split()[0] for line in lines}) == 2


def test_a_card_others_use_joins_the_sweep_once_freed_and_the_user_is_told(tmp_path):
    """The rule of `test_a_card_freed_during_the_sweep_joins_it`, on the fake clock: GPU 0 is
    left out while a colleague's process runs on it; the loop looks again every poll while
    blocked, and the first look after the colleague is done starts a trial there."""
    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=2, study={"n_trials": 4})
    probe = FakeProbe({0: DeviceLook(141 * GB, 20 * GB, {4242: 20 * GB}), 1: idle()})
    s.pool.probe, s.pool.rules.skip_busy = probe, True
    s.clock.at(1.5, lambda: probe.looks.update({0: idle()}))
    said: list[str] = []
    s.driver.events.message = said.append  # type: ignore[method-assign]
    assert s.run() == 0
    assert [p.started for p in s.spawn.processes] == [0.0, 1.0, 1.5, 2.0]
    assert [t.user_attrs[names.GPU] for t in s.trials] == [1, 1, 0, 1]
    assert said == ["GPU 0 left out: in use by others (pid 4242)",
                    "GPU 0 is free again: back in the pool"]
