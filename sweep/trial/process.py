"""A running trial: its process (spawned under `guard.py`) and its stop escalation.

`TrialProcess` is the one place that spawns a trial; `RunningTrial` carries what the driver
knows of one trial while it runs and decides, from an injected clock, when to stop it. The
TERM -> grace -> KILL escalation itself runs in the trial's guard, so it keeps its timing even
while the driver is busy, and also when the driver is gone.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from sweep._core.terminal import release_dead_terminal
from sweep.gpus.pool import Lease
from sweep.protocol import TRIAL_DIR_ENV
from sweep.trial import guard
from sweep.trial.folders import open_log, written_before
from sweep.trial.intermediate import IntermediateValues
from sweep.trial.launch_plan import LaunchPlan
from sweep.trial.lineage import Lineage
from sweep.trial.outcome import FAIL, Outcome, judge_files, read_text
from sweep.trial.warm import GO, WarmServer

GUARD = Path(guard.__file__)
# How long past its grace period a guard may take to end the tree before the driver kills it.
GUARD_MARGIN = 2.0


class Stop(str, enum.Enum):
    """Why the driver stopped a trial (the first reason wins)."""

    PRUNED = "pruned"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    DRIVER_ERROR = "driver error"
    BAD_REPORT = "bad report"
    TAKEN = "told by another driver"  # which took this one for dead (it was frozen)
    HUNG = "hung"  # silent with idle GPUs for trainer.hang_after (`RunningTrial.detail` says)
    DEVICE_OUT = "its GPU was taken out of the pool"  # as sick (`RunningTrial.detail` says)
    PAUSED = "paused"  # at a rung, by study.scheduler: told PRUNED, may be promoted later
    REPLACED = "replaced"  # by a PBT exploit of another lineage: told PRUNED


class Process(Protocol):
    """What the driver needs of a trial's process (`TrialProcess`, or a fake in tests)."""

    plan: LaunchPlan
    pid: int
    started: float
    # the result file's text when the trainer ended, read then (a 1-tuple: None is no file);
    # None: not read (the guard did not say), the verdict reads the file itself
    result_at_end: tuple[str | None] | None

    @property
    def exit_code(self) -> int | None: ...  # the command's, once it exited
    @property
    def command_exited(self) -> bool: ...
    @property
    def ended(self) -> bool: ...  # the command and everything it started are gone
    lost: bool  # the guard was killed before the command exited
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def force_kill(self) -> None: ...
    def tree_pids(self) -> set[int]: ...
    @property
    def seen_pids(self) -> set[int]: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def close(self) -> None: ...


Spawn = Callable[..., Process]  # (plan, grace, on_change, hold=(fds...)) -> Process


