"""The only module that talks to NVML (`nvidia-ml-py`, imported as `pynvml`).

Every figure NVML cannot give (no driver, not supported on this card) comes back as NaN or
None, never as an invented number.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

NAN = math.nan


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no library, no driver); the message says why."""


@dataclass(frozen=True)
class GpuInfo:
    """One physical device as NVML numbers it (PCI bus order)."""

    index: int
    name: str
    uuid: str
    memory_total_mb: float


@dataclass(frozen=True)
class GpuReading:
    """One sample of one device."""

    util_gpu: float = NAN
    util_mem: float = NAN
    mem_used_mb: float = NAN
    mem_total_mb: float = NAN
    power_w: float = NAN


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialised NVML session. Construct it once; call `close()` when done."""

    def __init__(self) -> None:
        try:
            self._nv = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from None
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not start: {e}") from None
        self._handles: dict[int, Any] = {}

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def devices(self) -> list[GpuInfo]:
        """Every device NVML sees, in NVML (PCI bus) order."""
        out = []
        for i in range(self._nv.nvmlDeviceGetCount()):
            h = self._handle(i)
            mem = self._nv.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuInfo(
                index=i,
                name=_text(self._nv.nvmlDeviceGetName(h)),
                uuid=_text(self._nv.nvmlDeviceGetUUID(h)),
                memory_total_mb=mem.total / 2**20,
            ))
        return out

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def _try_on(self, fn: Any, index: int) -> Any:
        """`fn(handle of device index)`, or None if NVML cannot (a device lost from the bus)."""
        try:
            return fn(self._handle(index))
        except self._nv.NVMLError:
            return None

    def read(self, index: int) -> GpuReading:
        """Utilisation, memory and power of one device; NaN for what it cannot report."""
        util = self._try_on(self._nv.nvmlDeviceGetUtilizationRates, index)
        mem = self._try_on(self._nv.nvmlDeviceGetMemoryInfo, index)
        power = self._try_on(self._nv.nvmlDeviceGetPowerUsage, index)
        return GpuReading(
            util_gpu=float(util.gpu) if util is not None else NAN,
            util_mem=float(util.memory) if util is not None else NAN,
            mem_used_mb=mem.used / 2**20 if mem is not None else NAN,
            mem_total_mb=mem.total / 2**20 if mem is not None else NAN,
            power_w=power / 1000 if power is not None else NAN,
        )

    def energy_mj(self, index: int) -> float | None:
        """Energy the device used since the driver loaded (mJ), or None if not supported."""
        value = self._try_on(self._nv.nvmlDeviceGetTotalEnergyConsumption, index)
        return float(value) if value is not None else None

    def compute_processes(self, index: int) -> dict[int, float | None]:
        """pid -> used memory (MB, None when hidden) of the compute processes on a device."""
        procs = self._try_on(self._nv.nvmlDeviceGetComputeRunningProcesses, index)
        out: dict[int, float | None] = {}
        for p in procs or []:
            used = getattr(p, "usedGpuMemory", None)
            out[int(p.pid)] = used / 2**20 if used is not None else None
        return out
