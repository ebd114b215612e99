"""Launcher `warm`: `direct`'s plans, each trial started as a fork of a server that imported
torch, accelerate and `trainer.preload` (`warm_server`, through `warm_client.WarmServer`);
`direct` itself wherever the server cannot serve (another interpreter, an untested Python, a
preload that initialised CUDA or left threads, an environment a fork cannot take), the user
told why, once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sweep.launch._direct import DirectLauncher
from sweep.launch._warm_client import WarmNotYet, WarmServer, cannot_take, server_modules
from sweep.launch.launcher import Abort, Say
from sweep.launch.warm_server import TESTED_PYTHONS, WarmError
from sweep.protocol import TRIAL_DIR_ENV
from sweep.spec import Spec, interpreter
from sweep.trial import LaunchPlan, Process, Spawn, process

WARM_WAIT = 30.0  # how long the first trial waits for the warm server's imports


class WarmLauncher(DirectLauncher):
    """`direct`'s plans, each started as a fork of a server that imported the trainers'
    modules; `direct` itself whenever the server cannot serve (the user is told why, once)."""


    def __init__(self, spec: Spec, host: str, own: Path, say: Say, abort: Abort,
                 spawn: Spawn = process.TrialProcess, dry: bool = False,
                 python: tuple[int, int] = sys.version_info[:2]) -> None:
        """Starts the server (it imports while the rest of the run gets ready), unless `dry`
        or `spawn` is not `process.TrialProcess` (a test's spawn starts its own kind of
        process), or this Python is not one the fork's imitation of a new interpreter was
        tested on. `say` tells the user; `abort()` true (the run is stopping) ends waits."""
        super().__init__(spec, host, spawn, dry)
        self._say, self._abort = say, abort
        self._said: set[str] = set()
        self.server: WarmServer | None = None
        if dry:
            return
        if other_interpreter(spec.trainer.python):
            self._drop(f"trainer.python is another interpreter ({spec.trainer.python}) than "
                       "the driver's, whose fork server it cannot be")
            return
        if python not in TESTED_PYTHONS:
            tested = ", ".join(f"{a}.{b}" for a, b in TESTED_PYTHONS)
            self._drop(f"its fork server imitates a new interpreter of Python {tested}, and "
                       f"this is {python[0]}.{python[1]}")
            return
        if spawn is not process.TrialProcess:
            return
        try:
            self.server = WarmServer(server_modules(spec.trainer.preload),
                                     {**os.environ, TRIAL_DIR_ENV: str(own / "warm")},
                                     own / "warm.log", abort=abort)
        except OSError as e:
            self._drop(f"cannot start its fork server: {e}")

    def header(self) -> list[str]:
        return [*super().header(),
                "# launcher warm: each runs as a fork of the warm server, with this environment"]

    def get_ready(self) -> None:
        self._ready()

    def _ready(self) -> WarmServer | None:
        """The server once it is ready; None while it cannot serve. The first trial waits
        `WARM_WAIT` s for its imports; later ones only look."""
        if self.server is None:
            return None
        fresh = self.server.hello is None
        try:
            hello = self.server.ready(0.0 if "slow" in self._said else WARM_WAIT,
                                      abort=self._abort)
        except WarmNotYet:
            if not self._abort():
                self._once("slow", f"launcher: warm: the fork server is still importing "
                           f"{', '.join(self.server.preload)} after {WARM_WAIT:.0f} s (see "
                           f"{self.server.log}): trials start as launcher: direct until it is "
                           "ready")
            return None
        except WarmError as e:
            self._drop(str(e))
            return None
        if fresh:
            for name, error in hello["failed"].items():
                self._say(f"launcher: warm: could not preload {name} ({error}); trials "
                          "import it themselves")
            if hello["cuda"]:
                self._drop("importing the preloaded modules initialised CUDA, which a fork "
                           "cannot use (see docs/explanation/launchers.md)")
                return None
            if hello.get("threads"):
                self._drop(f"importing the preloaded modules left threads running "
                           f"({', '.join(hello['threads'])}): a fork would find their locks "
                           "held forever")
                return None
            if "slow" in self._said:
                self._say("launcher: warm: the fork server is ready; trials start as its forks")
        return self.server

    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process:
        server = self._ready()
        refused = cannot_take(plan.env, os.environ) if server is not None else []
        if refused:
            names = ", ".join("PYTHONPATH (a sitecustomize there)" if k == "PYTHONPATH" else k
                              for k in refused)
            self._once("env", f"launcher: warm: trainer.env sets {names}, which python acts "
                       "on once as it starts, so a fork cannot take it: those trials start "
                       "as launcher: direct")
        elif server is not None:
            try:
                return self._spawn(plan, grace, on_change, hold=hold, server=server)
            except WarmError as e:
                self._drop(str(e))
        return self._spawn(plan, grace, on_change, hold=hold)

    def _once(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._say(text)

    def _drop(self, why: str) -> None:
        """The server cannot serve: say why, end it; trials start as `direct` from now on."""
        self._say(f"launcher: warm: {why}; starting trials as launcher: direct")
        if self.server is not None:
            self.server.close(wait=0.0)
            self.server = None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def other_interpreter(python: str | None) -> bool:
    """Whether `trainer.python` names an interpreter other than the driver's own (another
    venv of the same Python is another one: its packages differ)."""
    if python is None:
        return False
    found = interpreter.probe(python)
    return (found.prefix, found.executable) != (sys.prefix, sys.executable)
