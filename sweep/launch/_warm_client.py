"""The driver's side of `trainer.launcher: warm`: `WarmServer` starts the fork server
(`python -m sweep.launch.warm_server`, see that module), waits for its imports, asks it to fork each
trial's guard and trainer, and closes it; `cannot_take` says which trial environments a
server cannot give (they start as direct)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.launch.warm_server import (
    DEFAULT_PRELOAD,
    MAX_MESSAGE,
    WarmError,
    _receive,
    _send,
)

# What a new interpreter takes from its environment at start that a fork can be given
# (`imitation.as_fresh`); a trial that sets any other PYTHON* variable is refused (`cannot_take`).
APPLIED = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONFAULTHANDLER",
           "PYTHONDONTWRITEBYTECODE")
LOCALE = ("LC_ALL", "LC_CTYPE", "LANG")  # python's encodings and UTF-8 mode come from them
CUSTOMIZE = ("sitecustomize", "usercustomize")  # run by python's `site` as it starts
FORK_PATIENCE = 5.0  # s the driver waits for the server to fork a trial (it takes ms)


class WarmNotYet(WarmError):
    """The server is still importing."""


def server_modules(preload: Sequence[str]) -> list[str]:
    """What a warm run's fork server imports: torch, accelerate, then `preload`."""
    return list(dict.fromkeys([*DEFAULT_PRELOAD, *preload]))


class WarmServer:
    """The driver's handle on its fork server: start it, wait until it is ready, fork."""

    def __init__(self, preload: Sequence[str], env: Mapping[str, str], log: Path,
                 python: str = sys.executable, abort: Callable[[], bool] = lambda: False,
                 ) -> None:
        """Start the server with `env` (the driver's, with a SWEEP_TRIAL_DIR of its own, so
        its forks on a GPU are known as sweep's); its own output goes to `log`. `abort()`
        true (the driver was asked to stop) ends a wait for a fork's answer."""
        # torch.cuda.is_available() at a preload's import then asks NVML, not CUDA (which
        # would make every fork unable to use CUDA); trials get their own environment.
        env = {**env, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (mine, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_MESSAGE)
        self.preload = list(dict.fromkeys(preload))
        try:
            with open(log, "ab") as out:
                self._popen = subprocess.Popen(
                    [python, "-m", "sweep.launch.warm_server", str(theirs.fileno()), *self.preload],
                    env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True, pass_fds=(theirs.fileno(),))
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        self._abort = abort
        self._lock = threading.Lock()
        self.log = log
        self.hello: dict[str, Any] | None = None

    def ready(self, timeout: float, abort: Callable[[], bool] = lambda: False,
              ) -> dict[str, Any]:
        """The server's hello once it has imported: {"cuda": whether importing initialised
        CUDA, "threads": the names of threads the imports left running, "failed": {module:
        error}, "seconds": the imports' time}. Waits up to `timeout`
        s (0: a look) for it, then WarmNotYet; WarmError if it died; `abort()` true ends the
        wait with WarmNotYet too."""
        if self.hello is not None:
            return self.hello
        try:
            hello = self._answer(time.monotonic() + timeout, abort)
        except TimeoutError:
            raise WarmNotYet(f"still importing {', '.join(self.preload)}") from None
        if hello is None:
            raise WarmError(f"the server ended while importing ({self._ended_how()}; "
                            f"see {self.log})")
        self.hello = hello
        return hello

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, grace: float,
             trial_dir: str, fds: Sequence[int]) -> int:
        """Start one trial: its guard's pid. `fds`: control, status, stdout, stderr, then
        what the guard holds; the caller keeps and closes its own copies. WarmError if the
        server does not answer within FORK_PATIENCE s, or before `abort()` (the server must
        not be asked again then: a late answer would be taken for the next one's; a guard
        it forks late never hears GO, so it starts nothing)."""
        message = {"argv": list(argv), "env": dict(env), "cwd": cwd, "grace": grace,
                   "dir": trial_dir}
        with self._lock:
            try:
                self._sock.settimeout(FORK_PATIENCE)
                _send(self._sock, message, fds)
                reply = self._answer(time.monotonic() + FORK_PATIENCE, self._abort)
            except TimeoutError:
                raise WarmError("the run is stopping; the server had not answered yet"
                                if self._abort() else
                                f"the server stopped serving: no answer in {FORK_PATIENCE:.0f} s"
                                ) from None
            except OSError as e:
                raise WarmError(f"the server stopped serving: {e}") from None
            finally:
                self._sock.settimeout(None)
        if reply is None:
            raise WarmError(f"the server ended ({self._ended_how()}; see {self.log})")
        if "error" in reply:
            raise WarmError(str(reply["error"]))
        return int(reply["pid"])

    def _ended_how(self) -> str:
        """How the server ended, in words: its exit code, or the signal that killed it. It
        has closed its socket, so it is on its way out: it is given a second for that."""
        try:
            code = self._popen.wait(1.0)
        except subprocess.TimeoutExpired:
            return "it closed its socket but still runs"
        return f"killed by signal {-code}" if code < 0 else f"exit {code}"

    def _answer(self, deadline: float, abort: Callable[[], bool]) -> dict[str, Any] | None:
        """The server's next message (None: it ended), looking at `abort()` every 0.1 s;
        TimeoutError once `deadline` has passed or `abort()` is true."""
        try:
            while True:
                self._sock.settimeout(max(0.001, min(0.1, deadline - time.monotonic())))
                try:
                    return _receive(self._sock)[0]
                except TimeoutError:
                    if abort() or time.monotonic() >= deadline:
                        raise
        finally:
            self._sock.settimeout(None)

    def close(self, wait: float = 5.0) -> None:
        """Stop serving: the server ends once its guards have (it is killed after `wait` s,
        or at once while it is still importing; running trials are not waited for here: the
        driver has ended them)."""
        self._sock.close()
        try:
            self._popen.wait(wait if self.hello is not None else 0)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


def cannot_take(env: Mapping[str, str], server_env: Mapping[str, str]) -> list[str]:
    """The variables of a trial's `env` that a fork of a server started with `server_env`
    cannot honour: interpreter settings read once at start (PYTHONOPTIMIZE, PYTHONWARNINGS,
    PYTHONHASHSEED, ..., and the locale), and a PYTHONPATH that adds a folder holding a
    sitecustomize or usercustomize module. Such a trial must start as a new interpreter."""
    read_at_start = [k for k in env if k in LOCALE or (
        k.startswith("PYTHON") and k not in APPLIED)]
    refused = [k for k in read_at_start if env[k] != server_env.get(k)]
    theirs = server_env.get("PYTHONPATH", "").split(os.pathsep)
    added = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d and d not in theirs]
    if any(os.path.exists(os.path.join(d, name + end)) for d in added for name in CUSTOMIZE
           for end in (".py", os.sep + "__init__.py")):
        refused.append("PYTHONPATH")
    return sorted(refused)


