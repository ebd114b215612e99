"""The GPU pool: NVML discovery (fake pynvml), the CUDA_VISIBLE_DEVICES boundary, leasing."""

from __future__ import annotations

import inspect

import pynvml as real_pynvml
import pytest

from sweep._core.errors import UsageError
from sweep.gpus import pool
from sweep.gpus.nvml import GpuInfo, Nvml, NvmlUnavailable
from sweep.gpus.placement import Refusal, Why
from sweep.testing import fake_pynvml
from sweep.testing.fake_pynvml import FakeGpu
from sweep.testing.fakes import lease

GPUS = [GpuInfo(i, "H200", f"GPU-{i}aaa-{i}", 143_000.0) for i in range(4)]


@pytest.mark.parametrize(("cvd", "expected"), [
    (None, [0, 1, 2, 3]),
    ("2,3", [2, 3]),
    ("3,1", [3, 1]),
    ("", []),
    ("-1", []),
    ("1,7,2", [1]),        # CUDA stops at the first invalid entry
    ("GPU-2aaa", [2]),     # a UUID prefix
    ("1, 1", [1]),
])
def test_cuda_visible_devices_bounds_the_pool(cvd, expected):
    assert [d.index for d in pool.visible(GPUS, cvd)] == expected


def test_fake_pool_needs_no_nvml(monkeypatch):
    fake_pynvml.install(monkeypatch, None)
    devices = pool.discover({"SWEEP_FAKE_GPUS": "3"})
    assert [d.index for d in devices] == [0, 1, 2] and all(d.simulated for d in devices)
    with pytest.raises(UsageError, match="whole number"):
        pool.discover({"SWEEP_FAKE_GPUS": "two"})


def test_discover_reads_nvml_within_cuda_visible_devices(monkeypatch):
    gpus = [FakeGpu(name=f"NVIDIA H200 #{i}", uuid=f"GPU-{i}{i}{i}") for i in range(6)]
    fake_pynvml.install(monkeypatch, gpus)
    devices = pool.discover({"CUDA_VISIBLE_DEVICES": "2,5"})
    assert [(d.index, d.name, d.uuid) for d in devices] == [
        (2, "NVIDIA H200 #2", "GPU-222"), (5, "NVIDIA H200 #5", "GPU-555")]
    assert devices[0].memory_total_mb == pytest.approx(141 * 1024)
    assert len(pool.discover({})) == 6


def test_no_driver_is_one_clear_error(monkeypatch):
    fake_pynvml.install(monkeypatch, None)
    with pytest.raises(NvmlUnavailable, match="NVML could not start"):
        Nvml()
    with pytest.raises(UsageError, match="SWEEP_FAKE_GPUS=N"):
        pool.discover({})


def test_nvml_figures_it_cannot_read_are_nan_not_invented(monkeypatch):
    gpu = FakeGpu(util_gpu=55, memory_used=2 * 2**30, power_mw=None, energy_mj=None,
                  processes=[(10, 2**30), (11, None)])
    fake_pynvml.install(monkeypatch, [gpu])
    nvml = Nvml()
    r = nvml.read(0)
    assert r.util_gpu == 55 and r.mem_used_mb == 2048
    assert r.power_w != r.power_w  # NaN
    assert nvml.energy_mj(0) is None
    assert nvml.compute_processes(0) == {10: 1024.0, 11: None}
    nvml.close()


