"""Whether a device is sick, decided from what NVML and the trials on it say (pure).

Three signs take a device out of a sweep's pool: a critical Xid error NVML reports for it
(`xid_verdict`), memory health counters that say the card needs a reset (`counters_verdict`),
and `FailingDevices`: trials that fail on it with a CUDA error (not out-of-memory) twice in a
row while trials on other devices complete. Everything here is decided from its arguments and
its own small state, so it is tested without a GPU.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sweep.gpus.nvml import Counters

# Xids a program causes, or its being killed (NVIDIA's Xid catalogue: 13 graphics engine
# exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup): they say
# nothing about the card. Every other critical Xid takes the device out.
PROGRAM_XIDS = frozenset({13, 31, 43, 45})
XID_NAMES = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62:
    "internal micro-controller halt", 63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error",
}
STRIKES = 2  # CUDA failures in a row that take a device out (while others complete)


def xid_verdict(xids: Sequence[int]) -> str | None:
    """Why a device that reported these critical Xids is sick (the first that counts), or None
    when each of them is one a program causes."""
    for code in xids:
        if code not in PROGRAM_XIDS:
            name = XID_NAMES.get(code)
            return f"critical Xid {code}" + (f" ({name})" if name else "") + " reported by NVML"
    return None


def counters_verdict(counters: Counters) -> str | None:
    """Why a device with these counters is sick (it needs a reset), or None."""
    if counters.ecc_uncorrected:
        n = counters.ecc_uncorrected
        return f"{n} uncorrectable (double-bit) ECC error{'s' * (n != 1)} since the driver loaded"
    if counters.retired_pending:
        return "memory pages are pending retirement (reset the GPU)"
    if counters.remap_failed:
        return "a memory row could not be remapped (the card needs service)"
    if counters.remap_pending:
        return "memory rows are pending remapping (reset the GPU)"
    return None


class Kind(enum.Enum):
    """What a finished trial says about the devices it ran on."""

    WORKED = "worked"  # COMPLETE or PRUNED: the device ran it
    CUDA_ERROR = "cuda error"  # FAIL with a CUDA error that is not out-of-memory
    OTHER = "other failure"  # any other FAIL (the trainer's own error, out of memory, ...)


T = TypeVar("T")


@dataclass
class _Streak(Generic[T]):
    failed: list[tuple[int, T]] = field(default_factory=list)  # (event number, what was given)


@dataclass(frozen=True)
class Sick(Generic[T]):
    """A device the failures took out: why, and what was given with each failure of its
    streak (oldest first)."""

    device: int
    why: str
    failed: tuple[T, ...]


class FailingDevices(Generic[T]):
    """Each device's streak of CUDA failures, and when each device last ran a trial well.

    `seen` is called once per finished trial with its devices and a payload (what the caller
    needs to run its params again); it returns the devices that are now sick: `STRIKES` CUDA
    failures in a row on it, and since the first of them a trial on another device worked. Each
    device is returned once. Trials that fail on every device (the code, not a card) take none
    out.
    """

    def __init__(self, strikes: int = STRIKES) -> None:
        self.strikes = strikes
        self._streaks: dict[int, _Streak[T]] = {}
        self._worked: dict[int, int] = {}  # device -> event number of its last trial that worked
        self._out: set[int] = set()
        self._events = itertools.count()

    def seen(self, devices: Sequence[int], kind: Kind, payload: T) -> list[Sick[T]]:
        event = next(self._events)
        for device in devices:
            streak = self._streaks.setdefault(device, _Streak())
            if kind is Kind.CUDA_ERROR:
                streak.failed.append((event, payload))
            else:
                streak.failed.clear()
                if kind is Kind.WORKED:
                    self._worked[device] = event
        return self._verdicts()

    def _verdicts(self) -> list[Sick[T]]:
        sick = []
        for device, streak in sorted(self._streaks.items()):
            if device in self._out or len(streak.failed) < self.strikes:
                continue
            first = streak.failed[-self.strikes][0]
            others = [d for d, at in self._worked.items() if d != device and at > first]
            if not others:
                continue
            self._out.add(device)
            sick.append(Sick(device, (
                f"{len(streak.failed)} trials in a row failed on it with a CUDA error (not out "
                f"of memory) while trials on GPU {min(others)} completed"),
                tuple(p for _, p in streak.failed)))
        return sick

    def forget(self, device: int) -> tuple[T, ...]:
        """The device is out of the pool (for whatever reason): it is judged no more. Returns
        what was given with the CUDA failures of its streak (they failed on a sick card)."""
        self._out.add(device)
        streak = self._streaks.pop(device, None)
        return tuple(p for _, p in streak.failed) if streak else ()
