"""Any launcher's trials inside a container of `trainer.container.image` (`ContainerLauncher`):
the image pinned to its ID once per run, the lineage kept in the image it started in, the
study's containers that outlived their trials removed when the run starts and ends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.gpus import FAKE_ENV
from sweep.launch import _container, _engine
from sweep.launch._accelerate import BaseLauncher
from sweep.launch.launcher import Say
from sweep.spec import Spec
from sweep.spec import container as containerspec
from sweep.trial import LaunchPlan, Process, Start, lineage

END_PATIENCE = 10.0  # s the run's end waits for a trial's tree to end, to remove its container


class ContainerLauncher:
    """Another launcher's trials, each inside a container of `trainer.container.image`
    (`sweep.launch._container`): the image pinned to its ID once per run, the lineage kept in the
    image it started in, the study's containers that outlived their trials removed when the run
    starts and ends (`_engine.reclaim`)."""

    def __init__(self, inner: BaseLauncher, spec: Spec, say: Say) -> None:
        assert spec.trainer.container is not None
        self.inner, self.spec, self._say = inner, spec, say
        self.container = spec.trainer.container
        self.image: _container.Image | None = None
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

    def _pin(self) -> _container.Image:
        image = _engine.pin(self.container, self.study_dir)
        engine_name = self.container.engine or "podman"
        if containerspec.floats(self.container.image, engine_name):
            self._say(f"trainer.container.image {self.container.image} names a tag that "
                      "moves (latest): a rerun, or a trial carried on later, may get another "
                      f"image; this run pins {image.id}. Give a fixed tag (name:1.2) or a "
                      "digest (name@sha256:...)")
        moved = _engine.moved_since(self.spec.output_dir, image)
        if moved is not None:
            self._say(f"trainer.container.image {image.ref} is {image.id} now; the study's "
                      f"last run had {moved}: the tag moved")
        return image

    def reclaim(self) -> None:
        removed = _engine.reclaim(self.container, self.spec.study.name, self.spec.output_dir)
        if removed:
            self._say(f"removed {len(removed)} container(s) left by trials that no longer "
                      f"run: {', '.join(removed)}")

    def get_ready(self) -> None:
        self.inner.get_ready()

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """The inner launcher's plan, run inside the image (`_container.wrap`); ImageRefused
        when it would carry on a lineage in another image than its own."""
        image = self.image or _engine.pin(self.container, self.study_dir)
        plan = self.inner.plan(number, params, device, pin, port, start)
        if start is not None:
            why = lineage.image_refusal(start, lineage.started_in(start), image.id,
                                        self.container.continue_in_other_image)
            if why is not None:
                raise _engine.ImageRefused(why)
        study_dir = self.study_dir
        checkpoint = start.checkpoint_dir if start is not None else lineage.checkpoint_dir(
            self.spec.output_dir, number)
        simulated = os.environ.get(FAKE_ENV) is not None
        devices = None if simulated else (pin or str(device)).split(",")
        mounted = [study_dir, plan.paths.dir, checkpoint]
        named = [self.inner.config.path] if self.inner.through_accelerate else []
        if self.spec.trainer.script is not None:
            named.append(Path(self.spec.trainer.script))
        files = _container.outside(named, mounted)
        return _container.wrap(
            plan, self.container, image, _container.container_name(self.spec.study.name, number),
            study_dir, checkpoint, _container.workdir_for(plan.cwd, Path.cwd(), study_dir),
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
        image = self.image or _engine.pin(self.container, self.study_dir)
        start = Start(Path(plan.env[lineage.CHECKPOINT_ENV]))
        lineage.record_image(start, image.id)
        name = _container.container_name(self.spec.study.name, int(plan.paths.dir.name))

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
                _engine.remove(self.container, name)

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
        except _engine.ImageError as e:
            self._say(f"could not look for containers left running: {e}")
