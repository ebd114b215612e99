"""Which launcher a run has: one `Launcher` per `trainer.launcher`, chosen once by `make`,
and nowhere else.

- `accelerate` (the default, `_accelerate.py`): `accelerate launch` as a new process per trial,
  exactly the command a user would type (sweep's accelerate config, the device, the options).
- `direct` (`_direct.py`): the script in one interpreter, with the variables accelerate's own
  `prepare_simple_launcher_cmd_env` gives it (computed once per options).
- `warm` (`_warm.py`): as `direct`, but each trial is a fork of a server that imported torch,
  accelerate and `trainer.preload` (`warm_server.py`); where it cannot serve, trials start as
  `direct` and the user is told why, once.
- `python` (`_accelerate.py`): `python script.py` with the device and sweep's variables,
  nothing of accelerate.

With `trainer.container`, the one chosen runs inside it (`_in_container.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweep.launch import provenance
from sweep.launch._accelerate import AccelerateLauncher, BaseLauncher, PythonLauncher
from sweep.launch._direct import DirectLauncher
from sweep.launch._in_container import ContainerLauncher
from sweep.launch._warm import WarmLauncher
from sweep.launch.launcher import Abort, Launcher, Say
from sweep.spec import Spec
from sweep.trial import Spawn, process


def accelerate_record(spec: Spec) -> dict[str, Any] | None:
    """What env.json records of the accelerate config `spec`'s trials launch with (None: the
    launcher `python` runs no accelerate)."""
    return None if spec.trainer.launcher == "python" else provenance.accelerate_record(spec)


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
