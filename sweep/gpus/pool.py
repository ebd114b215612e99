"""Which devices a sweep may use, and which of them are free.

The pool is the caller's view of the machine: NVML's devices, bounded by the caller's
`CUDA_VISIBLE_DEVICES`, narrowed by `gpus.ids`. `SWEEP_FAKE_GPUS=N` replaces NVML with N
simulated devices named 0..N-1 (tests, laptops); everything else behaves the same.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sweep._core import UsageError
from sweep.gpus import hostlock, placement
from sweep.gpus.hostlock import HostSlots, Slot
from sweep.gpus.nvml import GpuInfo, Nvml, NvmlUnavailable
from sweep.gpus.placement import DeviceLook, Held, Refusal, Why

FAKE_ENV = "SWEEP_FAKE_GPUS"
MAX_FAKE = 1024  # simulated devices (more than any host has; 100,000 took minutes to lock)


@dataclass(frozen=True)
class Device:
    """A device of the pool. `index` is NVML's (PCI bus order) and what trials are pinned to."""

    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: float | None = None
    simulated: bool = False
    parent: int | None = None  # a MIG instance: the index of its GPU


def fake_devices(count: str) -> list[Device]:
    """The simulated pool of `SWEEP_FAKE_GPUS`."""
    try:
        n = int(count)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_FAKE:
        raise UsageError(f"{FAKE_ENV} must be a whole number of devices from 0 to {MAX_FAKE} "
                         f"(got {count!r})")
    return [Device(i, "simulated GPU", simulated=True) for i in range(n)]


