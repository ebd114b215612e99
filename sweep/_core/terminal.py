"""The driver's terminal going away (SIGHUP: the window closed, an ssh session dropped).

The kernel hangs a terminal up before it sends SIGHUP: from then on every write to it fails
(EIO). A driver that is stopping its trials still prints what it does; `release_dead_terminal`
points the dead descriptors at /dev/null so those lines go nowhere instead of ending the run
with an OSError before every trial is told.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

DEAD = (errno.EIO, errno.EPIPE)  # a hung-up terminal; a socket whose reader is gone


def release_dead_terminal(fds: Iterable[int] = (0, 1, 2)) -> list[int]:
    """Replace each of `fds` that can no longer be written (a write of nothing fails with
    EIO or EPIPE) by /dev/null, and return those replaced. Descriptors that still work, or that
    are closed or read-only, are left as they are. Safe to call from a signal handler."""
    dead = []
    for fd in fds:
        try:
            os.write(fd, b"")
        except OSError as e:
            if e.errno in DEAD:
                dead.append(fd)
    if dead:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in dead:
                os.dup2(null, fd)
        finally:
            os.close(null)
    return dead
