"""The interpreter imitation of `sweep.launch.warm_server`: a fork of the warm server made to start,
run and end as a new interpreter of the trial's environment would.

`as_fresh` gives the fork the trial's sys.path (no module a file there shadows), fresh random
state and what its variables set; `stdio` makes its streams as python would; `exit_as_python`
ends it as python ends (threads, atexit, flushed files, the exit code or the signal);
`print_error` prints a script's uncaught error as python does. Parts use CPython internals
(`threading._shutdown`, `atexit._clear`, `weakref.finalize._registry`): `warm.TESTED_PYTHONS`
names the versions they are tested on.

This module imports only the standard library (the warm server imports it before it preloads).
"""

from __future__ import annotations

import codecs
import gc
import io
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any


def print_error(error: BaseException, main_file: str | None) -> None:
    """The traceback from the script's own frame on, as `python script.py` prints it."""
    import traceback

    tb = error.__traceback__
    while tb is not None and main_file and tb.tb_frame.f_code.co_filename != main_file:
        tb = tb.tb_next
    error = error.with_traceback(tb or error.__traceback__)
    try:
        sys.excepthook(type(error), error, error.__traceback__)  # the script's, if it set one
    except BaseException:
        traceback.print_exception(error)


def stdio(fd: int, env: Mapping[str, str], line: bool) -> io.TextIOWrapper:
    """A stdio stream on `fd` as python makes it under `env` (PYTHONUNBUFFERED,
    PYTHONIOENCODING)."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding, _, errors = env.get("PYTHONIOENCODING", "").partition(":")
    raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    default = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    try:
        encoding = codecs.lookup(encoding).name if encoding else ""
    except LookupError:
        encoding = ""
    return io.TextIOWrapper(raw, encoding=encoding or default,
                            errors=errors or ("backslashreplace" if line else "strict"),
                            line_buffering=line, write_through=unbuffered)


def shadowed(folders: Sequence[str], base: frozenset[str]) -> list[str]:
    """Modules loaded in this process that a file in `folders` would shadow in a fresh
    interpreter whose sys.path starts with them."""
    names = set()
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        names |= {n.removesuffix(".py") for n in entries if n.endswith(".py")}
        names |= {n for n in entries if os.path.isfile(os.path.join(folder, n, "__init__.py"))}
    return [m for m in sys.modules if m.partition(".")[0] in names and m not in base]


def as_fresh(before: Mapping[str, str], first: str, base: frozenset[str]) -> None:
    """Give the fork what a new interpreter of the trial's environment would have:
    - sys.path: `first` (the script's folder, or the working directory for -m), then the
      trial's PYTHONPATH; no loaded module that a file there shadows;
    - fresh random state: Python's `random` reseeds itself at fork; NumPy's global generator
      and torch's default seed do not;
    - torch's thread count from OMP_NUM_THREADS, the time zone from TZ, faulthandler and
      bytecode writing from their variables."""
    env = os.environ
    theirs = before.get("PYTHONPATH", "").split(os.pathsep)
    added = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d and d not in theirs]
    sys.path[0:1] = [first, *added]
    for name in shadowed([first, *added], base):
        del sys.modules[name]
    # The server's finalizers and atexit handlers are the server's: a fork that ran them at
    # exit would spend time (torch deregisters its operators: 25 ms) or undo the server's
    # state (a preload that made a temporary folder at import and removes it at exit).
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.atexit = False
    import atexit

    atexit._clear()
    # numpy.random only where the server imported it: else the trial's import seeds it
    numpy, torch = sys.modules.get("numpy.random"), sys.modules.get("torch")
    try:
        if numpy is not None:
            numpy.seed()
        if torch is not None:
            torch.seed()
            threads = env.get("OMP_NUM_THREADS", "")
            if threads != before.get("OMP_NUM_THREADS", "") and threads.isdigit():
                # as torch at its start: no more threads than the cores it may run on
                torch.set_num_threads(min(int(threads), len(os.sched_getaffinity(0))))
        if env.get("TZ") != before.get("TZ"):
            time.tzset()
        if env.get("PYTHONFAULTHANDLER"):
            import faulthandler

            faulthandler.enable()
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    except Exception:  # never fail a trial over this
        pass


def exit_as_python(code: Any, died_of: int | None = None) -> None:
    """End the fork as the interpreter ends: wait for non-daemon threads, run atexit, flush,
    then exit with `code` as SystemExit's (None 0, an int & 0xFF, anything else printed and
    1), or die of signal `died_of` (after KeyboardInterrupt) as python does."""
    import atexit

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    if code is None:
        code = 0
    elif not isinstance(code, int):
        try:
            print(code, file=sys.stderr)
        except BaseException:
            pass
        code = 1
    # Files the script left open are flushed, as an interpreter's end would (objects made
    # since the server's gc.freeze(): a few, not the server's hundred thousand).
    files = [o for o in gc.get_objects() if isinstance(o, io.IOBase)]
    files.sort(key=lambda f: not isinstance(f, io.TextIOBase))  # text first: it writes on
    for stream in [*files, sys.stdout, sys.stderr]:
        try:
            if not stream.closed:
                stream.flush()
        except BaseException:
            pass
    if died_of is not None:
        signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    os._exit(code & 0xFF)