def visible(devices: Sequence[GpuInfo], cuda_visible: str | None) -> list[Device]:
    """The devices `CUDA_VISIBLE_DEVICES` lets the caller use, in the order it lists them.

    Entries are NVML indices, `GPU-<uuid>` or `MIG-<uuid>` prefixes; a GPU in MIG mode stands
    for its MIG instances. As in CUDA, the list ends at the first entry that matches no
    device. Unset means every device; empty means none.
    """
    as_device = {d.index: Device(d.index, d.name, d.uuid, d.memory_total_mb,
                                 parent=d.parent) for d in devices}
    if cuda_visible is None:
        return list(as_device.values())
    out: list[Device] = []
    for raw in cuda_visible.split(","):
        entry = raw.strip()
        matches: list[Device] = []
        if entry.isdigit():
            whole = as_device.get(int(entry))
            matches = [whole] if whole else [
                d for d in as_device.values() if d.parent == int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            hits = [d for d in devices if d.uuid.startswith(entry)]
            if len(hits) == 1:
                matches = [as_device[hits[0].index]]
        if not matches:
            break
        out += [m for m in matches if m not in out]
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


def ranked(load: Mapping[int, int], capacity: int, excluded: set[int]) -> list[int]:
    """Devices in the order the next trial tries them: those with room, least loaded first,
    lowest index on ties (spread, then stack)."""
    return [i for n, i in sorted((n, i) for i, n in load.items()
                                 if n < capacity and i not in excluded)]


class PidSource(Protocol):
    """A trial's process tree, as the monitor needs it (`sweep.trial.process.TrialProcess`)."""

    def tree_pids(self) -> set[int]: ...


class Probe(Protocol):
    """What the pool asks NVML and the host before it places a trial (`monitor.NvmlProbe`)."""

    def look(self, index: int) -> DeviceLook | None: ...
    def closeness(self, a: int, b: int) -> int: ...
    def sweep_pids(self, pids: Iterable[int]) -> tuple[set[int], set[int]]:
        """(those that are trials of this host's sweeps, those that exist here)."""
        ...


@dataclass
class Rules:
    """How the pool judges devices beyond their slot count (see `sweep.gpus.placement`)."""

    skip_busy: bool = False
    busy_memory_mb: float = 1024.0
    want_mb: float | None = None  # memory one trial is promised (None: not judged)
    alone: bool = False  # `gpu_memory_gb: auto` before a peak is known: one trial a device
    hopeless_after: float = 10.0  # s every device must stay out before the pool gives up


MIG_ALONE = "a MIG instance: CUDA shows a process one at most, so only one-device trials"


def _hint(reasons: Sequence[Refusal]) -> str:
    """What the user can do about these refusals."""
    kinds = {r.kind for r in reasons}
    hints = []
    if Why.IN_USE_BY_OTHERS in kinds:
        hints.append("gpus.skip_busy: false shares cards with others; gpus.busy_memory_mb "
                     "sets what counts as in use")
    if kinds & {Why.TOO_SMALL, Why.NO_FREE_MEMORY}:
        hints.append("lower trainer.gpu_memory_gb, or use cards with more memory")
    if Why.MIG_ALONE in kinds:
        hints.append("use whole GPUs for trainer.gpus_per_trial > 1")
    return f" ({'; '.join(hints)})" if hints else ""


@dataclass(eq=False)
class Lease:
    """Devices held for one trial (`devices[0]` is its main one, `device`), from `Pool.acquire`
    until `Pool.release`. `trial` is None until `bind` names the trial (its number is known
    only once Optuna has asked it); the devices count as taken from the start. `shared` turns
    true once another trial held one of its devices too."""

    devices: tuple[int, ...]
    pins: tuple[str, ...]  # what each device is pinned by (`Pool.pin`)
    trial: int | None = None
    shared: bool = False
    process: PidSource | None = None
    slots: list[Slot] = field(default_factory=list)  # host-wide slots, one per device
    used_mb: dict[int, float | None] = field(default_factory=dict)  # per device, last sample

    @property
    def device(self) -> int:
        return self.devices[0]

    def bind(self, trial: int) -> None:
        """Name the trial these devices are for (once)."""
        if self.trial is not None:
            raise RuntimeError(f"the lease of trial {self.trial} was bound again ({trial})")
        self.trial = trial

    def attach(self, process: PidSource) -> None:
        """Name the trial's process tree, for the monitor's per-process memory."""
        self.process = process

    def hold(self, slot: Slot) -> None:
        """Hold one more host-wide slot (a rendezvous port) until the lease is released."""
        self.slots.append(slot)

    def fds(self) -> tuple[int, ...]:
        """The descriptors that hold its host-wide slots (the guard keeps them open)."""
        return tuple(fd for s in self.slots for fd in s.fds)


class Pool:
    """The one map of which trial holds which devices: at most `capacity` trials per device,
    counting, when `host` is given, the trials of every other sweep on this host; `width`
    devices per trial (`trainer.gpus_per_trial`).

    The driver's thread calls `acquire` and `release` (and `expect`, `quarantine`); the
    monitor's thread reads `holders()`. Devices are chosen least loaded first (host-wide),
    lowest index on ties: spread, then stack; a trial's further devices are those closest to
    its first (NVLink, PCIe switch) where the probe says.
    """

    def __init__(
        self, devices: list[Device], capacity: int = 1, host: HostSlots | None = None,
        probe: Probe | None = None, rules: Rules | None = None,
        clock: Callable[[], float] = time.monotonic, width: int = 1,
    ) -> None:
        self.devices = devices
        self.capacity = capacity
        self.host = host
        self.probe = probe
        self.rules = rules or Rules()
        self.clock = clock
        self.width = width
        self.quarantined: dict[int, str] = {}
        self.out: dict[int, Refusal] = {}  # devices with room the rules refused now, and why
        self.verdicts: dict[int, Refusal | None] = {}  # each device's last look (None: admitted)
        self.oom_blocked: set[int] = set()
        self._held: list[Lease] = []  # every lease not released, bound or not
        self._lock = threading.Lock()
        self._keys = {d.index: d.uuid or f"sim{d.index}" for d in devices}
        self._migs = {d.index for d in devices if d.parent is not None}
        self._hopeless_since: float | None = None

    @property
    def slots(self) -> int:
        """How many trials could run now if every usable device were free."""
        return self.capacity * (len(self.devices) - len(self.quarantined)) // self.width

    def pin(self, index: int) -> str:
        """What a trial on device `index` is pinned by: its UUID where NVML gives one (CUDA's
        own ordering cannot then make it another card), else the index."""
        uuid = next((d.uuid for d in self.devices if d.index == index), None)
        return uuid or str(index)

    def acquire(self) -> Lease | Refusal:
        """The devices of the next trial, or why there are none now.

        A `Lease` holds its devices (and their host-wide slots) at once: `bind` it to the trial
        once it is asked, and `release` it in every case, bound or not. A `Refusal`'s kind
        says what follows: `FULL` (this sweep's trials fill every device: one ends first),
        `BLOCKED` (room here, but others hold or use the devices: look again soon), or a kind
        that `ends_run` (no device can take a trial, ever or for `rules.hopeless_after` s
        while none of this pool's trials runs; devices other sweeps of this host hold are
        waited for, as they free when those trials end).
        """
        if self.slots == 0:
            return self._hopeless() or Refusal(Why.NEVER, "no GPU left in the pool")
        load = self._load()
        room = ranked(load, self.capacity, set(self.quarantined))
        chosen = self._reserve(room, load)
        if chosen is None:
            if not room:
                return Refusal(Why.FULL, "devices full")
            hopeless = self._hopeless()
            if hopeless is not None:
                return hopeless
            said = [f"GPU {i}: {why.text}" for i in room if (why := self.verdicts.get(i))]
            return Refusal(Why.BLOCKED,
                           "; ".join(said) or "other sweeps of this host hold the devices")
        devices, slots = chosen
        lease = Lease(devices, tuple(self.pin(i) for i in devices), slots=slots)
        with self._lock:
            for other in self._held:
                if set(other.devices) & set(devices):
                    other.shared = lease.shared = True
            self._held.append(lease)
        return lease

    def hold_port(self, lease: Lease, host: str) -> int:
        """A free TCP port for a multi-device trial's rendezvous, held with `lease`'s slots
        (in this host's lock folder: drivers of one host never share one)."""
        folder = self.host.folder if self.host else hostlock.lock_dir(host)
        taken = hostlock.take_port(folder)
        if taken is None:
            raise RuntimeError("no free TCP port for the trial's rendezvous")
        port, slot = taken
        lease.hold(slot)
        return port

    def release(self, lease: Lease, oom: bool = False) -> None:
        """Free the devices of `lease` and their host-wide slots (again: nothing happens).
        `oom`: its trial ran out of memory: no trial goes to its devices until one of the
        trials still on them ends (none: nothing to wait for, and nothing is blocked)."""
        with self._lock:
            if not any(x is lease for x in self._held):
                return
            self._held = [x for x in self._held if x is not lease]
        for index in lease.devices:
            self.oom_blocked.discard(index)  # memory was freed there
            if oom and any(index in x.devices for x in self._held):
                self.oom_blocked.add(index)
        for slot in lease.slots:
            slot.release()

    def expect(self, mb: float | None) -> None:
        """`gpu_memory_gb: auto`: promise each trial `mb` from now on; None (no peak known
        yet): one trial per device."""
        self.rules.want_mb = mb
        self.rules.alone = mb is None

    def key(self, index: int) -> str:
        """Device `index`'s key in the host's files: its UUID, else `sim<index>`."""
        return self._keys[index]

    def quarantine(self, index: int, reason: str) -> None:
        """Take a device out of the pool for the rest of the run."""
        self.quarantined[index] = reason

    def left_out(self) -> dict[int, str]:
        """The devices left out at the last `acquire` because others use them, and why."""
        return {i: r.text for i, r in self.verdicts.items()
                if r is not None and r.kind is Why.IN_USE_BY_OTHERS}

    def holders(self) -> dict[int, list[Lease]]:
        """Each device's leases bound to a trial now (a copy, safe to read from another
        thread)."""
        with self._lock:
            out: dict[int, list[Lease]] = {d.index: [] for d in self.devices}
            for lease in self._held:
                if lease.trial is not None:
                    for index in lease.devices:
                        out.setdefault(index, []).append(lease)
            return out

    def _load(self) -> dict[int, int]:
        load = {d.index: 0 for d in self.devices}
        for lease in self._held:
            for index in lease.devices:
                load[index] += 1
        return load

    def _reserve(self, room: list[int], load: Mapping[int, int],
                 ) -> tuple[tuple[int, ...], list[Slot]] | None:
        held = {i: self.host.held(self._keys[i]) if self.host else load[i] for i in room}
        self.out = {}
        order = sorted(room, key=lambda i: (held[i], i))  # host-wide load decides
        taken: list[tuple[int, Slot | None]] = []
        try:
            for index in order:
                refusal = self._refusal(index, held[index] > 0)
                self.verdicts[index] = refusal
                if refusal is not None:
                    if held[index] == 0 or refusal.permanent:  # else: sweeps' trials end
                        self.out[index] = refusal
                    continue
                slot = None
                if self.host is not None:
                    slot = self.host.take(self._keys[index])
                    if slot is None:
                        continue
                taken.append((index, slot))
                if len(taken) == self.width:
                    break
                if len(taken) == 1 and self.width > 1:  # the rest: closest to the first
                    order[order.index(index) + 1:] = self._by_closeness(
                        index, order[order.index(index) + 1:], held)
        except BaseException:
            for _, slot in taken:
                if slot is not None:
                    slot.release()
            raise
        if len(taken) < self.width:
            for _, slot in taken:
                if slot is not None:
                    slot.release()
            return None
        self._hopeless_since = None
        return tuple(i for i, _ in taken), [s for _, s in taken if s is not None]

    def _by_closeness(self, first: int, rest: list[int], held: Mapping[int, int]) -> list[int]:
        if self.probe is None:
            return rest
        probe = self.probe
        return sorted(rest, key=lambda i: (probe.closeness(first, i), held[i], i))

    def _refusal(self, index: int, sweeps_hold: bool) -> Refusal | None:
        rules = self.rules
        if self.width > 1 and index in self._migs:
            return Refusal(Why.MIG_ALONE, MIG_ALONE)
        mine = [x for x in self._held if index in x.devices]
        if rules.alone and mine:
            return Refusal(Why.ONE_UNTIL_PEAK,
                           "one trial per device until a trial's peak memory is known")
        if self.probe is None or not (rules.skip_busy or rules.want_mb is not None):
            return placement.admit(None, [], None, index in self.oom_blocked, None)
        look = self.probe.look(index)
        busy = None
        if rules.skip_busy and look is not None:
            ours: set[int] = set()
            for lease in mine:
                ours |= lease.process.tree_pids() if lease.process else set()
            sweeps, visible = self.probe.sweep_pids(set(look.processes) - ours)
            busy = placement.in_use_by_others(look, ours | sweeps, sweeps_hold,
                                              rules.busy_memory_mb, visible)
        promised = [Held(rules.want_mb or 0.0, x.used_mb.get(index)) for x in mine]
        return placement.admit(look, promised, rules.want_mb, index in self.oom_blocked, busy)

    def _hopeless(self) -> Refusal | None:
        """Why no trial can start while none of this pool's trials runs: at once when no
        device ever could (too small, MIG for a trial of several, fewer devices than a trial
        needs), else once that has held for `rules.hopeless_after` s; None otherwise.

        Devices other sweeps of this host hold are waited for: they free as trials end."""
        usable = [d.index for d in self.devices if d.index not in self.quarantined]
        if self._held:
            self._hopeless_since = None
            return None
        if len(usable) < self.width:
            return Refusal(Why.NEVER, f"trainer.gpus_per_trial is {self.width}, the pool has "
                           f"{len(usable)} usable device" + "s" * (len(usable) != 1))
        fits = [i for i in usable if i not in self.out]
        if len(fits) >= self.width:
            self._hopeless_since = None
            return None
        reasons = [self.out[i] for i in usable if i in self.out]
        why = "; ".join(f"GPU {i}: {self.out[i].text}" for i in usable if i in self.out)
        if self.width > 1:
            why = f"a trial needs {self.width} devices, {len(fits)} can take one now; {why}"
        why += _hint(reasons)
        never = [i for i in usable if i in self.out and self.out[i].permanent]
        if len(usable) - len(never) < self.width:
            return Refusal(Why.NEVER, f"no device can ever take a trial: {why}")
        now = self.clock()
        if self._hopeless_since is None:
            self._hopeless_since = now
        if now - self._hopeless_since < self.rules.hopeless_after:
            return None
        return Refusal(Why.GIVE_UP, f"no device can take a trial: {why}")
