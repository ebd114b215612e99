"""A stand-in for `pynvml` (nvidia-ml-py) with the same names, signatures and exceptions.

Install it with `install(monkeypatch, [FakeGpu(...), ...])`; `sweep.nvml` then talks to it as
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
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


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


@dataclass
class _State:
    gpus: list[FakeGpu] | None = None
    initialised: bool = False


_state = _State()


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
    return types.SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    g = _gpu(handle)
    if g.power_mw is None:
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


API = [
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetComputeRunningProcesses",
]


def install(monkeypatch: Any, gpus: list[FakeGpu] | None) -> types.ModuleType:
    """Make `import pynvml` return this module, with `gpus` (None: no driver installed)."""
    module = sys.modules[__name__]
    monkeypatch.setattr(_state, "gpus", gpus)
    monkeypatch.setattr(_state, "initialised", False)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module