class TrialProcess:
    """One trial's guard, launcher and trainer, in a new session.

    `on_change` is called from a reader thread when the command exits and when the whole tree
    has ended (to wake the driver). With a `server` (`launcher: warm`), the guard and the
    trainer are forks of that server instead of new interpreters.
    """

    def __init__(
        self, plan: LaunchPlan, grace: float, on_change: Callable[[], None] = lambda: None,
        hold: Sequence[int] = (), server: WarmServer | None = None,
    ) -> None:
        """`hold`: descriptors the guard keeps open while the tree lives (the device's
        host-wide slot lock, so it outlives a killed driver until the trial is gone).
        WarmError if `server` cannot start it (nothing was started: a guard it forks late
        never hears GO, so it starts nothing)."""
        self.plan = plan
        control_r, self._control = os.pipe()
        status_r, status_w = os.pipe()
        self._popen: subprocess.Popen[bytes] | None = None
        try:
            with open_log(plan.paths.stdout) as out, open_log(plan.paths.stderr) as err:
                if server is not None:
                    self.pid = server.fork(
                        plan.argv, {**os.environ, **plan.env}, str(plan.cwd or os.getcwd()), grace,
                        str(plan.paths.dir),
                        (control_r, status_w, out.fileno(), err.fileno(), *hold))
                    os.write(self._control, GO)  # a guard not told so starts nothing
                else:
                    # isolated and without site: the guard needs the standard library only,
                    # and starts 10 ms sooner on the way from one trial to the next
                    argv = [sys.executable, "-I", "-S", str(GUARD), str(control_r),
                            str(status_w), str(grace), plan.trainer or "-", "--"]
                    self._popen = subprocess.Popen(
                        [*argv, *plan.argv], env={**os.environ, **plan.env},
                        stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                        start_new_session=True, pass_fds=(control_r, status_w, *hold),
                        cwd=plan.cwd,  # `trainer.workdir`; None: the driver's
                    )
                    self.pid = self._popen.pid
        except BaseException:
            os.close(self._control)
            os.close(status_r)
            raise
        finally:
            os.close(control_r)
            os.close(status_w)
        self.started = time.time()
        self.result_at_end: tuple[str | None] | None = None
        self._exit_code: int | None = None
        self._exited = threading.Event()
        self._ended = threading.Event()
        self._seen_pids: set[int] = {self.pid}
        self._on_change = on_change
        self.lost = False  # the guard died before the command exited (it was killed)
        threading.Thread(target=self._follow, args=(status_r,), daemon=True).start()

    def _follow(self, status_fd: int) -> None:
        with os.fdopen(status_fd, "rb", buffering=0) as status:
            for line in status:
                if line.startswith(b"ended ") and self.result_at_end is None:
                    # what the trainer left is read now: its leftovers may write later, and
                    # `accelerate launch` exits a second or so after its script
                    self.result_at_end = (read_text(self.plan.result),)
                elif line.startswith(b"exit ") and not self._exited.is_set():
                    self._exit_code = int(line.split()[1])
                    self._exited.set()
                    self._on_change()
        # End of file: the guard is gone (a warm guard is the server's child: its exit code
        # is not ours to read; it is gone, so it was killed, and is counted as SIGKILL).
        code = self._popen.wait() if self._popen is not None else -signal.SIGKILL
        if self._exit_code is None:  # the guard died first: stop what it leaves behind
            self.lost = True
            kill_leftovers(self.plan.paths.dir)
            self._exit_code = 128 - code if code < 0 else code
        self._exited.set()
        self._ended.set()
        self._on_change()  # after the events, so the woken loop sees them

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    @property
    def command_exited(self) -> bool:
        return self._exited.is_set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the whole tree to end; True if it did."""
        return self._ended.wait(timeout)

    def _tell_guard(self, command: bytes) -> None:
        try:
            os.write(self._control, command)
        except OSError:
            pass

    def stop(self) -> None:
        """Ask the guard to stop the tree: SIGTERM, its grace period, SIGKILL."""
        self._tell_guard(guard.STOP)

    def kill(self) -> None:
        """Ask the guard to SIGKILL the tree at once."""
        self._tell_guard(guard.KILL)

    def force_kill(self) -> None:
        """SIGKILL the guard and every process that runs for this trial, from here."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        kill_leftovers(self.plan.paths.dir)

    def tree_pids(self) -> set[int]:
        """The pids of the trial's live processes (also remembered in `seen_pids`)."""
        try:
            root = psutil.Process(self.pid)
            pids = {self.pid, *(c.pid for c in root.children(recursive=True))}
        except psutil.Error:
            pids = set()
        self._seen_pids |= pids
        return pids

    @property
    def seen_pids(self) -> set[int]:
        """Every pid ever seen in the trial's tree (to recognise its GPU processes)."""
        return set(self._seen_pids)

    def close(self) -> None:
        """Close the control pipe: a guard still running stops its tree."""
        if self._control >= 0:
            os.close(self._control)
            self._control = -1


def kill_pids(pids: set[int]) -> None:
    """SIGKILL each of `pids` that still runs."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_leftovers(trial_dir: str | Path) -> list[int]:
    """SIGKILL every process of this user that runs for the trial in `trial_dir`: those whose
    environment, as the driver set it when it started them, names that folder.

    For trials of a dead driver: its guards stop their trees by themselves, unless they were
    killed too. Nothing a trial's folder holds is read: a trainer cannot point this at another
    process. (A warm trial's own fork shows its server's environment: it dies with its guard.)
    Returns the pids killed.
    """
    killed = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TRIAL_DIR_ENV) == str(trial_dir):
                proc.kill()
                killed.append(proc.pid)
        except psutil.Error:
            continue
    return killed


class Phase(enum.Enum):
    """Where a running trial is in its life, as the driver has seen it (`RunningTrial`)."""

    RUNNING = "running"  # its command runs (or exited, not judged yet); reports are followed
    STOPPING = "stopping"  # a `Stop` reason was given: the guard escalates TERM -> KILL
    TOLD = "told"  # the command exited, the trial was judged and told; leftovers get the grace
    ENDED = "ended"  # its whole tree is gone; its devices are cleared, then released

    @property
    def told(self) -> bool:
        return self in (Phase.TOLD, Phase.ENDED)


# The moves `RunningTrial._move` allows: a trial is told once, after which no stop counts.
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.TOLD}),
    Phase.STOPPING: frozenset({Phase.TOLD}),
    Phase.TOLD: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}


class PhaseError(RuntimeError):
    """A move `MOVES` does not allow: a defect in the driver, never the user's."""


