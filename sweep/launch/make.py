"""How a trial starts: one `Launcher` per `trainer.launcher`, chosen once by `make`.

A launcher plans a trial (argv, environment and files, from the spec and the trial's inputs:
`plan`, pure once the launcher is ready), spawns it under its guard (`spawn`, a
`process.Process`) and ends what it holds (`close`). The driver and the dry run only call
these; which launcher a run has is decided in `make`, and nowhere else.

- `accelerate` (the default): `accelerate launch` as a new process per trial, exactly the
  command a user would type (sweep's accelerate config, the device, the options).
- `direct`: the script in one interpreter, with the variables accelerate's own
  `prepare_simple_launcher_cmd_env` gives it (`accelenv`, computed once per options).
- `warm`: as `direct`, but each trial is a fork of a server that imported torch, accelerate
  and `trainer.preload` (`sweep.launch.warm_server`); where it cannot serve, trials start as
  `direct` and the user is told why, once.
- `python`: `python script.py` with the device and sweep's variables, nothing of accelerate.

`accelerate`, `direct` and `python`, and the `Launcher` contract, are in
`sweep.launch.accelerate`; here are `warm`, the container wrapper and `make`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.gpus.pool import FAKE_ENV
from sweep.launch import container, engine, provenance
from sweep.launch.accelerate import (
    AccelerateLauncher,
    BaseLauncher,
    DirectLauncher,
    Launcher,
    PythonLauncher,
)
from sweep.launch.warm_client import WarmNotYet, WarmServer, cannot_take, server_modules
from sweep.launch.warm_server import TESTED_PYTHONS, WarmError
from sweep.protocol import TRIAL_DIR_ENV
from sweep.spec import container as containerspec
from sweep.spec import interpreter
from sweep.spec.schema import Spec
from sweep.trial import lineage, process
from sweep.trial.launch_plan import LaunchPlan
from sweep.trial.lineage import Start
from sweep.trial.process import Process, Spawn

WARM_WAIT = 30.0  # how long the first trial waits for the warm server's imports

Say = Callable[[str], None]
Abort = Callable[[], bool]


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


END_PATIENCE = 10.0  # s the run's end waits for a trial's tree to end, to remove its container


class ContainerLauncher:
    """Another launcher's trials, each inside a container of `trainer.container.image`
    (`sweep.launch.container`): the image pinned to its ID once per run, the lineage kept in the
    image it started in, the study's containers that outlived their trials removed when the run
    starts and ends (`engine.reclaim`)."""

    def __init__(self, inner: BaseLauncher, spec: Spec, say: Say) -> None:
        assert spec.trainer.container is not None
        self.inner, self.spec, self._say = inner, spec, say
        self.container = spec.trainer.container
        self.image: container.Image | None = None
        self._ended: dict[str, Process] = {}  # container name -> its trial's process, until
        # it ended (and its container was removed if the engine could not: `_remove_if_ended`)
        self._lock = threading.Lock()  # removals run on reader threads and at close

    @property
    def study_dir(self) -> Path:
        return self.spec.source.parent

    def prepare(self) -> None:
        """The inner launcher's, then: the study's leftover containers removed, the image
        pinned (a moved tag or `latest` said, once)."""
        self.inner.prepare()
        self.reclaim()
        self.image = self._pin()

    def _pin(self) -> container.Image:
        image = engine.pin(self.container, self.study_dir)
        engine_name = self.container.engine or "podman"
        if containerspec.floats(self.container.image, engine_name):
            self._say(f"trainer.container.image {self.container.image} names a tag that "
                      "moves (latest): a rerun, or a trial carried on later, may get another "
                      f"image; this run pins {image.id}. Give a fixed tag (name:1.2) or a "
                      "digest (name@sha256:...)")
        moved = engine.moved_since(self.spec.output_dir, image)
        if moved is not None:
            self._say(f"trainer.container.image {image.ref} is {image.id} now; the study's "
                      f"last run had {moved}: the tag moved")
        return image

    def reclaim(self) -> None:
        removed = engine.reclaim(self.container, self.spec.study.name, self.spec.output_dir)
        if removed:
            self._say(f"removed {len(removed)} container(s) left by trials that no longer "
                      f"run: {', '.join(removed)}")

    def get_ready(self) -> None:
        self.inner.get_ready()

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """The inner launcher's plan, run inside the image (`container.wrap`); ImageRefused
        when it would carry on a lineage in another image than its own."""
        image = self.image or engine.pin(self.container, self.study_dir)
        plan = self.inner.plan(number, params, device, pin, port, start)
        if start is not None:
            why = lineage.image_refusal(start, lineage.started_in(start), image.id,
                                        self.container.continue_in_other_image)
            if why is not None:
                raise engine.ImageRefused(why)
        study_dir = self.study_dir
        checkpoint = start.checkpoint_dir if start is not None else lineage.checkpoint_dir(
            self.spec.output_dir, number)
        simulated = os.environ.get(FAKE_ENV) is not None
        devices = None if simulated else (pin or str(device)).split(",")
        mounted = [study_dir, plan.paths.dir, checkpoint]
        named = [self.inner.config.path] if self.inner.through_accelerate else []
        if self.spec.trainer.script is not None:
            named.append(Path(self.spec.trainer.script))
        files = container.outside(named, mounted)
        return container.wrap(
            plan, self.container, image, container.container_name(self.spec.study.name, number),
            study_dir, checkpoint, container.workdir_for(plan.cwd, Path.cwd(), study_dir),
            self.spec.output_dir, devices, files, containerspec.mounts(self.container, study_dir))

    def note(self, params: Mapping[str, Any]) -> str | None:
        return self.inner.note(params)

    def header(self) -> list[str]:
        ref = self.container.image if self.image is None else f"{self.image.ref} ({self.image.id})"
        return [*self.inner.header(),
                f"# in a container: {self.container.engine or 'podman'}, image {ref}"]

    def spawn(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
              hold: Sequence[int] = ()) -> Process:
        """The engine's command under its guard, once the lineage's image is recorded. When
        the trial's tree ended by a signal (its guard killed the engine's command and monitor:
        the engine's own `--rm` did not run), its container is removed then, from the
        process's reader thread."""
        image = self.image or engine.pin(self.container, self.study_dir)
        start = Start(Path(plan.env[lineage.CHECKPOINT_ENV]))
        lineage.record_image(start, image.id)
        name = container.container_name(self.spec.study.name, int(plan.paths.dir.name))

        def changed() -> None:
            on_change()
            self._remove_if_ended(name)

        proc = self.inner.spawn(plan, grace, changed, hold)
        with self._lock:
            self._ended[name] = proc
        self._remove_if_ended(name)  # it may have ended before it was registered
        return proc

    def _remove_if_ended(self, name: str) -> None:
        """Remove trial `name`'s container once, if its tree ended by a signal (the engine's
        own `--rm` did not run); from a reader thread as it ends, or at `close`."""
        with self._lock:  # one removal at a time: podman's own store lock serialises them too
            proc = self._ended.get(name)
            if proc is None or not proc.ended:
                return
            del self._ended[name]
            if proc.lost or proc.exit_code is None or proc.exit_code >= 128:
                engine.remove(self.container, name)

    def close(self) -> None:
        """The inner launcher's, then the containers of ended trials not removed yet, then
        the run's containers that outlived their trials."""
        self.inner.close()
        with self._lock:
            left = list(self._ended.items())  # what a reader thread has not removed yet
        for name, proc in left:
            proc.wait(END_PATIENCE)  # a trial killed at the run's end: its tree is ending
            self._remove_if_ended(name)
        try:
            self.reclaim()
        except engine.ImageError as e:
            self._say(f"could not look for containers left running: {e}")


