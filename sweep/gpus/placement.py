"""Whether a device may take one more trial, decided from what NVML shows (pure).

The pool asks `admit` for each device it considers, least loaded first. The rules, in order:
1. a device whose last trial ran out of memory takes no trial of that size until memory is
   freed on it (one of its trials ended);
2. `gpus.skip_busy`: a device with compute processes that are no sweep's of this host, or with
   more than `gpus.busy_memory_mb` in use while no sweep of this host holds it, is in use by
   others;
3. `trainer.gpu_memory_gb`: free memory, less what the device's running trials were promised
   and have not allocated yet, must cover one more trial.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

MARGIN = 1.2  # `gpu_memory_gb: auto` promises the largest peak seen, times this,
EXTRA_MB = 512.0  # plus this (the CUDA context, allocator slack)


class Why(enum.Enum):
    """Why a device, or the whole pool, takes no trial now."""

    # one device (`admit`, `in_use_by_others`, the pool's own rules)
    OOM_BLOCKED = "a trial ran out of memory here"
    IN_USE_BY_OTHERS = "in use by others"
    NO_FREE_MEMORY = "not enough free memory now"
    TOO_SMALL = "less memory in all than a trial needs"
    ONE_UNTIL_PEAK = "one trial per device until a trial's peak memory is known"
    MIG_ALONE = "a MIG instance, and a trial needs several devices"
    # the whole pool (`Pool.acquire`)
    FULL = "every device holds as many of this sweep's trials as it may"
    BLOCKED = "devices have room, but others hold or use them now"
    GIVE_UP = "no device has taken a trial for too long"
    NEVER = "no device can ever take a trial"

    @property
    def permanent(self) -> bool:
        """It holds for the rest of the run: waiting changes nothing."""
        return self in (Why.TOO_SMALL, Why.MIG_ALONE, Why.NEVER)

    @property
    def ends_run(self) -> bool:
        """The run gives up (exit 1): no trial can start, now or by waiting."""
        return self in (Why.GIVE_UP, Why.NEVER)


@dataclass(frozen=True)
class Refusal:
    """Why no trial goes there: the kind decides what follows, `text` is what the user reads."""

    kind: Why
    text: str

    @property
    def permanent(self) -> bool:
        return self.kind.permanent

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class DeviceLook:
    """One device as NVML shows it now."""

    total_mb: float
    used_mb: float
    processes: dict[int, float | None]  # pid -> MB (None when hidden)


@dataclass(frozen=True)
class Held:
    """One of this driver's trials on the device: promised MB, and MB it uses now (None: not
    measured yet)."""

    promised_mb: float
    used_mb: float | None


def outstanding(held: Iterable[Held]) -> float:
    """MB the device's trials were promised and may still allocate."""
    return sum(max(0.0, h.promised_mb - (h.used_mb or 0.0)) for h in held)


def in_use_by_others(look: DeviceLook, ours: set[int], sweeps_hold: bool, busy_memory_mb: float,
                     visible: set[int] | None = None) -> Refusal | None:
    """Why the device is someone else's now, or None.

    `ours`: pids of this host's sweep trials. `sweeps_hold`: a sweep of this host holds a slot
    of it. Then, or when one of `ours` runs on it, its memory is not judged, and pids this
    process cannot see are taken to be the sweeps', as NVML reports host pids inside
    containers. `visible`: pids whose environment this process can read (None: all).
    """
    sweeps_hold = sweeps_hold or bool(ours & set(look.processes))
    others = sorted(
        pid for pid in look.processes
        if pid not in ours and not (sweeps_hold and visible is not None and pid not in visible)
    )
    if others:
        shown = ", ".join(str(p) for p in others[:3]) + (" ..." if len(others) > 3 else "")
        return Refusal(Why.IN_USE_BY_OTHERS, f"in use by others (pid {shown})")
    if not sweeps_hold and not math.isnan(look.used_mb) and look.used_mb > busy_memory_mb:
        return Refusal(Why.IN_USE_BY_OTHERS,
                       f"in use by others ({look.used_mb:.0f} MB used, over gpus.busy_memory_mb)")
    return None


def admit(
    look: DeviceLook | None, held: list[Held], want_mb: float | None, oom_blocked: bool,
    busy: Refusal | None,
) -> Refusal | None:
    """Why the device may not take one more trial that needs `want_mb` (None: unknown), or
    None if it may. `look` None: no NVML (a simulated pool): only the slot count decides."""
    if oom_blocked:
        return Refusal(Why.OOM_BLOCKED,
                       "a trial ran out of memory here; waiting for memory to be freed")
    if busy:
        return busy
    if look is None or want_mb is None:
        return None
    if look.total_mb < want_mb:
        return Refusal(Why.TOO_SMALL,
                       f"{look.total_mb:.0f} MB in all, a trial needs {want_mb:.0f} MB")
    free = look.total_mb - look.used_mb - outstanding(held)
    if free < want_mb:
        return Refusal(Why.NO_FREE_MEMORY,
                       f"{max(0.0, free):.0f} MB free for a trial that needs {want_mb:.0f} MB")
    return None


def learned_mb(peaks: Iterable[float]) -> float | None:
    """What `gpu_memory_gb: auto` promises a trial: the largest peak seen, with a margin
    (None until a trial's peak is known)."""
    known = [p for p in peaks if p is not None and not math.isnan(p) and p > 0]
    return max(known) * MARGIN + EXTRA_MB if known else None