@dataclass
class RunningTrial:
    """What the driver knows of one trial from its start until its processes are gone.

    Its life is `phase`, changed by `_move` only (see `MOVES`): RUNNING -> (STOPPING: a
    `Stop` reason, the guard escalates) -> TOLD (the command exited: judged and told) ->
    ENDED (the tree is gone; the device may be leased again once no process holds it).
    The deadlines (`deadline`, the guard's, `cleanup_at`) say when `tick` acts next.
    """

    trial: Any  # optuna.Trial: reports and pruning go through it
    number: int
    params: dict[str, Any]
    device: int
    attempt: int
    origin: int
    process: Process
    grace: float
    deadline: float | None = None  # trainer.timeout, on the driver's clock
    reports: IntermediateValues | None = None
    lease: Lease | None = None  # its devices, released by the driver once it ended
    phase: Phase = Phase.RUNNING
    stop_reason: Stop | None = None  # set with the move to STOPPING, kept after
    last_report: tuple[int, float] | None = None
    cleanup_at: float | None = None  # when to look again at a device its processes still held
    _force_at: float | None = field(default=None, repr=False)
    lineage: Lineage | None = None  # where it stands in its lineage (None: a first attempt)
    detail: str | None = None  # the fail_reason of a HUNG or DEVICE_OUT stop
    result_before: os.stat_result | None = None  # the result file found before it started

    def _move(self, to: Phase) -> None:
        """The one place `phase` changes; a move `MOVES` does not allow raises PhaseError."""
        if to not in MOVES[self.phase]:
            raise PhaseError(f"trial {self.number}: {self.phase.value} -> {to.value}")
        self.phase = to

    @property
    def judged(self) -> bool:
        """The trial was told (its command exited, or the driver gave up on it)."""
        return self.phase.told

    def stop(self, reason: Stop, now: float) -> None:
        """Stop the trial (SIGTERM, grace, SIGKILL in its guard); the first reason is kept.
        Once told, the leftovers already have their grace: nothing changes."""
        if self.phase is not Phase.RUNNING:
            return
        self._move(Phase.STOPPING)
        self.stop_reason = reason
        if self._force_at is None and not self.process.ended:
            self.process.stop()
            self._force_at = now + self.grace + GUARD_MARGIN

    def kill(self, now: float) -> None:
        """SIGKILL the whole tree now (a second Ctrl-C)."""
        if not self.process.ended:
            self.process.kill()
            self._force_at = min(self._force_at or math.inf, now + GUARD_MARGIN)

    def tick(self, now: float) -> None:
        """Act on the deadlines that passed: the trial's timeout, a guard that is late."""
        if self.process.ended:
            return
        if (self.deadline is not None and now >= self.deadline
                and self.phase is Phase.RUNNING and not self.process.command_exited):
            self.stop(Stop.TIMEOUT, now)
        if self._force_at is not None and now >= self._force_at:
            self.process.force_kill()
            self._force_at = now + GUARD_MARGIN

    def judged_now(self, now: float) -> None:
        """The command exited and the trial was told; its leftovers get the guard's grace."""
        self._move(Phase.TOLD)
        if self._force_at is None:
            self._force_at = now + self.grace + GUARD_MARGIN

    def clear_device(self, held: set[int], now: float) -> bool | None:
        """After the tree ended (the trial was told): is the device free of the trial's
        processes? `held` are the pids NVML shows on it. True: free; None: some were
        SIGKILLed, look again at `cleanup_at`; False: they survived a second after SIGKILL
        (the device is unusable)."""
        if self.phase is not Phase.ENDED:
            self._move(Phase.ENDED)
        left = held & self.process.seen_pids
        if not left:
            return True
        if self.cleanup_at is None:
            kill_pids(left)
            self.cleanup_at = now + 1.0
        return None if now < self.cleanup_at else False

    @property
    def follows_reports(self) -> bool:
        return self.reports is not None and self.phase is Phase.RUNNING

    def verdict(self, metrics: list[str], timeout: float | None, patterns: list[str],
                stream: str = "stdout") -> Outcome:
        """`outcome.judge` of this trial's files, exit code, stop and last report (`patterns`
        search `stream`: stdout or stderr)."""
        paths, result = self.process.plan.paths, self.process.plan.result
        stale = not patterns and written_before(result, paths, self.result_before)
        verdict = judge_files(paths.stderr, result, self.process.exit_code,
                              metrics, stdout=paths.stdout, patterns=patterns, stream=stream,
                              env_result=paths.result,
                              at_end=(None,) if stale else self.process.result_at_end,
                              stop=self.stop_text(), timeout=timeout,
                              last_report=self.last_report)
        if stale and (verdict.fail_reason or "").startswith("no result:"):
            return Outcome(FAIL, exit_code=verdict.exit_code, fail_reason=(
                f"no result: {result} was last written before the trial started (left by "
                "an earlier run?)"))
        return verdict

    def stop_text(self) -> str | None:
        """How the trial was stopped, as `outcome.judge` is to be told (None: it was not)."""
        if self.stop_reason is Stop.BAD_REPORT and self.reports is not None:
            return self.reports.error
        if self.stop_reason in (Stop.HUNG, Stop.DEVICE_OUT) and self.detail is not None:
            return self.detail
        if self.stop_reason is None and self.process.lost:
            return "its guard process was killed (by the trainer?); what was left was stopped"
        return self.stop_reason.value if self.stop_reason else None

    def next_wakeup(self, now: float = 0.0, poll: float | None = None) -> float | None:
        """When the driver next has something to do for this trial: `tick`'s deadlines, and
        its reports every `poll` s (at once while lines wait). None: only an event can."""
        if self.process.ended:
            return self.cleanup_at
        times = [self._force_at]
        if self.follows_reports and poll is not None:
            times.append(now if self.reports is not None and self.reports.more else now + poll)
        if self.phase is Phase.RUNNING and not self.process.command_exited:
            times.append(self.deadline)
        known = [t for t in times if t is not None]
        return min(known) if known else None



