"""Which devices a sweep may use, and which of them are free.

The pool is the caller's view of the machine: NVML's devices, bounded by the caller's
`CUDA_VISIBLE_DEVICES`, narrowed by `gpus.ids`. `SWEEP_FAKE_GPUS=N` replaces NVML with N
simulated devices named 0..N-1 (tests, laptops); everything else behaves the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sweep.errors import UsageError
from sweep.hostlock import HostSlots, Slot
from sweep.nvml import GpuInfo, Nvml, NvmlUnavailable

FAKE_ENV = "SWEEP_FAKE_GPUS"


@dataclass(frozen=True)
class Device:
    """A device of the pool. `index` is NVML's (PCI bus order) and what trials are pinned to."""

    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: float | None = None
    simulated: bool = False


def fake_devices(count: str) -> list[Device]:
    """The simulated pool of `SWEEP_FAKE_GPUS`."""
    try:
        n = int(count)
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"{FAKE_ENV} must be a whole number of devices (got {count!r})")
    return [Device(i, "simulated GPU", simulated=True) for i in range(n)]


def visible(devices: Sequence[GpuInfo], cuda_visible: str | None) -> list[Device]:
    """The devices `CUDA_VISIBLE_DEVICES` lets the caller use, in the order it lists them.

    Entries are NVML indices or `GPU-<uuid>` prefixes; as in CUDA, the list ends at the first
    entry that matches no device. Unset means every device; empty means none.
    """
    as_device = {
        d.index: Device(d.index, d.name, d.uuid, d.memory_total_mb) for d in devices
    }
    if cuda_visible is None:
        return list(as_device.values())
    out: list[Device] = []
    for raw in cuda_visible.split(","):
        entry = raw.strip()
        match = None
        if entry.isdigit():
            match = as_device.get(int(entry))
        elif entry.startswith("GPU-"):
            hits = [d for d in devices if d.uuid.startswith(entry)]
            match = as_device[hits[0].index] if len(hits) == 1 else None
        if match is None:
            break
        if match not in out:
            out.append(match)
    return out


def discover(env: Mapping[str, str] | None = None) -> list[Device]:
    """Every device this process may use: simulated, or NVML's within CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    if FAKE_ENV in env:
        return fake_devices(env[FAKE_ENV])
    try:
        nvml = Nvml()
    except NvmlUnavailable as e:
        raise UsageError(
            f"no GPUs found ({e}); set {FAKE_ENV}=N to run on N simulated devices"
        ) from None
    try:
        return visible(nvml.devices(), env.get("CUDA_VISIBLE_DEVICES"))
    finally:
        nvml.close()


def select(devices: Sequence[Device], ids: str | Sequence[int], file: str = "") -> list[Device]:
    """The devices of `gpus.ids` ("all" or a list of indices), which must all be in the pool."""
    if not devices:
        if FAKE_ENV in os.environ:
            raise UsageError(f"{FAKE_ENV}={os.environ[FAKE_ENV]} simulates no device; set it to "
                             "the number of devices to simulate")
        raise UsageError("the GPU pool is empty (CUDA_VISIBLE_DEVICES hides every device)")
    if isinstance(ids, str):  # "all"
        return list(devices)
    by_index = {d.index: d for d in devices}
    missing = [i for i in ids if i not in by_index]
    if missing:
        have = ", ".join(str(i) for i in by_index)
        prefix = f"{file}: " if file else ""
        raise UsageError(f"{prefix}gpus.ids: {missing} not in the pool (available: {have})")
    return [by_index[i] for i in dict.fromkeys(ids)]


def pick_device(load: Mapping[int, int], capacity: int, excluded: set[int]) -> int | None:
    """The device for the next trial: the least loaded one with room, lowest index on ties."""
    candidates = [(n, i) for i, n in load.items() if n < capacity and i not in excluded]
    return min(candidates)[1] if candidates else None


class PidSource(Protocol):
    """A trial's process tree, as the monitor needs it (`sweep.process.TrialProcess`)."""

    def tree_pids(self) -> set[int]: ...


