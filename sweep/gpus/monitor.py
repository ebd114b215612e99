"""Samples every device of the pool while a sweep runs, tagged with the trials holding it.

Samples are appended to the driver's own `<output_dir>/drivers/<host>.<pid>/gpu_samples.csv`
as they are taken (a crash loses at most one interval). On a simulated pool there is no NVML:
the rows still say which trial held which device when, and every figure is NaN.
"""

from __future__ import annotations

import csv
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sweep._core import names
from sweep.gpus import health
from sweep.gpus.nvml import Counters, GpuReading, physical
from sweep.gpus.placement import DeviceLook
from sweep.gpus.pool import Pool
from sweep.protocol import TRIAL_DIR_ENV

log = logging.getLogger("sweep")

SAMPLES_NAME = "gpu_samples.csv"
SAMPLE_COLUMNS = [
    "time", "host", "gpu", "trials", "util_gpu", "util_mem", "mem_used_mb", "mem_total_mb",
    "power_w",
]


TAIL_BYTES = 1 << 20  # how much of a samples file's end `last_seen` reads


def last_seen(path: Path, trial: int) -> float | None:
    """When a driver's samples (`path`, its `gpu_samples.csv`) last showed `trial` holding a
    device (epoch s): the last sign of life of a trial whose driver died. Only the file's last
    `TAIL_BYTES` are read; None if they do not name it, or the file cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    wanted, found = str(trial), None
    for row in csv.reader(text.splitlines()):
        if len(row) >= 4 and wanted in row[3].split(";"):
            try:
                found = max(found or 0.0, float(row[0]))
            except ValueError:
                continue
    return found


class SampleReader(Protocol):
    """What the monitor needs of NVML (`sweep.gpus.nvml.Nvml` provides it)."""

    def read(self, index: int) -> GpuReading: ...
    def energy_mj(self, index: int) -> float | None: ...
    def compute_processes(self, index: int) -> dict[int, float | None]: ...


class NoReader:
    """The reader of a simulated pool: nothing is known."""

    def read(self, index: int) -> GpuReading:
        return GpuReading()

    def energy_mj(self, index: int) -> float | None:
        return None

    def compute_processes(self, index: int) -> dict[int, float | None]:
        return {}

    def critical_xids(self, index: int) -> list[int]:
        return []

    def counters(self, index: int) -> Counters:
        return Counters()


@dataclass
class TrialUsage:
    """Running aggregates of one trial's devices while it runs (memory: the peak on any one of
    them; energy: all of them together)."""

    gpus: tuple[int, ...]
    util_sum: float = 0.0
    util_n: int = 0
    util_max: float = math.nan
    mem_peak_mb: float = math.nan
    energy_start_mj: float | None = None
    samples: int = 0
    # (monotonic time, utilisation %) of its samples in the last `Monitor.history_s`
    recent: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, reading: GpuReading, trial_mem_mb: float | None) -> None:
        self.samples += 1
        if not math.isnan(reading.util_gpu):
            self.util_sum += reading.util_gpu
            self.util_n += 1
            self.util_max = reading.util_gpu if math.isnan(self.util_max) else max(
                self.util_max, reading.util_gpu)
        mem = trial_mem_mb if trial_mem_mb is not None else reading.mem_used_mb
        if not math.isnan(mem):
            self.mem_peak_mb = mem if math.isnan(self.mem_peak_mb) else max(self.mem_peak_mb, mem)

    def stats(self, energy_end_mj: float | None) -> dict[str, float]:
        """The user attributes stored with the trial; NaN where nothing was measured."""
        energy = math.nan
        if self.energy_start_mj is not None and energy_end_mj is not None:
            energy = (energy_end_mj - self.energy_start_mj) / 1000
        return {
            names.GPU_UTIL_MEAN: self.util_sum / self.util_n if self.util_n else math.nan,
            names.GPU_UTIL_MAX: self.util_max,
            names.GPU_MEM_PEAK_MB: self.mem_peak_mb,
            names.ENERGY_J: energy,
        }


def trial_memory_mb(processes: dict[int, float | None], pids: Iterable[int]) -> float | None:
    """Device memory used by the given pids, or None when none of them is visible to NVML."""
    used = [processes[p] for p in pids if p in processes and processes[p] is not None]
    return sum(used) if used else None  # type: ignore[arg-type]


class NvmlProbe:
    """What the pool looks at before placing a trial: a device's memory and compute processes
    (NVML), and which of those processes are trials of this host's sweeps."""

    def __init__(self, reader: SampleReader) -> None:
        self.reader = reader

    def look(self, index: int) -> DeviceLook | None:
        if isinstance(self.reader, NoReader):
            return None
        reading = self.reader.read(index)
        return DeviceLook(reading.mem_total_mb, reading.mem_used_mb,
                    self.reader.compute_processes(index))

    def closeness(self, a: int, b: int) -> int:
        """Lower is closer (NVLink 0, then NVML's topology levels); see `Nvml.closeness`."""
        closeness = getattr(self.reader, "closeness", None)
        return closeness(a, b) if closeness is not None else 100

    def sweep_pids(self, pids: Iterable[int]) -> tuple[set[int], set[int]]:
        """(pids of trials of any sweep of this host: they carry SWEEP_TRIAL_DIR, pids whose
        environment this process can read: others' are unknowable, like a container's host
        pids)."""
        import psutil

        sweeps, visible = set(), set()
        for pid in pids:
            try:
                if TRIAL_DIR_ENV in psutil.Process(pid).environ():
                    sweeps.add(pid)
                visible.add(pid)
            except psutil.Error:  # gone, another pid namespace's, or another user's: as
                pass  # unknowable as the host pids of a container (see `in_use_by_others`)
        return sweeps, visible


