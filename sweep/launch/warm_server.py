"""`trainer.launcher: warm`: a fork server that has imported what trainers import.

The warm launcher starts one server (`python -m sweep.launch.warm_server FD MODULE...`, through
`warm_client.WarmServer`) when the run starts. It imports the modules (torch, accelerate,
`trainer.preload`), never touches CUDA, says whether importing them initialised CUDA or left
threads running (either makes forks unsafe), then serves trial starts over a Unix socket: for
each, the driver sends the trial's argv, environment and working directory with its pipes and
files (control, status, stdout, stderr, the slot locks), and the server forks

    server -> guard (new session, child subreaper, `guard.supervise`)
           -> trainer (own process group; the trial's environment, stdio and argv;
              the script run as __main__ by `runpy`; SIGKILLed if its guard dies)

so a trial is its own process under its own guard, exactly as with the other launchers, only
without an interpreter start and the imports. A crash, an OOM or a SIGKILL ends that fork
alone. The server is a child subreaper too: what a killed guard leaves behind comes back to
it and is killed. It ends when the driver closes the socket (or dies), once its guards have.

What a fork shares with the server, and a fresh interpreter would not: modules imported at
preload (and their state), the hash seed. Python's `random` is reseeded in each fork, as is
NumPy's global generator where it was imported; the server's atexit handlers and finalizers
are dropped (a fork runs only those its script registers). A preload that initialises CUDA at
import, or that leaves a thread running (its locks would be held forever in a fork), makes
forks unsafe: the server says so and the launcher falls back to `direct`.

The interpreter imitation (`sweep.launch._imitation`) uses CPython internals and is tested on
the versions in `TESTED_PYTHONS`; on another the launcher starts trials as `direct`.

This module imports only the standard library, `sweep.trial.guard` and
`sweep.launch._imitation`.
"""

from __future__ import annotations

import builtins
import gc
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sweep.launch import _imitation
from sweep.trial import guard

DEFAULT_PRELOAD = ("torch", "accelerate")
# The Pythons whose internals the interpreter imitation has been tested on
# (tests/launch/test_warm.py runs a server on each it finds).
TESTED_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
# The server's modules before it preloads (sweep's aside): a script's file of the same name
# does not replace them in a fork (in a new interpreter, most are loaded before sys.path
# is looked at). Modules preloaded or imported later do give way to the script's files.
_BASE: frozenset[str] = frozenset()
PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 20
MAX_FDS = 64


# ---- the wire: one JSON message per packet, with descriptors ----------------------------


