"""Supervises one trial's process tree: the only code that stops a trial's processes.

Started by the driver as `python guard.py CONTROL STATUS GRACE TRAINER -- ARGV...` in a new
session; the command runs in a process group of its own inside it. The guard
- becomes a child subreaper, so every descendant that loses its parent comes back to it: a
  child in its own session or process group (`setsid`, `setpgid(0, 0)`, a double fork) is still
  found and stopped;
- reads CONTROL, a pipe only the driver writes: `T` stops the tree (SIGTERM to every
  descendant, GRACE s, then SIGKILL), `K` kills it at once, end of file (the driver is gone,
  even by SIGKILL) stops it as `T` does. A launcher whose trainer runs gets no SIGTERM: the
  trainer does, and the launcher ends with it (`accelerate launch` 1.16 answers SIGTERM by
  killing its child 5 s later, torchrun 30 s later, whatever GRACE is);
- writes `ended NS` to STATUS when the trainer ended (`time.time_ns()`), then `exit N` as soon
  as the command exits, so the driver judges the trial then; whatever the command left running
  is stopped as by `T`. The trainer is the command itself, or, with TRAINER not `-` (the
  command is a launcher: `accelerate launch`), the command's child whose command line names
  TRAINER (the script or the module) as its first argument or after `-m`: what it wrote counts,
  what its leftovers write after it ended does not, whatever the launcher;
- exits, once no descendant is left, with the command's exit code (128 + N for signal N).
Standard library only: it must start in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36
STOP, KILL = b"T", b"K"  # on CONTROL: stop the tree (TERM, grace, KILL); kill it at once
GO = b"G"  # on a warm guard's CONTROL: the driver has its pid; start the trainer


def descendants(root: int) -> list[int]:
    """Every live descendant of `root`, read from /proc (parents before children)."""
    children = _children_of()
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _children_of() -> dict[int, list[int]]:
    """Every live process's children, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after "pid (comm)" (state, ppid, ...; field 22 of the
    file is [19] here); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()  # comm may hold spaces and parentheses


def has_children() -> bool:
    """Whether this process has a child left (live, or exited and not yet reaped), asked of
    the kernel. Not read from /proc/self/task/*/children: a guard that had read that file
    cost its parent, the driver, about 2 ms of CPU more to reap (the kernel's pruning of the
    guard's /proc entries then), at every trial."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def children() -> set[int]:
    """This process's own children (not their descendants): what is left of the tree once
    the command exited, since a subreaper gets every orphan of it."""
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                found.update(int(pid) for pid in f.read().split())
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: the long way
            return set(_children_of().get(os.getpid(), ()))
        except OSError:
            continue
    return found


class Tree:
    """The guard's descendants, and the one TERM -> grace -> KILL escalation of sweep."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.gone = threading.Event()  # set by the main loop once no child is left
        self.launcher: tuple[int, str] | None = None  # (the command's pid, its trainer's name)
        self._lock = threading.Lock()
        self._stopping = False

    def signal_all(self, sig: int, spare: int | None = None) -> None:
        for pid in descendants(os.getpid()):
            if pid == spare:
                continue
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _spared(self) -> int | None:
        """The launcher to leave out of the SIGTERM: the command, while a child of it runs the
        trainer (a launcher with no trainer yet, or none left, is stopped as the rest)."""
        if self.launcher is None:
            return None
        command, trainer = self.launcher
        return command if _trainer_child(command, trainer) is not None else None

    def stop(self, grace: float) -> None:
        """SIGTERM every descendant (a launcher whose trainer runs: every other one), wait
        `grace` s for them to go, then SIGKILL what is left.

        A second stop while one is under way only shortens it (a kill, grace 0, goes through).
        """
        with self._lock:
            if self._stopping and grace > 0:
                return
            self._stopping = True
        if grace > 0:
            self.signal_all(signal.SIGTERM, self._spared())
            if self.gone.wait(grace):
                return
        while not self.gone.is_set():
            self.signal_all(signal.SIGKILL)
            self.gone.wait(0.1)

    def stop_in_background(self, grace: float) -> None:
        threading.Thread(target=self.stop, args=(grace,), daemon=True).start()


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _follow_control(fd: int, tree: Tree) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:  # the driver is gone
            tree.stop_in_background(tree.grace)
            return
        if KILL in data:
            tree.stop_in_background(0)
        elif STOP in data:
            tree.stop_in_background(tree.grace)


