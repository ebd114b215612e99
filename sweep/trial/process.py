"""A trial's process: spawned under `guard.py`, followed, and stopped.

`TrialProcess` is the one place that spawns a trial (`trial.running.RunningTrial` carries what
the driver knows of it). The TERM -> grace -> KILL escalation itself runs in the trial's guard,
so it keeps its timing even while the driver is busy, and also when the driver is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from sweep.protocol import TRIAL_DIR_ENV
from sweep.trial import guard
from sweep.trial.folders import open_log
from sweep.trial.launch_plan import LaunchPlan
from sweep.trial.outcome import read_text

GUARD = Path(guard.__file__)
# How long past its grace period a guard may take to end the tree before the driver kills it.
GUARD_MARGIN = 2.0


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


class Forker(Protocol):
    """What forks a trial's guard and trainer instead of starting new interpreters
    (`sweep.launch._warm_client.WarmServer`, for `launcher: warm`)."""

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, grace: float,
             trial_dir: str, fds: Sequence[int]) -> int:
        """Fork one trial: its guard's pid; the guard waits for `guard.GO` on its control
        pipe (`fds`: control, status, stdout, stderr, then what the guard holds). WarmError
        if the server cannot."""
        ...


Spawn = Callable[..., Process]  # (plan, grace, on_change, hold=(fds...)) -> Process


class TrialProcess:
    """One trial's guard, launcher and trainer, in a new session.

    `on_change` is called from a reader thread when the command exits and when the whole tree
    has ended (to wake the driver). With a `server` (`launcher: warm`), the guard and the
    trainer are forks of that server instead of new interpreters.
    """

    def __init__(
        self, plan: LaunchPlan, grace: float, on_change: Callable[[], None] = lambda: None,
        hold: Sequence[int] = (), server: Forker | None = None,
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
                    os.write(self._control, guard.GO)  # a guard not told so starts nothing
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


def leftovers(trial_dir: str | Path) -> list[psutil.Process]:
    """Every process of this user that runs for the trial in `trial_dir`: those whose
    environment, as the driver set it when it started them, names that folder (a guard started
    as a new interpreter, its command and what they started). Nothing a trial's folder holds is
    read: a trainer cannot point this at another process. (A warm trial's own fork shows its
    server's environment: it dies with its guard.)"""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TRIAL_DIR_ENV) == str(trial_dir):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def is_guard(proc: psutil.Process) -> bool:
    """Whether `proc` is a trial's guard: the leader of its own session, running guard.py. A
    live guard stops the rest of its trial's tree by itself (TERM, grace, KILL) once its
    driver is gone."""
    try:
        return os.getsid(proc.pid) == proc.pid and any(
            Path(arg).name == GUARD.name for arg in proc.cmdline()[:4])
    except (OSError, psutil.Error):
        return False


def signal_all(procs: list[psutil.Process], sig: int) -> list[int]:
    """Send `sig` to each of `procs` that still runs (never to a later process given its pid);
    the pids it reached."""
    reached = []
    for proc in procs:
        try:
            proc.send_signal(sig)
            reached.append(proc.pid)
        except psutil.Error:
            continue
    return reached


def kill_leftovers(trial_dir: str | Path) -> list[int]:
    """SIGKILL every process that runs for the trial in `trial_dir` (`leftovers`), at once.

    For the trials whose guard died while their driver runs: what the guard left behind has
    no one else to stop it. Returns the pids killed.
    """
    return signal_all(leftovers(trial_dir), signal.SIGKILL)