class WarmError(RuntimeError):
    """The server could not start, or stopped serving."""


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise WarmError(f"a trial start of {len(data)} bytes is too large for the server")
    socket.send_fds(sock, [data], list(fds))


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """A message and its descriptors; (None, []) at end of file."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


# ---- the driver's side ------------------------------------------------------------------


# ---- the server's side ------------------------------------------------------------------


# What the preload set SIGCHLD to: the server and its guards wait for their children, so they
# keep the default; each trainer gets the preload's back, as a script that imported them would.
_SIGCHLD: Any = signal.SIG_DFL


def _preload(modules: Sequence[str]) -> dict[str, Any]:
    global _SIGCHLD
    failed: dict[str, str] = {}
    began = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:
            failed[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    _SIGCHLD = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # A thread started at import may hold a lock at the moment of a fork: the fork would
    # wait on it forever. Such a server does not serve.
    threads = sorted(t.name for t in threading.enumerate()
                     if t is not threading.main_thread() and t.is_alive())
    torch = sys.modules.get("torch")
    try:
        cuda = bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # a torch without its cuda module: nothing could initialise it
        cuda = False
    sys.stdout.flush()
    sys.stderr.flush()
    return {"cuda": cuda or _forks_poisoned(), "threads": threads, "failed": failed,
            "seconds": time.monotonic() - began}


def _forks_poisoned() -> bool:
    """Whether a fork of this process would find CUDA unusable ("Cannot re-initialize CUDA
    in forked subprocess"): torch marks that in a fork when its parent asked CUDA anything
    (a device count too, which `torch.cuda.is_initialized()` does not show)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    pid = os.fork()
    if pid == 0:
        try:
            bad = bool(torch.cuda._is_in_bad_fork())
        except BaseException:
            bad = False
        os._exit(1 if bad else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def _orphans(guards: set[int], spared: set[int]) -> None:
    """Reap what ended; SIGKILL what a killed guard left behind (it came back here), not the
    `spared` children that preloaded modules started."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        guards.discard(pid)
    for pid in guard.children() - guards - spared:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def serve(sock: socket.socket, modules: Sequence[str]) -> int:
    """Preload, say hello, then fork a guard per request until the driver closes `sock`."""
    global _BASE
    guard.quiet_signals()  # Ctrl-C in the driver's terminal is the driver's to handle
    _BASE = frozenset(m for m in sys.modules if m.partition(".")[0] != "sweep")
    hello = _preload(modules)
    spared = guard.children()
    guard._become_subreaper()
    gc.freeze()  # what is loaded stays out of the forks' collections (and their exit's look)
    try:
        _send(sock, hello)
    except OSError:  # the driver closed while this was importing
        return 0
    guards: set[int] = set()
    sock.settimeout(0.5)
    while True:
        _orphans(guards, spared)
        try:
            message, fds = _receive(sock)
        except TimeoutError:
            continue
        except OSError:
            break
        if message is None:
            break
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": f"cannot fork: {e}"})
            continue
        if pid == 0:
            _guard(sock, message, fds)  # never returns
        for fd in fds:
            os.close(fd)
        guards.add(pid)
        _send(sock, {"pid": pid})
    sock.close()
    while guards:  # the driver is gone or done: its guards stop their trees, then end
        time.sleep(0.1)
        _orphans(guards, spared)
    _orphans(guards, spared)
    return 0


def _guard(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    """In the fork: become the trial's guard (`guard.supervise`), then exit with its code."""
    code = 1
    try:
        sock.close()
        os.setsid()
        control, status, out, err, *hold = fds
        mine = [control, status, *hold]
        if os.read(control, 1) != guard.GO:  # the driver never learnt of this guard: start nothing
            return

        def start() -> int:
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                _trainer(message, out, err, mine, me)  # never returns
            os.close(out)
            os.close(err)
            return pid

        code = guard.supervise(start, control, status, float(message["grace"]))
        # The tree is gone: say so (end of file on STATUS, the slot locks freed) before this
        # process ends, since unmapping the server's memory on the way out takes a while.
        for fd in mine:
            os.close(fd)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """SIGKILL this process when `parent` (its guard) dies: a fork's /proc environment is the
    server's, so nothing else would find it then. If it died already, exit now."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _trainer(message: dict[str, Any], out: int, err: int, close: Sequence[int],
             parent: int) -> None:
    """In the guard's fork: become the trial's trainer and run its script as __main__.
    Never returns, whatever the script does."""
    code: Any = 1
    died_of: int | None = None
    main_file: str | None = None
    try:
        _die_with(parent)
        os.setpgrp()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if _SIGCHLD is not None:  # None: set outside Python, which cannot be given back
            signal.signal(signal.SIGCHLD, _SIGCHLD)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, out, err, *close}:
            os.close(fd)
        before = dict(os.environ)
        env = message["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(message["cwd"])
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = _imitation.stdio(1, env, line=False)
        sys.stderr = _imitation.stdio(2, env, line=True)
        argv = list(message["argv"][1:])  # [python, script, *args] or [python, -m, module, ...]
        module = argv[0] == "-m"
        first = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
        _imitation.as_fresh(before, first, _BASE)
        import runpy

        sys.orig_argv = list(message["argv"])
        if getattr(sys.modules.get("__mp_main__"), "__name__", "") == "__main__":
            del sys.modules["__mp_main__"]  # the server's own
        start = {"__builtins__": builtins}  # the module, as in python's __main__
        if module:
            sys.argv = [argv[1], *argv[2:]]
            sys.modules.pop(argv[1], None)  # run afresh, as `python -m` runs it
            spec = importlib.util.find_spec(argv[1])
            main_file = spec.origin if spec is not None else None
            runpy.run_module(argv[1], start, run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            main_file = os.path.abspath(argv[0])
            runpy.run_path(argv[0], start, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt as e:
        _imitation.print_error(e, main_file)
        died_of = signal.SIGINT
    except BaseException as e:  # the script's error, printed as python prints it
        _imitation.print_error(e, main_file)
        code = 1
    try:
        _imitation.exit_as_python(code, died_of)
    finally:
        os._exit(1)


def main(argv: list[str]) -> int:
    fd, *modules = argv
    sock = socket.socket(fileno=int(fd))
    return serve(sock, modules)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

