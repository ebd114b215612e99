"""`python -m sweep ARGS` as a fork of the test's own process: the same command, a real process
(its own pid, pipes, signals, exit status, children), without a new interpreter importing
Optuna, SQLAlchemy and sweep again (about 2 CPU-s a driver, most of what the suite's spawned
drivers cost).

The child is made to start as `python -m sweep` would: its standard streams are the pipes, its
environment is the one given, and what the test process changed of the interpreter is put
back: signal handlers (Python's defaults; an ignored signal stays ignored, as across exec),
the warning filters and their display (pytest records warnings), logging's handlers (pytest's
on the root logger; a library's stream handler bound to an old `sys.stderr`), exit hooks (only
the command's own run), faulthandler and the wakeup fd. The parent's objects are frozen out of
the child's garbage collection (no finalizer of a connection the parent holds runs in the
child), the descriptors the parent had open are closed (as `close_fds` does) before the
parent goes on, signals wait, blocked, until the command's first line has put its handlers
in, and the child ends as `python -m sweep` ends: its exit hooks, then `os._exit`.

While the test process holds a SQLite database open beside a study file the command names,
runs a thread besides its main one or has loaded gRPC, a new interpreter is started instead
(`can_fork`). What differs from a new interpreter, and so
stays with `spawn_cli(..., fresh=True)`: a signal in the very first instant (before
`sweep.__main__` runs, the child has the test process's modules already imported), what
imports, and `/proc/PID/cmdline` and the environment block (the test worker's, not
`python -m sweep ...`).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SQLITE_FILES = (".db", ".sqlite", ".sqlite3", "-wal", "-shm", "-journal")


def can_fork(near: Sequence[Path]) -> bool:
    """Whether this process runs one thread only (Python's; and no gRPC, whose core has threads
    of its own: a lock one of them held at the fork stays held in the child, and gRPC's state
    is not fork-safe) and has no SQLite database open in or below the folders `near` (the
    command's study files' folders, where their databases are; told by the names SQLite files
    have: opening one to look would drop the process's locks on it). SQLite keeps what it
    knows of an open file (its locks, its WAL index) in the process, and a child forked with
    that state fails on the same file ("locking protocol")."""
    if threading.active_count() > 1 or "grpc" in sys.modules:
        return False  # a thread may hold a lock the child would wait on for ever, or abort
    folders = [str(folder) + os.sep for folder in near]
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if path.endswith(SQLITE_FILES) and path.startswith(tuple(folders)):
            return False
    return True


class ForkedCli(subprocess.Popen[str]):
    """A `subprocess.Popen` of `python -m sweep ARGS` whose child is a fork of this process."""

    def __init__(self, args: Sequence[str], env: dict[str, str]) -> None:
        self._cli = list(args)
        super().__init__([sys.executable, "-m", "sweep", *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any,
                       creationflags: Any, shell: Any, p2cread: int, p2cwrite: int,
                       c2pread: int, c2pwrite: int, errread: int, errwrite: int,
                       *rest: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        ready, said = os.pipe()  # closed by the child once the parent's descriptors are
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, ours in ((0, p2cread), (1, c2pwrite), (2, errwrite)):
                    if ours != -1:
                        os.dup2(ours, fd)
                os.closerange(3, said)  # as `close_fds` would: the parent's, the pipes'
                os.closerange(said + 1, os.sysconf("SC_OPEN_MAX"))
                os.close(said)
                code = _run(self._cli, env)
            except BaseException:  # the child never returns into pytest
                traceback.print_exc()
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(said)
        os.read(ready, 1)  # the end of file: no descriptor of this process is the child's now
        os.close(ready)
        self.pid = pid
        self._child_created = True
        for ours in (p2cread, c2pwrite, errwrite):
            if ours != -1:
                os.close(ours)


def _show_warning(message: warnings.WarningMessage) -> None:
    """What `warnings` shows a warning with, when nobody records them: a line on stderr."""
    try:
        sys.stderr.write(warnings._formatwarnmsg(message))  # type: ignore[attr-defined]
    except OSError:
        pass


def _run(argv: list[str], env: dict[str, str]) -> int:
    """In the child: the interpreter put back as a new one would have it, then the command."""
    gc.freeze()  # the parent's objects: never collected (and finalized) here
    os.environ.clear()
    os.environ.update(env)
    faulthandler.disable()
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except ValueError:
            continue
        if callable(handler):
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False,  # noqa: SIM115
                                       errors="backslashreplace")
    warnings.resetwarnings()  # CPython's defaults, most general last
    for action, category, module in (("ignore", ResourceWarning, ""),
                                     ("ignore", ImportWarning, ""),
                                     ("ignore", PendingDeprecationWarning, ""),
                                     ("ignore", DeprecationWarning, ""),
                                     ("default", DeprecationWarning, "__main__")):
        warnings.filterwarnings(action, category=category, module=module)  # type: ignore[arg-type]
    warnings._showwarnmsg_impl = _show_warning  # type: ignore[attr-defined]
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for logger in [root, *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if type(handler) is logging.StreamHandler:
                handler.setStream(sys.stderr)
    atexit._clear()
    sys.argv = [os.path.join(os.path.dirname(__import__("sweep").__file__), "__main__.py"),
                *argv]
    from sweep import __main__ as entry
    from sweep._core import stops

    catch = stops.catch

    def catch_then_let_in() -> None:  # blocked since the fork: they come to sweep's handlers
        catch()
        signal.pthread_sigmask(signal.SIG_SETMASK, [])

    stops.catch = catch_then_let_in
    code = 1
    try:
        code = entry.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    atexit._run_exitfuncs()  # the command's: its last one ends the process
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code
