"""The devices: NVML, the pool a sweep may use and its leases, placement, host-wide slots,
health verdicts, the host's sick list, and the monitor that samples them. Imports `_core`
and `protocol`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.gpus.hostlock import HostSlots, file_key, held_slots, lock_dir, usable_lock_dir
    from sweep.gpus.monitor import (
        SAMPLE_COLUMNS,
        SAMPLES_NAME,
        Monitor,
        NoReader,
        NvmlProbe,
        SampleReader,
        last_seen,
    )
    from sweep.gpus.nvml import Nvml, NvmlUnavailable
    from sweep.gpus.placement import Refusal, Why
    from sweep.gpus.pool import FAKE_ENV, Device, Lease, Pool, Rules

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
