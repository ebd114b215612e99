"""The driver's loop on fakes: a study file, an in-memory study (or the file's own storage),
fake devices, `FakeSpawn` processes on a `FakeClock`, and what the driver did with them, in
milliseconds.

    s = Sweep(tmp_path, lambda params: Script(runs=1.0, result={"score": params["x"]}),
              gpus=2, study={"n_trials": 5})
    assert s.run() == 0 and s.states() == ["COMPLETE"] * 5

A study that holds trials before the driver starts is given them:
`Sweep(..., trials=[optuna.trial.create_trial(...)])`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial

from sweep.gpus.monitor import Monitor
from sweep.gpus.pool import Pool, fake_devices
from sweep.runner.driver import Driver
from sweep.spec import config, searchspace
from sweep.study.attrs import Owner
from sweep.study.connect import connect
from sweep.study.store import Store
from sweep.testing.fakes import FakeClock, FakeSpawn, Script

TrialScript = Callable[[dict[str, Any]], Script]

FAKE_TRAINER = "fake_trainer.py"  # written beside the study file; FakeSpawn never runs it


def probe_study(script: Path | str, **sections: Any) -> dict[str, Any]:
    """A study of `script` on the plain-python launcher: 4 trials of one float `x` in [0, 1],
    random sampler seeded 0. Keyword sections are merged over these defaults (`params`
    replaces them)."""
    base: dict[str, Any] = {
        "study": {"name": "probe", "direction": "minimize", "metric": "score", "n_trials": 4,
                  "sampler": {"type": "random", "seed": 0}, "heartbeat_interval": 2},
        "trainer": {"script": str(script), "launcher": "python", "grace_period": 1.0},
        "gpus": {"sample_interval": 0.2},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }
    for key, value in sections.items():
        if key != "params" and isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


class Sweep:
    """A driver on fakes (the study file `folder/study.yaml` of `probe_study`, its study in
    memory, `gpus` fake devices, `script` deciding what each trial's process does), and what
    it did. `reader`: an NVML reader for a monitor (none by default). `trials`: the study's
    stored trials before the driver starts (`optuna.trial.create_trial`); `on_file`: the study
    in the study file's own storage (SQLite beside it), opened as a run opens it, so that what
    `sweep run --dry-run` and the budget read is what the driver runs."""

    def __init__(self, folder: Path, script: TrialScript, gpus: int = 2,
                 reader: Any = None, trials: Sequence[FrozenTrial] = (), on_file: bool = False,
                 **sections: Any) -> None:
        trainer = folder / FAKE_TRAINER
        trainer.write_text('"""A trainer the fake processes stand in for; never run."""\n')
        path = folder / "study.yaml"
        path.write_text(yaml.safe_dump(probe_study(trainer, **sections), sort_keys=False))
        self.spec = config.load(path)
        owner = Owner("test-host", os.getpid(), 0.0)
        if on_file:
            self.store = connect(self.spec, owner)
        else:
            storage = optuna.storages.InMemoryStorage()
            study = optuna.create_study(
                storage=storage,
                sampler=searchspace.build_sampler(self.spec.study.sampler, self.spec.searched),
                pruner=searchspace.build_pruner(self.spec.study.pruner),
                directions=self.spec.study.objective_directions,
            )
            self.store = Store(study, storage, owner, self.spec.study.reclaim_seconds,
                               grid=self.spec.study.sampler.type == "grid")
        for trial in trials:
            self.store.study.add_trial(trial)
        self.clock = FakeClock()
        self.spawn = FakeSpawn(self.clock, script)
        self.pool = Pool(fake_devices(str(gpus)), self.spec.gpus.trials_per_gpu,
                         width=self.spec.trainer.gpus_per_trial)
        monitor = None
        if reader is not None:
            monitor = Monitor(reader, self.pool, folder / "samples.csv", 3600,
                              clock=self.clock.now, on_sick=self.clock.wake)
        self.driver = Driver(self.spec, self.store, self.pool, monitor,
                             spawn=self.spawn, clock=self.clock)

    def run(self) -> int:
        """Run the driver to its end; its exit code."""
        return self.driver.run().exit_code

    def again(self) -> None:
        """A new driver for another run of the same study, on the same storage, devices and
        clock (not started: `run` runs it)."""
        self.driver = Driver(self.spec, self.store, self.pool, spawn=self.spawn,
                             clock=self.clock)

    def rerun(self) -> int:
        """Another run of the same study (`again`) to its end; its exit code."""
        self.again()
        return self.run()

    @property
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.store.study.get_trials(deepcopy=False)

    def states(self) -> list[str]:
        return [t.state.name for t in self.trials]


def capture_messages(s: Sweep) -> list[str]:
    """The messages the driver gives the user, as it gives them."""
    said: list[str] = []
    s.driver.events.message = said.append  # type: ignore[method-assign,assignment]
    return said
