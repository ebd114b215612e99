"""Runs one trial's command and makes sure its processes die with the driver.

Started by the driver as `python guard.py FD GRACE -- ARGV...` in a new session, so the
guard, the launcher and the trainer share one process group. The guard
- becomes a child subreaper, so it waits for every descendant, not only the launcher (a trainer
  still saving a checkpoint after `accelerate launch` died keeps the trial running);
- watches FD, the read end of a pipe only the driver writes to: end of file means the driver is
  gone (even by SIGKILL), and the guard stops the whole group (SIGTERM, GRACE s, SIGKILL);
- exits with the command's exit code (128 + N when signal N killed it).
Standard library only: it must start in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stop_group_when_closed(fd: int, grace: float) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(group, signal.SIGKILL)


def main(argv: list[str]) -> int:
    fd, grace, sep, *command = argv
    assert sep == "--" and command, "usage: guard.py FD GRACE -- ARGV..."
    # A handler, not SIG_IGN: the command must get default dispositions back at exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    _become_subreaper()
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    threading.Thread(
        target=_stop_group_when_closed, args=(int(fd), float(grace)), daemon=True
    ).start()
    code = None
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            child.returncode = code
    if code is None:
        return 1
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