def test_fake_pynvml_matches_the_real_api(monkeypatch):
    for name in fake_pynvml.API:
        real, fake = getattr(real_pynvml, name), getattr(fake_pynvml, name)
        assert list(inspect.signature(fake).parameters) == list(
            inspect.signature(real).parameters), name
    for cls in ("NVMLError_LibraryNotFound", "NVMLError_Uninitialized", "NVMLError_NotSupported",
                "NVMLError_NotFound", "NVMLError_DriverNotLoaded", "NVMLError_Timeout"):
        real, fake = getattr(real_pynvml, cls), getattr(fake_pynvml, cls)
        assert issubclass(fake, fake_pynvml.NVMLError)
        assert fake().value == real().value, cls
    for const in ("NVML_DEVICE_MIG_ENABLE", "NVML_P2P_CAPS_INDEX_NVLINK", "NVML_P2P_STATUS_OK",
                  "NVML_P2P_STATUS_NOT_SUPPORTED", "NVML_TOPOLOGY_SINGLE",
                  "NVML_TOPOLOGY_SYSTEM", "NVML_ERROR_TIMEOUT", "nvmlEventTypeXidCriticalError",
                  "nvmlEventTypeNone", "nvmlEventTypeSingleBitEccError",
                  "nvmlEventTypeDoubleBitEccError", "NVML_MEMORY_ERROR_TYPE_CORRECTED",
                  "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
                  "NVML_AGGREGATE_ECC", "NVML_FEATURE_ENABLED", "NVML_FEATURE_DISABLED"):
        assert getattr(fake_pynvml, const) == getattr(real_pynvml, const), const
    # an event has the fields of the real event data, in its order
    fields = [name for name, _ in real_pynvml.c_nvmlEventData_t._fields_]
    gpu = FakeGpu()
    fake = fake_pynvml.install(monkeypatch, [gpu])
    fake.nvmlInit()
    event_set = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(gpu, fake.nvmlEventTypeXidCriticalError, event_set)
    fake_pynvml.xid(gpu, 79)
    event = fake.nvmlEventSetWait(event_set, 0)
    assert list(vars(event)) == fields
    assert (event.device, event.eventType, event.eventData) == (
        gpu, real_pynvml.nvmlEventTypeXidCriticalError, 79)
    with pytest.raises(fake_pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(event_set, 0)
    assert len(fake.nvmlDeviceGetRemappedRows(gpu)) == 4  # as the real one: a 4-tuple
    fake.nvmlEventSetFree(event_set)
    assert type(fake_pynvml.NVMLError(12)) is fake_pynvml.NVMLError_LibraryNotFound
    assert type(real_pynvml.NVMLError(12)) is real_pynvml.NVMLError_LibraryNotFound


def test_select_checks_gpu_ids_against_the_pool():
    devices = pool.fake_devices("3")
    assert [d.index for d in pool.select(devices, [2, 0])] == [2, 0]
    assert pool.select(devices, "all") == devices
    with pytest.raises(UsageError, match=r"gpus.ids: \[5\] not in the pool"):
        pool.select(devices, [0, 5])
    with pytest.raises(UsageError, match="empty"):
        pool.select([], "all")


@pytest.mark.parametrize(("load", "capacity", "excluded", "expected"), [
    ({0: 0, 1: 0}, 1, set(), 0),
    ({0: 1, 1: 0}, 1, set(), 1),
    ({0: 1, 1: 1}, 1, set(), None),
    ({0: 1, 1: 0, 2: 0}, 2, {1}, 2),
    ({0: 1, 1: 2}, 2, set(), 0),     # least loaded first
    ({3: 0, 1: 0}, 1, set(), 1),     # lowest index on ties
])
def test_the_next_trial_goes_to_the_least_loaded_device_with_room(load, capacity, excluded,
                                                                  expected):
    assert (pool.ranked(load, capacity, excluded) or [None])[0] == expected


def test_pool_leases_and_releases():
    p = pool.Pool(pool.fake_devices("2"), capacity=1)
    assert p.slots == 2
    first, second = lease(p, 10), lease(p, 11)
    assert (first.device, second.device) == (0, 1)
    assert p.acquire() == Refusal(Why.FULL, "devices full")
    p.release(first)
    p.release(first)  # again: nothing happens
    third = lease(p, 12)
    assert third.device == 0
    p.release(second)
    p.quarantine(1, "full")
    assert p.acquire() == Refusal(Why.FULL, "devices full") and p.slots == 1
    p.release(third)
    p.quarantine(0, "full")
    assert p.acquire() == Refusal(
        Why.NEVER, "trainer.gpus_per_trial is 1, the pool has 0 usable devices")


def test_a_lease_counts_from_acquire_and_is_bound_once():
    """The devices are held before the trial is asked (its number is known only after), so
    two acquires never get the same slot; an unbound lease is released like any other."""
    p = pool.Pool(pool.fake_devices("1"), capacity=1)
    held = p.acquire()
    assert isinstance(held, pool.Lease) and held.trial is None and held.pins == ("0",)
    assert p.acquire() == Refusal(Why.FULL, "devices full")
    assert p.holders() == {0: []}  # the monitor sees bound leases only
    held.bind(3)
    assert p.holders() == {0: [held]}
    with pytest.raises(RuntimeError, match="bound again"):
        held.bind(4)
    p.release(held)
    assert p.holders() == {0: []} and isinstance(p.acquire(), pool.Lease)


def test_whether_a_refusal_is_permanent_is_its_kind():
    assert {w for w in Why if w.permanent} == {Why.TOO_SMALL, Why.MIG_ALONE, Why.NEVER}
    assert {w for w in Why if w.ends_run} == {Why.NEVER, Why.GIVE_UP}
    assert Refusal(Why.TOO_SMALL, "x").permanent and not Refusal(Why.BLOCKED, "x").permanent


def test_a_simulated_pool_is_bounded():
    """SWEEP_FAKE_GPUS=100000 held `sweep gpus` for minutes (a lock file per device)."""
    from sweep._core.errors import UsageError
    from sweep.gpus.pool import MAX_FAKE, fake_devices

    assert len(fake_devices(str(MAX_FAKE))) == MAX_FAKE
    for bad in ("100000", "-1", "two"):
        with pytest.raises(UsageError, match=rf"from 0 to {MAX_FAKE} \(got '{bad}'\)"):
            fake_devices(bad)