@dataclass
class Lease:
    """One trial on one device. `shared` turns true once another trial held the device too."""

    trial: int
    device: int
    shared: bool = False
    process: PidSource | None = None
    slot: Slot | None = None  # the host-wide slot, when the pool has a HostSlots


class Pool:
    """The one map of which trial holds which device: at most `capacity` trials per device,
    counting, when `host` is given, the trials of every other sweep on this host.

    The driver leases and releases; the monitor's thread reads `holders()`. A device is
    chosen least loaded first (host-wide), lowest index on ties: spread, then stack.
    """

    def __init__(
        self, devices: list[Device], capacity: int = 1, host: HostSlots | None = None
    ) -> None:
        self.devices = devices
        self.capacity = capacity
        self.host = host
        self.quarantined: dict[int, str] = {}
        self.blocked = False  # room here, but other sweeps of this host hold the slots
        self._leases: dict[int, Lease] = {}
        self._reserved: tuple[int, Slot | None] | None = None
        self._lock = threading.Lock()
        self._keys = {d.index: d.uuid or f"sim{d.index}" for d in devices}

    @property
    def slots(self) -> int:
        """How many trials could run now if every usable device were free."""
        return self.capacity * (len(self.devices) - len(self.quarantined))

    def has_free(self) -> bool:
        """Whether a device has room now; its slot is then held for the next `lease`."""
        return self._reserve() is not None

    def free_device(self) -> int | None:
        """The device the next lease gets (None: every usable device is full)."""
        return self._reserve()

    def _reserve(self) -> int | None:
        if self._reserved is not None:
            return self._reserved[0]
        load = {d.index: 0 for d in self.devices}
        for lease in self._leases.values():
            load[lease.device] += 1
        room = [i for i, n in load.items() if n < self.capacity and i not in self.quarantined]
        if self.host is None:
            index = pick_device(load, self.capacity, set(self.quarantined))
            self._reserved = None if index is None else (index, None)
            return index
        host = self.host
        for index in sorted(room, key=lambda i: (host.held(self._keys[i]), i)):
            slot = host.take(self._keys[index])
            if slot is not None:
                self._reserved, self.blocked = (index, slot), False
                return index
        self.blocked = bool(room)
        return None

    def unreserve(self) -> None:
        """Give back a slot `has_free` held that no lease took."""
        if self._reserved is not None:
            if self._reserved[1] is not None:
                self._reserved[1].release()
            self._reserved = None

    def lease(self, trial: int, device: int | None = None) -> int:
        """Give `trial` the device `free_device` named (or `device`, which must have room);
        raises RuntimeError when it has none."""
        with self._lock:
            if device is None:
                device = self._reserve()
            if device is None or sum(x.device == device for x in self._leases.values()) >= (
                self.capacity
            ):
                raise RuntimeError("no free device")
            slot = None
            if self._reserved is not None and self._reserved[0] == device:
                slot, self._reserved = self._reserved[1], None
            elif self.host is not None:
                slot = self.host.take(self._keys[device])
                if slot is None:
                    raise RuntimeError(f"device {device} is full on this host")
            lease = Lease(trial, device, slot=slot)
            for other in self._leases.values():
                if other.device == device:
                    other.shared = lease.shared = True
            self._leases[trial] = lease
        return device

    def attach(self, trial: int, process: PidSource) -> None:
        """Name the process tree of `trial`, for the monitor's per-process memory."""
        with self._lock:
            if trial in self._leases:
                self._leases[trial].process = process

    def lease_of(self, trial: int) -> Lease | None:
        return self._leases.get(trial)

    def release(self, trial: int) -> Lease | None:
        """Free the device of `trial` (its host slot too); its lease, or None."""
        with self._lock:
            lease = self._leases.pop(trial, None)
        if lease is not None and lease.slot is not None:
            lease.slot.release()
        return lease

    def holders(self) -> dict[int, list[Lease]]:
        """Each device's leases now (a copy, safe to read from another thread)."""
        with self._lock:
            out: dict[int, list[Lease]] = {d.index: [] for d in self.devices}
            for lease in self._leases.values():
                out.setdefault(lease.device, []).append(lease)
            return out

    def quarantine(self, index: int, reason: str) -> None:
        """Take a device out of the pool for the rest of the run."""
        self.quarantined[index] = reason
