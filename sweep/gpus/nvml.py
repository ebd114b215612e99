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
    """One device trials can use: a physical GPU as NVML numbers it (PCI bus order), or a MIG
    instance of one (`parent` its GPU's index; `index` then `mig_index(parent, k)`)."""

    index: int
    name: str
    uuid: str
    memory_total_mb: float
    parent: int | None = None


def mig_index(parent: int, k: int) -> int:
    """The pool id of MIG instance `k` of GPU `parent`: 1000 x (parent + 1) + k (GPU 0's
    instances are 1000, 1001, ...), never an NVML index."""
    return 1000 * (parent + 1) + k


@dataclass(frozen=True)
class GpuReading:
    """One sample of one device."""

    util_gpu: float = NAN
    util_mem: float = NAN
    mem_used_mb: float = NAN
    mem_total_mb: float = NAN
    power_w: float = NAN


@dataclass(frozen=True)
class Counters:
    """A device's memory health as NVML counts it (None: this card cannot say)."""

    ecc_uncorrected: int | None = None  # double-bit (uncorrectable) errors since the driver loaded
    retired_pending: bool | None = None  # pages waiting to be retired at the next reset
    remap_pending: bool | None = None  # rows waiting to be remapped at the next reset
    remap_failed: bool | None = None  # a row could not be remapped


def physical(index: int) -> int:
    """The NVML index of the GPU a pool device is (a MIG instance: its parent's)."""
    return index // 1000 - 1 if index >= 1000 else index


XID_EVENTS_MAX = 64  # events drained from one GPU in one look, at most


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
        self._event_sets: dict[int, Any] = {}  # physical GPU -> its event set (None: none)

    def close(self) -> None:
        for event_set in self._event_sets.values():
            if event_set is not None:
                self._try(self._nv.nvmlEventSetFree, event_set)
        self._event_sets.clear()
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            if index >= 1000:  # a MIG instance (`mig_index`)
                parent = self._handle(index // 1000 - 1)
                handle = self._nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, index % 1000)
            else:
                handle = self._nv.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
        return self._handles[index]

    def devices(self) -> list[GpuInfo]:
        """Every device NVML sees, in NVML (PCI bus) order; a GPU in MIG mode is replaced by
        its MIG instances (CUDA cannot use it whole)."""
        out = []
        for i in range(self._nv.nvmlDeviceGetCount()):
            h = self._handle(i)
            name = _text(self._nv.nvmlDeviceGetName(h))
            if self._mig_enabled(h):
                for k in range(self._nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = self._nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                    except self._nv.NVMLError:
                        continue  # an empty instance slot
                    index = mig_index(i, k)
                    self._handles[index] = m
                    out.append(GpuInfo(
                        index=index, name=f"{_text(self._nv.nvmlDeviceGetName(m))} "
                        f"(GPU {i}, MIG {k})", uuid=_text(self._nv.nvmlDeviceGetUUID(m)),
                        memory_total_mb=self._nv.nvmlDeviceGetMemoryInfo(m).total / 2**20,
                        parent=i,
                    ))
                continue
            mem = self._nv.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuInfo(
                index=i, name=name, uuid=_text(self._nv.nvmlDeviceGetUUID(h)),
                memory_total_mb=mem.total / 2**20,
            ))
        return out

    def system(self) -> tuple[str | None, str | None]:
        """The driver's version ("550.54.15") and the CUDA version it supports ("12.4");
        None where NVML cannot say."""
        driver = self._try(self._nv.nvmlSystemGetDriverVersion)
        cuda = self._try(self._nv.nvmlSystemGetCudaDriverVersion)
        return (None if driver is None else _text(driver),
                None if not isinstance(cuda, int) else f"{cuda // 1000}.{cuda % 1000 // 10}")

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _ = self._nv.nvmlDeviceGetMigMode(handle)
        except (self._nv.NVMLError, AttributeError):  # no MIG on this card or this library
            return False
        return bool(current == getattr(self._nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def closeness(self, a: int, b: int) -> int:
        """How far apart two devices are, lower is closer: 0 with NVLink between them, else
        NVML's topology level (10 one PCIe switch ... 50 across CPU sockets); 100 unknown."""
        nv = self._nv
        try:
            ha, hb = self._handle(a), self._handle(b)
            nvlink = nv.nvmlDeviceGetP2PStatus(ha, hb, nv.NVML_P2P_CAPS_INDEX_NVLINK)
            if nvlink == nv.NVML_P2P_STATUS_OK:
                return 0
            return int(nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
        except (nv.NVMLError, AttributeError):
            return 100

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

    def counters(self, index: int) -> Counters:
        """The memory health counters of device `index` (its GPU's, for a MIG instance)."""
        nv, gpu = self._nv, physical(index)
        ecc = self._try_on(lambda h: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC), gpu)
        pending = self._try_on(nv.nvmlDeviceGetRetiredPagesPendingStatus, gpu)
        rows = self._try_on(nv.nvmlDeviceGetRemappedRows, gpu)
        return Counters(
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            retired_pending=pending == nv.NVML_FEATURE_ENABLED if pending is not None else None,
            remap_pending=bool(rows[2]) if rows is not None else None,
            remap_failed=bool(rows[3]) if rows is not None else None,
        )

    def _events_of(self, gpu: int) -> Any:
        """GPU `gpu`'s event set for critical Xid errors, made at the first look (None: the
        card or the driver cannot give them). Xids from before it was made are not seen."""
        if gpu not in self._event_sets:
            nv = self._nv
            event_set = None
            try:
                event_set = nv.nvmlEventSetCreate()
                nv.nvmlDeviceRegisterEvents(self._handle(gpu), nv.nvmlEventTypeXidCriticalError,
                                            event_set)
            except nv.NVMLError:
                if event_set is not None:
                    self._try(nv.nvmlEventSetFree, event_set)
                event_set = None
            self._event_sets[gpu] = event_set
        return self._event_sets[gpu]

    def critical_xids(self, index: int) -> list[int]:
        """The critical Xid numbers NVML reported for device `index`'s GPU since the last
        look (without waiting); the first look starts listening."""
        nv = self._nv
        event_set = self._events_of(physical(index))
        if event_set is None:
            return []
        xids = []
        for _ in range(XID_EVENTS_MAX):
            try:
                event = nv.nvmlEventSetWait(event_set, 0)
            except nv.NVMLError:  # NVMLError_Timeout: nothing more now
                break
            if int(event.eventType) & nv.nvmlEventTypeXidCriticalError:
                xids.append(int(event.eventData))
        return xids