# SIGHUP: the terminal closed; SIGUSR1/SIGUSR2: what Slurm (`--signal`) and submitit send
# before a time limit or a preemption
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # a repeat is dropped


@contextlib.contextmanager
def signals_to(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Route SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to `handler` inside the block;
    restore the old ones after. SIGHUP (a closed terminal, a dropped ssh session) is one more
    way to say stop; a terminal it left dead is first replaced by /dev/null
    (`terminal.release_dead_terminal`).
    A SIGHUP ignored when the block starts (`nohup`) stays ignored; one that comes after
    another signal is dropped (it asks to stop, never to hurry: a second Ctrl-C kills). So is
    a SIGTERM, SIGUSR1 or SIGUSR2 that came before (a scheduler sends one to every process
    of the job: the batch shell, srun, which forwards it, and the driver); a different one
    after it counts as a second signal.

    Outside the main thread (where Python cannot catch signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    routed = False
    seen: set[int] = set()

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal routed
        if signum == signal.SIGHUP:  # the terminal may be gone: what is printed goes nowhere
            release_dead_terminal()
            if routed:  # the terminal and the shell each send one: it asks to stop, once
                return
        if signum in SCHEDULER_SIGNALS and signum in seen:
            return  # a copy: Slurm signals srun and its tasks alike (srun forwards it)
        seen.add(signum)
        routed = True
        handler(signum, frame)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS
                if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class WallClock:
    """The driver's clock: monotonic time, and a wait that a process event or a signal cuts
    short (`wake` may be called from any thread or a signal handler)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._r, selectors.EVENT_READ)
        self._closing = threading.Lock()  # a reader thread may wake it as the run ends
        self._closed = False

    def now(self) -> float:
        return time.monotonic()

    def wait(self, timeout: float | None) -> None:
        """Sleep until `timeout` s have passed (None: until woken) or `wake` is called."""
        if self._selector.select(None if timeout is None else max(0.0, timeout)):
            try:
                os.read(self._r, 4096)
            except BlockingIOError:
                pass

    def wake(self) -> None:
        """Cut the current or next wait short. Safe from any thread, also after `close`, but
        not from a signal handler while `close` runs (the handlers are gone by then)."""
        if self._closed:
            return
        with self._closing:
            if self._closed:
                return
            try:
                os.write(self._w, b"x")
            except OSError:  # full: a wake is pending anyway
                pass

    def close(self) -> None:
        with self._closing:
            self._closed = True
            self._selector.close()
            os.close(self._r)
            os.close(self._w)


def stop_all(runs: list[RunningTrial], reason: Stop, grace: float, now: float) -> None:
    """Stop every trial and wait until their trees are gone (SIGKILL after grace + margin).

    Blocking: for the way out of a driver that cannot go on.
    """
    for run in runs:
        run.stop(reason, now)
    deadline = time.monotonic() + grace + GUARD_MARGIN
    for run in runs:
        run.process.wait(max(0.0, deadline - time.monotonic()))
    for run in runs:
        if not run.process.ended:
            run.process.force_kill()
            run.process.wait(5)
        run.process.close()