def _report(fd: int, code: int) -> None:
    _say(fd, f"exit {code}")


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, f"{line}\n".encode())
    except OSError:
        pass  # the driver is gone; the control pipe says so too


def _trainer_child(command: int, trainer: str) -> int | None:
    """The child of `command` whose command line runs `trainer` (`python SCRIPT ...` or
    `python -m MODULE ...`); None while there is none."""
    try:
        with open(f"/proc/{command}/task/{command}/children") as f:
            kids = [int(pid) for pid in f.read().split()]
    except OSError:
        return None
    for pid in kids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if trainer.encode() in args[1:3]:
            return pid
    return None


def _watch_trainer(command: int, trainer: str, status: int, done: threading.Event) -> None:
    """Say `ended NS` once the trainer, the child of `command` that runs `trainer`, is gone
    (a pidfd: it is not this process's child). Nothing if the command ends first."""
    pid = None
    while pid is None:
        if done.wait(0.01):
            return
        pid = _trainer_child(command, trainer)
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already (or no pidfd): it ended a moment ago
        _say(status, f"ended {time.time_ns()}")
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)
    _say(status, f"ended {time.time_ns()}")


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22): with the pid,
    it names one process, never a later one given the same pid. None if it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def quiet_signals() -> None:
    """TERM, INT and HUP do nothing to the guard (the driver stops it through CONTROL).

    A handler, not SIG_IGN: a command it execs must get default dispositions back."""
    # a scheduler's signals reach every process of a job step (Slurm): the guard outlives them
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)


def supervise(start: Callable[[], int], control: int, status: int, grace: float,
              trainer: str | None = None) -> int:
    """Run the command `start()` starts (returning its pid; the command in a process group of
    its own) to the end of its whole tree, as the module says; its exit code. `trainer`: what
    names the trainer among the command's children (None: the command is the trainer)."""
    _become_subreaper()
    tree = Tree(grace)
    try:
        child = start()
    except OSError as e:
        print(f"sweep guard: cannot start the command: {e}", file=sys.stderr)
        _report(status, 127)
        return 127
    command_done = threading.Event()
    if trainer is not None:
        tree.launcher = (child, trainer)
    threading.Thread(target=_follow_control, args=(control, tree), daemon=True).start()
    if trainer is not None:
        threading.Thread(target=_watch_trainer, args=(child, trainer, status, command_done),
                         daemon=True).start()
    code = 1
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            returncode = os.waitstatus_to_exitcode(wait_status)
            code = 128 - returncode if returncode < 0 else returncode
            command_done.set()
            if trainer is None:
                _say(status, f"ended {time.time_ns()}")
            _report(status, code)
            if has_children():
                tree.stop_in_background(tree.grace)
    tree.gone.set()
    return code


def main(argv: list[str]) -> int:
    control, status, grace, trainer, sep, *command = argv
    if sep != "--" or not command:
        print("usage: guard.py CONTROL STATUS GRACE TRAINER|- -- ARGV...", file=sys.stderr)
        return 2
    quiet_signals()

    def start() -> int:
        # A process group of its own: a trainer that signals its group cannot hit the guard.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
        child.returncode = 0  # reaped by `supervise` (os.wait): Popen must not wait for it
        return child.pid

    return supervise(start, int(control), int(status), float(grace),
                     None if trainer == "-" else trainer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
