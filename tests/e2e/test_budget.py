"""Several drivers on one study spend exactly its budget: the check and the ask that spends
it happen under one lock every driver of the study shares (issue 12)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, load_trials, spawn_cli, study_dict

from sweep._core import names
from sweep.spec import config
from sweep.study.attrs import Owner
from sweep.study.connect import connect
from sweep.study.store import Store

# each run of three real drivers is one more chance for an unforced race; the race itself is
# forced open in test_the_window_between_the_budget_check_and_the_ask_is_closed
ATTEMPTS = int(os.environ.get("SWEEP_STRESS_ROUNDS", "1"))
BASELINES = [{"x": 0.25}, {"x": 0.5}]


def three_drivers_at_once(write_study, storage: str | None = None, name: str = "shared") -> Any:
    """Three drivers (three hosts, 2 simulated GPUs each: 6 slots) on a budget of 7, started
    together, the study queueing two baselines (`study.enqueue`)."""
    sections: dict[str, Any] = {"n_trials": 7, "name": name, "enqueue": BASELINES}
    if storage:
        sections["storage"] = storage
    study = write_study(study_dict(study=sections, trainer={"args": ["--sleep", "0.3"]}))
    drivers = [spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": f"h{i}"})
               for i in range(3)]
    for d in drivers:
        _, err = d.communicate(timeout=180)
        assert d.returncode == 0, err
    return study


def check_exact(trials: list) -> None:
    """Exactly the budget, shared by the drivers, no params twice, each baseline run once."""
    assert [t.state.name for t in trials] == ["COMPLETE"] * 7, [t.state.name for t in trials]
    assert len({t.user_attrs[names.HOST] for t in trials}) >= 2  # the drivers shared the work
    xs = [t.params["x"] for t in trials]
    assert len(set(xs)) == 7, xs  # no params twice
    assert all(xs.count(b["x"]) == 1 for b in BASELINES), xs  # each queued by one driver only


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(ATTEMPTS))
def test_three_drivers_on_one_sqlite_study_spend_exactly_its_budget(write_study, attempt):
    study = three_drivers_at_once(write_study)
    check_exact(load_trials(study, "shared"))


def test_the_budget_lock_serialises_drivers_of_one_study(write_study):
    import threading
    import time

    spec = config.load(write_study())
    a = connect(spec, Owner("a", 1, 0), 60)
    b = connect(spec, Owner("b", 2, 0), 60)
    order = []

    def hold(store: Store, name: str) -> None:
        with store.budget_lock():
            order.append(f"{name} in")
            time.sleep(0.2)
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=(a, "a"))
    first.start()
    time.sleep(0.05)
    hold(b, "b")
    first.join()
    assert order == ["a in", "a out", "b in", "b out"]


def test_the_window_between_the_budget_check_and_the_ask_is_closed(write_study, fake_gpus,
                                                                   monkeypatch):
    """Three drivers in threads of one process, each asking slowly (0.2 s inside `ask`):
    without the lock, drivers that saw "one left" at the same moment all started it."""
    import threading
    import time

    from sweep.gpus.pool import Pool, fake_devices
    from sweep.runner.driver import Driver

    real_ask = Store.ask

    def slow_ask(self, *args, **kwargs):
        time.sleep(0.2)
        return real_ask(self, *args, **kwargs)

    monkeypatch.setattr(Store, "ask", slow_ask)
    spec = config.load(write_study(study={"n_trials": 5},
                                   trainer={"args": ["--sleep", "0.2"]}))
    drivers = []
    for host in ("a", "b", "c"):
        store = connect(spec, Owner(host, 1, 0), 60)
        drivers.append(Driver(spec, store, Pool(fake_devices("2"))))
    threads = [threading.Thread(target=d.run) for d in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    trials = load_trials(spec.source)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5  # exactly the budget


@pytest.mark.slow
def test_drivers_starting_together_run_each_grid_point_once(write_study):
    """Three drivers started together on a grid of five points run each point once (each
    enqueued trial once: check_exact, in every three-drivers test)."""
    grid = write_study(study_dict(
        study={"n_trials": 20, "name": "grid", "sampler": {"type": "grid"}},
        trainer={"args": ["--sleep", "0.2"]},
        params={"x": {"type": "categorical", "choices": [0.1, 0.2, 0.3, 0.4, 0.5]}}),
        name="grid.yaml")
    drivers = [spawn_cli("run", str(grid), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": f"h{i}"})
               for i in range(3)]
    for d in drivers:
        _, err = d.communicate(timeout=180)
        assert d.returncode == 0, err
    points = [t.params["x"] for t in load_trials(grid, "grid")]
    assert sorted(points) == [0.1, 0.2, 0.3, 0.4, 0.5]  # every point once, none twice


def test_drivers_queueing_the_same_baseline_at_once_queue_it_once(write_study, monkeypatch):
    """The window between "is it in the study yet?" and the queueing, forced open: each
    driver queues `study.enqueue`'s next entry under the budget lock, as before its ask."""
    import threading
    import time

    import optuna

    real = optuna.Study.enqueue_trial

    def slow(self, *args, **kwargs):
        time.sleep(0.2)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "enqueue_trial", slow)
    spec = config.load(write_study())
    stores = [connect(spec, Owner(h, 1, 0), 60) for h in "abc"]

    def queue(store) -> None:
        with store.budget_lock():
            store.enqueue_next([{"x": 0.25}])

    threads = [threading.Thread(target=queue, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    waiting = stores[0].study.get_trials(deepcopy=False)
    assert len(waiting) == 1 and waiting[0].state.name == "WAITING"


def test_the_files_a_run_of_a_shipped_study_writes_beside_it_are_git_ignored():
    """Issue 32: `studies/*.db.lock`, the budget lock beside a shipped study's database,
    showed up in `git status` after a run."""
    import shutil
    import subprocess

    import optuna

    from sweep.study import budget

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = []
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        spec = config.load(path, runnable=False)
        target = budget.target_of(spec.storage, optuna.storages.InMemoryStorage())
        assert target is not None and target.kind == "file", path
        lock = Path(target.where).relative_to(ROOT)
        written += [str(lock), str(lock).removesuffix(".lock")]
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written],
                             capture_output=True, text=True, check=False).stdout.split()
    assert sorted(written) == sorted(ignored)
