"""A stand-in for `pynvml` (nvidia-ml-py) with the same names, signatures and exceptions.

Install it with `install(monkeypatch, [FakeGpu(...), ...])`; `sweep.gpus.nvml` then talks to it as
to the real library. `install(monkeypatch, None)` behaves like a machine without the NVIDIA
driver: `nvmlInit()` raises `NVMLError_LibraryNotFound`, as the real module does here.
Mutate the `FakeGpu` objects to change what the next call reports.
"""

from __future__ import annotations

import string
import sys
import types
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeNone = 0
nvmlEventTypeSingleBitEccError = 1
nvmlEventTypeDoubleBitEccError = 2
nvmlEventTypeXidCriticalError = 8


class NVMLError(Exception):
    """As in pynvml: `NVMLError(code)` returns the matching subclass, `.value` is the code."""

    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 (mirrors pynvml)
    value: int

    def __new__(typ, value: int) -> NVMLError:
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return f"NVML error {self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(
            name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        code = getattr(module, name)

        def new(typ: type, *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(typ, _code)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()


@dataclass
class FakeGpu:
    """One fake device. `None` for power/energy means "not supported" on this card."""

    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 141 * 2**30
    memory_used: int = 0
    util_gpu: int = 0
    util_memory: int = 0
    power_mw: int | None = 100_000
    energy_mj: int | None = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    # MIG: None when MIG mode is off; else the instance slots (None: an empty slot), each a
    # FakeGpu of its own (uuid "MIG-...", its share of memory; no utilisation or power)
    mig: list[FakeGpu | None] | None = None
    is_mig_instance: bool = False
    # health: None means "not supported" on this card
    ecc_uncorrected: int | None = 0  # volatile double-bit errors
    retired_pending: int | None = NVML_FEATURE_DISABLED
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failed
    events: bool = True  # whether the card gives Xid events


@dataclass
class _State:
    gpus: list[FakeGpu] | None = None
    nvlink: set[frozenset[int]] = field(default_factory=set)  # pairs of indices with NVLink
    topology: dict[frozenset[int], int] = field(default_factory=dict)  # else: SYSTEM
    initialised: bool = False
    event_sets: list[_EventSet] = field(default_factory=list)


@dataclass(eq=False)
class _EventSet:
    """What `nvmlEventSetCreate` returns: the devices registered, and events not yet read."""

    registered: list[tuple[FakeGpu, int]] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    freed: bool = False


_state = _State()


def xid(gpu: FakeGpu, code: int) -> None:
    """A critical Xid error on `gpu` now: queued to every event set registered for it (as in
    NVML, sets registered later do not see it)."""
    for event_set in _state.event_sets:
        for device, types_ in event_set.registered:
            if device is gpu and types_ & nvmlEventTypeXidCriticalError:
                event_set.pending.append(types.SimpleNamespace(
                    device=gpu, eventType=nvmlEventTypeXidCriticalError, eventData=code,
                    gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))


def _check() -> None:
    if not _state.initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _gpu(handle: Any) -> FakeGpu:
    _check()
    if not isinstance(handle, FakeGpu):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle


def nvmlInit() -> None:
    if _state.gpus is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _state.initialised = True


def nvmlShutdown() -> None:
    _check()
    _state.initialised = False


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return "550.54.15"


def nvmlSystemGetCudaDriverVersion() -> int:
    _check()
    return 12040


def nvmlDeviceGetCount() -> int:
    _check()
    return len(_state.gpus or [])


def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
    _check()
    gpus = _state.gpus or []
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpus[index]


def nvmlDeviceGetName(handle: Any) -> str:
    return _gpu(handle).name


def nvmlDeviceGetUUID(handle: Any) -> str:
    return _gpu(handle).uuid


def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> Any:
    g = _gpu(handle)
    return types.SimpleNamespace(
        total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used
    )


def nvmlDeviceGetUtilizationRates(handle: Any) -> Any:
    g = _gpu(handle)
    if g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    g = _gpu(handle)
    if g.power_mw is None or g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return g.power_mw


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    g = _gpu(handle)
    if g.energy_mj is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return g.energy_mj


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:
    g = _gpu(handle)
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]


def nvmlDeviceGetMigMode(device: Any) -> list[int]:
    g = _gpu(device)
    if g.is_mig_instance:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    mode = NVML_DEVICE_MIG_DISABLE if g.mig is None else NVML_DEVICE_MIG_ENABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(device: Any) -> int:
    g = _gpu(device)
    return 0 if g.mig is None else 7


def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> FakeGpu:
    g = _gpu(device)
    if g.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if not 0 <= index < 7:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    instance = g.mig[index] if index < len(g.mig) else None
    if instance is None:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    instance.is_mig_instance = True
    return instance


def _index(handle: Any) -> int:
    g = _gpu(handle)
    for i, x in enumerate(_state.gpus or []):
        if x is g:
            return i
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a MIG instance: no P2P, no topology


def nvmlDeviceGetP2PStatus(device1: Any, device2: Any, p2pIndex: int) -> int:
    pair = frozenset((_index(device1), _index(device2)))
    if p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK and pair in _state.nvlink:
        return NVML_P2P_STATUS_OK
    return NVML_P2P_STATUS_NOT_SUPPORTED


def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
    pair = frozenset((_index(device1), _index(device2)))
    return _state.topology.get(pair, NVML_TOPOLOGY_SYSTEM)


def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    g = _gpu(handle)
    if g.ecc_uncorrected is None or g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED) \
            or counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return g.ecc_uncorrected if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0


def nvmlDeviceGetRetiredPagesPendingStatus(device: Any) -> int:
    g = _gpu(device)
    if g.retired_pending is None or g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return g.retired_pending


def nvmlDeviceGetRemappedRows(device: Any) -> tuple[int, int, int, int]:
    g = _gpu(device)
    if g.remapped_rows is None or g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return g.remapped_rows


def nvmlEventSetCreate() -> _EventSet:
    _check()
    event_set = _EventSet()
    _state.event_sets.append(event_set)
    return event_set


def _event_set(eventSet: Any) -> _EventSet:
    _check()
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return eventSet


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    g = _gpu(handle)
    event_set = _event_set(eventSet)
    if not g.events or g.is_mig_instance:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    event_set.registered.append((g, eventTypes))


def nvmlEventSetWait(eventSet: Any, timeoutms: int) -> Any:
    """The oldest event not read; NVMLError_Timeout when there is none (this fake never
    waits: an event comes from `xid`, called by the test)."""
    event_set = _event_set(eventSet)
    if not event_set.pending:
        raise NVMLError(NVML_ERROR_TIMEOUT)
    return event_set.pending.pop(0)


def nvmlEventSetFree(eventSet: Any) -> None:
    event_set = _event_set(eventSet)
    event_set.freed = True
    _state.event_sets.remove(event_set)


API = [
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlEventSetFree",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
]


def install(monkeypatch: Any, gpus: list[FakeGpu] | None) -> types.ModuleType:
    """Make `import pynvml` return this module, with `gpus` (None: no driver installed)."""
    module = sys.modules[__name__]
    monkeypatch.setattr(_state, "gpus", gpus)
    monkeypatch.setattr(_state, "nvlink", set())
    monkeypatch.setattr(_state, "topology", {})
    monkeypatch.setattr(_state, "initialised", False)
    monkeypatch.setattr(_state, "event_sets", [])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module