class Monitor:
    """A sampler thread over the devices of `pool`, writing `csv_path` every `interval` s.

    Which trial holds which device comes from the pool (the one map of it), and so do the
    trials' process trees. The driver calls `trial_started` / `trial_finished` around a trial.
    """

    def __init__(
        self, reader: SampleReader, pool: Pool, csv_path: Path, interval: float = 1.0,
        host: str = "", history_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        on_sick: Callable[[], None] = lambda: None,
    ) -> None:
        """`history_s`: how long each trial's utilisation samples are kept (`samples_of`);
        `clock`: the driver's, for their times; `on_sick`: called (from the sampler's thread)
        when a device is found sick (the driver's wake)."""
        self.reader = reader
        self.host = host
        self.pool = pool
        self.csv_path = csv_path
        self.interval = interval
        self.latest: dict[int, GpuReading] = {}
        self._usage: dict[int, TrialUsage] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.history_s = history_s
        self.clock = clock
        self.on_sick = on_sick
        self._sick: dict[int, str] = {}  # devices found sick, not taken yet by the driver
        self._said_sick: set[int] = set()

    def create_csv(self) -> None:
        """Create the samples file with its header, unless an earlier run left one."""
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        if not self.csv_path.exists() or self.csv_path.stat().st_size == 0:
            with open(self.csv_path, "w", newline="") as f:
                csv.writer(f).writerow(SAMPLE_COLUMNS)

    def start(self) -> None:
        """Start sampling every `interval` seconds in a daemon thread."""
        self.create_csv()
        self._thread = threading.Thread(target=self._run, name="sweep-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def processes_on(self, gpu: int) -> set[int]:
        """The pids NVML shows on device `gpu` now (empty without NVML)."""
        return set(self.reader.compute_processes(gpu))

    def _energy(self, gpus: Sequence[int]) -> float | None:
        values = [self.reader.energy_mj(g) for g in gpus]
        known = [v for v in values if v is not None]
        return sum(known) if len(known) == len(values) else None

    def trial_started(self, trial: int, gpus: int | Sequence[int]) -> None:
        devices = (gpus,) if isinstance(gpus, int) else tuple(gpus)
        usage = TrialUsage(devices, energy_start_mj=self._energy(devices))
        with self._lock:
            self._usage[trial] = usage

    def trial_finished(self, trial: int, shared: bool) -> dict[str, float]:
        """Stop following `trial`; its aggregates (NaN where nothing was measured).

        `shared`: another trial held the device at some point (the pool's lease says), so the
        device's energy is not this trial's alone and is not given.
        """
        with self._lock:
            usage = self._usage.pop(trial, None)
        if usage is None:
            return {}
        return usage.stats(None if shared else self._energy(usage.gpus))

    def sample_once(self, now: float | None = None) -> list[list[object]]:
        """Take one sample of every device, update the trials' aggregates, append the rows."""
        now = time.time() if now is None else now
        tick = self.clock()
        rows: list[list[object]] = []
        holders = self.pool.holders()
        self._look_at_health(list(holders))
        for gpu, leases in holders.items():
            reading = self.reader.read(gpu)
            self.latest[gpu] = reading
            processes = self.reader.compute_processes(gpu) if leases else {}
            for lease in leases:
                pids = lease.process.tree_pids() if lease.process and processes else set()
                mem = trial_memory_mb(processes, pids) if pids else None
                lease.used_mb[gpu] = mem
                with self._lock:
                    if lease.trial in self._usage:
                        self._usage[lease.trial].add(reading, mem)
                        self._remember(self._usage[lease.trial], tick, reading.util_gpu)
            rows.append([
                round(now, 3), self.host, gpu,
                ";".join(str(t) for t in sorted(x.trial for x in leases if x.trial is not None)),
                reading.util_gpu, reading.util_mem, reading.mem_used_mb, reading.mem_total_mb,
                reading.power_w,
            ])
        with open(self.csv_path, "a", newline="") as f:
            out = csv.writer(f)
            if f.tell() == 0:  # re-created (output_dir removed during the run): a header
                out.writerow(SAMPLE_COLUMNS)
            out.writerows(rows)
        return rows

    def _remember(self, usage: TrialUsage, tick: float, util: float) -> None:
        """Keep the sample for the hang rule: the busiest of the trial's devices at `tick`."""
        recent = usage.recent
        if recent and recent[-1][0] == tick:
            last = recent.pop()[1]
            util = last if math.isnan(util) else util if math.isnan(last) else max(last, util)
        recent.append((tick, util))
        while recent and recent[0][0] < tick - self.history_s:
            recent.popleft()

    def samples_of(self, trial: int) -> list[tuple[float, float]]:
        """(time on the monitor's clock, utilisation % of the busiest of its devices) of the
        trial's recent samples, oldest first ([] when nothing was sampled)."""
        with self._lock:
            usage = self._usage.get(trial)
            return list(usage.recent) if usage is not None else []

    def _look_at_health(self, devices: list[int]) -> None:
        """Critical Xids and memory counters of `devices`: a sick one is kept for `take_sick`
        (once) and `on_sick` is called. Xids are drained once per physical GPU."""
        xid_of = getattr(self.reader, "critical_xids", None)
        counters_of = getattr(self.reader, "counters", None)
        xids: dict[int, list[int]] = {}
        found = False
        for gpu in devices:
            if xid_of is not None and physical(gpu) not in xids:
                xids[physical(gpu)] = xid_of(gpu)
            if gpu in self._said_sick:
                continue
            why = health.xid_verdict(xids.get(physical(gpu), []))
            if why is None and counters_of is not None:
                why = health.counters_verdict(counters_of(gpu))
            if why is not None:
                with self._lock:
                    self._sick[gpu] = why
                self._said_sick.add(gpu)
                found = True
        if found:
            self.on_sick()

    def take_sick(self) -> dict[int, str]:
        """The devices found sick since the last call, and why (for the driver's thread)."""
        with self._lock:
            sick, self._sick = self._sick, {}
        return sick

    def _run(self) -> None:
        failing = False  # said once until a sample goes through again
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
                failing = False
            except Exception as e:  # a sample lost; the next one may go through
                if not failing:
                    log.warning("GPU samples not written (said once until they are again): "
                                "%s", e)
                failing = True
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
