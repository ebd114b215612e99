"""The devices: NVML, the pool a sweep may use and its leases, placement, host-wide slots,
health verdicts, the host's sick list, and the monitor that samples them. Imports `_core`
and `protocol`."""
