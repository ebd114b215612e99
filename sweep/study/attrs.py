"""The user attributes sweep writes on a trial: every name in one place, and the typed owner
record (`Owner`: the driver that runs a trial), written and read only through `Owner.attrs` /
`Owner.of`. The lineage's own names live in `sweep.trial.lineage` and are named here too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from sweep.trial import lineage

# A trial's user attributes. OWNER is written right after the trial's first heartbeat and
# before its trainer starts (`Owner.attrs`: {"host", "pid", "started" (the driver's), "gpu",
# "dir", and "gpus" for a trial of several devices}). Its lineage (`retry_of`, `attempt`,
# `continues`, ...): see `lineage`.
OWNER = "owner"
GPU, HOST, RERUN_OF = "gpu", "host", "rerun_of"
ATTEMPT, RETRY_OF, CONTINUES = lineage.ATTEMPT, lineage.RETRY_OF, lineage.CONTINUES
GPUS = "gpus"  # a trial of several devices: all of them, "0,1" (GPU is the first)
EXIT_CODE, FAIL_REASON = "exit_code", "fail_reason"
BEAT = "beat"  # the driver's heartbeat where the storage has none of Optuna's
# a trial told FAIL by a reclaim: its driver's last sign of life (epoch s), where one was found
# (its `beat`, its driver's last GPU sample of it): when it stopped holding its devices
ALIVE_UNTIL = "alive_until"
METRIC_PREFIX = "metric_"  # the result's other numeric keys, in a namespace of their own
# A scheduler's decisions (`study.scheduler`), recorded on a lineage's attempts so every driver
# of the study reads the same lineages (`sweep.schedulers.history`): PAUSED_AT (the step a paused
# attempt was stopped at; set before it is told), RUNG (the rung it was paused at), PASSED_RUNG
# (the highest rung an attempt was judged at and went on from), BRACKET (a Hyperband lineage's
# bracket), EXPLOIT_OF, EXPLOIT_STEP and REPLACES (a PBT lineage copied from a donor's
# checkpoint folder, in place of a lineage; EXPLOIT_STEP, the step of the state copied, is set
# once the copy is made), CALLED_OFF (an exploit that never started, whose donor had no state
# with a step left: the lineage it was to replace goes on); RESUMED_AT, STEPS_REPEATED (a
# continuation whose first step did not come after the step its lineage had reached), LOGGED
# (the values a PBT trial's script logged for its `trainer.logged_params`, at each `interval`
# boundary) and RESTORED_PARAMS (an exploit whose script logged its donor's value of a param,
# not its perturbed one).
PAUSED_AT, RUNG = "paused_at", "rung"
PASSED_RUNG = "passed_rung"
BRACKET = "bracket"
EXPLOIT_OF, EXPLOIT_STEP, REPLACES = "exploit_of", "exploit_step", "replaces"
CALLED_OFF = "called_off"
RESUMED_AT, STEPS_REPEATED = "resumed_at", "steps_repeated"
LOGGED, RESTORED_PARAMS = "logged_params", "restored_params"


@dataclass(frozen=True)
class Owner:
    """The driver process that runs a trial."""

    host: str
    pid: int
    started: float  # the process's start time (epoch s): pids are reused

    @classmethod
    def me(cls, host: str) -> Owner:
        proc = psutil.Process()
        return cls(host, proc.pid, proc.create_time())

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> Owner | None:
        """The owner recorded in a trial's user attributes (also sweep 0.1's loose ones)."""
        rec = attrs.get(OWNER)
        if isinstance(rec, dict) and "host" in rec and "pid" in rec:
            return cls(str(rec["host"]), int(rec["pid"]), float(rec.get("started") or 0))
        if "host" in attrs and "driver_pid" in attrs:
            return cls(str(attrs["host"]), int(attrs["driver_pid"]),
                       float(attrs.get("driver_started") or 0))
        return None

    def alive(self) -> bool:
        """Whether this driver process still runs (on this host)."""
        try:
            proc = psutil.Process(self.pid)
            return not self.started or abs(proc.create_time() - self.started) < 1.0
        except psutil.Error:
            return False


@dataclass(frozen=True)
class OwnerRecord:
    """What a trial's OWNER attribute holds: the driver that runs it, its device(s), its folder."""

    owner: Owner
    gpu: int | None = None
    dir: str | None = None  # the trial's folder, as its driver made it
    gpus: str | None = None  # a trial of several devices: all of them, "0,1"

    def to_attr(self) -> dict[str, Any]:
        """The OWNER attribute's value."""
        record: dict[str, Any] = {"host": self.owner.host, "pid": self.owner.pid,
                                  "started": self.owner.started, "gpu": self.gpu,
                                  "dir": self.dir}
        if self.gpus:
            record[GPUS] = self.gpus
        return record

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> OwnerRecord | None:
        """The record in a trial's user attributes; None where no owner is recorded."""
        owner = Owner.of(attrs)
        if owner is None:
            return None
        rec = attrs.get(OWNER)
        rec = rec if isinstance(rec, dict) else {}
        gpu, folder, gpus = rec.get("gpu"), rec.get("dir"), rec.get(GPUS)
        return cls(owner, None if gpu is None else int(gpu),
                   None if folder is None else str(folder), None if gpus is None else str(gpus))

