"""What the driver learns of its devices while trials run, and what follows: the pool's leases
taken (a refusal that ends the run gives up), a sick device is taken out of the pool (said in
one line, recorded for `sweep gpus`), the trials on it are stopped and those that failed on it
in a row run again elsewhere; devices others use are said to go out and come back; with
`gpu_memory_gb: auto` each trial is promised the largest peak seen; a trial's devices are freed
once none of its processes holds them. The decisions are `health`'s and `placement`'s; this
module acts on them, and is the driver's one reader of the `monitor`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optuna.trial import TrialState

from sweep.gpus import Lease, Monitor, Pool, Refusal, Why, health, placement, sicklist
from sweep.runner._events import Events
from sweep.runner.policy import Policy
from sweep.spec import Spec
from sweep.study import Store
from sweep.trial import Phase, RunningTrial, Stop

# what a failure on a device carries, to run it again elsewhere if the device is sick:
# (number, searched params, origin, attempt, its continuation's lineage attributes)
Failed = tuple[int, dict[str, Any], int, int, dict[str, Any]]


class DeviceCare:
    """The driver's reactions to its devices' health and use (one per run), as the pool and the
    `monitor` (None: no GPU is sampled) say it."""

    def __init__(self, spec: Spec, pool: Pool, store: Store, policy: Policy,
                 events: Events, monitor: Monitor | None = None) -> None:
        self.spec, self.pool, self.store, self.policy = spec, pool, store, policy
        self.events, self.monitor = events, monitor  # what the user is told goes to events
        self.blocked = False  # the pool's last refusal: others hold the devices (look again)
        self.learns = spec.trainer.gpu_memory_gb == "auto" and pool.probe is not None
        self._peaks: list[float] = []
        self._out: set[int] = set()  # devices said to be in use by others
        self._failing: health.FailingDevices[Failed] = health.FailingDevices()
        self.sick: set[int] = set()  # devices taken out of the pool as sick

    def acquire(self) -> Lease | None:
        """The devices for one more trial; None if the pool refuses (`blocked`: others hold
        them; a refusal that ends the run gives up)."""
        got = self.pool.acquire()
        self.blocked = isinstance(got, Refusal) and got.kind is Why.BLOCKED
        if not isinstance(got, Refusal):
            return got
        if got.kind.ends_run:
            self.policy.give_up(got.text)
        return None

    def started(self, number: int, devices: tuple[int, ...]) -> None:
        """Trial `number` started on `devices`: its GPU use is followed."""
        if self.monitor is not None:
            self.monitor.trial_started(number, devices)

    def usage(self, run: RunningTrial) -> dict[str, float]:
        """`run`'s GPU use, now that its command exited (none without a monitor)."""
        if self.monitor is None:
            return {}
        return self.monitor.trial_finished(run.number, shared=run.lease.shared)

    def take_sick(self, now: float, running: list[RunningTrial]) -> int:
        """The devices the monitor found sick since the last call taken out (`take_out`); how
        many trials were queued again."""
        found = self.monitor.take_sick() if self.monitor is not None else {}
        return sum(self.take_out(index, why, now, running)
                   for index, why in sorted(found.items()))

    def cleared(self, run: RunningTrial, now: float) -> bool:
        """Whether `run`'s devices (its processes are gone) may go back to the pool now: none
        of its processes holds memory on them, or those that survived SIGKILL made them
        unusable (taken out of the pool). False: look again."""
        on = {i: self.monitor.processes_on(i) if self.monitor else set() for i in run.devices}
        clear = run.clear_device(set().union(*on.values()), now)
        if clear is None:
            return False
        if not clear:
            reason = f"processes of trial {run.number} still hold it after SIGKILL"
            for index in run.devices:
                if on[index] & run.process.seen_pids:
                    self.pool.quarantine(index, reason)
                    self.events.message(f"GPU {index} taken out of the pool: {reason}")
        return True

    def begin(self) -> None:
        """`gpu_memory_gb: auto`: start from the peaks the study's trials reached so far."""
        if self.learns:
            self._peaks = self.store.peaks()
            self.learn(None)

    def learn(self, peak: float | None) -> None:
        """`gpu_memory_gb: auto`: promise each trial the largest peak seen, with a margin."""
        if peak is not None and peak == peak:
            self._peaks.append(peak)
        self.pool.expect(placement.learned_mb(self._peaks))

    def say_out(self) -> None:
        """Tell the user when devices go out because others use them, and come back."""
        seen = self.pool.left_out()
        for index in sorted(set(seen) - self._out):
            self.events.message(f"GPU {index} left out: {seen[index]}")
        for index in sorted(self._out - set(seen)):
            self.events.message(f"GPU {index} is free again: back in the pool")
        self._out = set(seen)

    def take_out(self, index: int, why: str, now: float,
                 running: Iterable[RunningTrial]) -> int:
        """Device `index` is sick: out of the pool for the rest of the run, said in one line
        (and recorded for `sweep gpus`); the trials running on it are stopped, and those that
        failed on it in a row run again elsewhere, no longer counted as failures. How many
        were queued again."""
        if index in self.sick or index not in {d.index for d in self.pool.devices}:
            return 0
        self.sick.add(index)
        self.pool.quarantine(index, why)
        self.events.message(f"GPU {index} taken out of the pool: {why}")
        if len(self.pool.quarantined) == len(self.pool.devices):  # the run cannot go on
            out = "; ".join(f"GPU {i}: {w}" for i, w in sorted(self.pool.quarantined.items()))
            self.policy.give_up(f"no GPU left in the pool (taken out: {out})")
        if self.pool.host is not None:
            sicklist.mark(self.pool.host.folder, self.pool.key(index), index, why)
        failed = self._failing.forget(index)
        queued = sum(self.store.requeue(searched, origin, attempt + 1, attrs)
                     for _, searched, origin, attempt, attrs in failed)
        self.policy.forgive({number for number, *_ in failed})
        for run in running:
            if index in run.devices and run.phase is Phase.RUNNING \
                    and not run.process.command_exited:
                run.detail = f"GPU {index} was taken out of the pool: {why}"
                run.stop(Stop.DEVICE_OUT, now)
        return queued

    def judged(self, run: RunningTrial, state: TrialState, cuda_error: bool, now: float,
               running: Iterable[RunningTrial]) -> tuple[bool, int]:
        """What a judged trial says of its devices (a sick one is taken out): whether it
        failed on a device that is out now (its params then run again elsewhere, not as a
        failure), and how many trials were queued again meanwhile."""
        queued = 0
        if run.stop_reason in (Stop.INTERRUPTED, Stop.TAKEN, Stop.DRIVER_ERROR):
            return False, 0
        if run.stop_reason is not Stop.DEVICE_OUT:
            kind = (health.Kind.WORKED if state is not TrialState.FAIL else
                    health.Kind.CUDA_ERROR if cuda_error else health.Kind.OTHER)
            searched = {k: v for k, v in run.params.items() if k in self.spec.searched}
            attrs = run.lineage.next_attrs(run.number, retry=False)
            payload = (run.number, searched, run.origin, run.attempt, attrs)
            for sick in self._failing.seen(run.devices, kind, payload):
                queued += self.take_out(sick.device, sick.why, now, running)
        return state is TrialState.FAIL and bool(self.sick & set(run.devices)), queued