def accelerate_record(spec: Spec) -> dict[str, Any] | None:
    """What env.json records of the accelerate config `spec`'s trials launch with (None: the
    launcher `python` runs no accelerate)."""
    return None if spec.trainer.launcher == "python" else provenance.accelerate_record(spec)


def other_interpreter(python: str | None) -> bool:
    """Whether `trainer.python` names an interpreter other than the driver's own (another
    venv of the same Python is another one: its packages differ)."""
    if python is None:
        return False
    found = interpreter.probe(python)
    return (found.prefix, found.executable) != (sys.prefix, sys.executable)


def make(spec: Spec, host: str, own: Path, say: Say = lambda _: None,
         abort: Abort = lambda: False, spawn: Spawn = process.TrialProcess,
         dry: bool = False) -> Launcher:
    """The launcher `spec.trainer.launcher` names, for a run (or, `dry`, a dry run: nothing
    is started or computed). Settings of other launchers are named to the user (`say`)."""
    trainer = spec.trainer
    if not dry and trainer.preload and trainer.launcher != "warm":
        say(f"trainer.preload is for launcher: warm; launcher is {trainer.launcher}: nothing "
            "is preloaded")
    if not dry and "fork_launcher" in trainer.model_fields_set:
        say("trainer.fork_launcher is no longer used: every trial starts as a new process "
            "(launcher: warm is the fast path for trials of seconds); remove it from the "
            "study file")
    launcher: Launcher
    if trainer.launcher == "warm":
        launcher = WarmLauncher(spec, host, own, say, abort, spawn, dry)
    elif trainer.launcher == "direct":
        launcher = DirectLauncher(spec, host, spawn, dry)
    elif trainer.launcher == "python":
        launcher = PythonLauncher(spec, spawn)
    else:
        launcher = AccelerateLauncher(spec, spawn)
    merged = getattr(launcher, "merged", None)
    if not dry and merged is not None:
        for note in merged.notes:
            say(note)
    if trainer.container is not None and isinstance(launcher, BaseLauncher):
        return ContainerLauncher(launcher, spec, say)
    return launcher
