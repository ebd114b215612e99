"""Shared helpers: study files in tmp_path, runs through the CLI, reading storage back."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
import yaml

from sweep import cli
from sweep.testing.harness import probe_study

PROBE = Path(__file__).parent / "trainers" / "probe.py"
ROOT = Path(__file__).resolve().parent.parent


def study_dict(**sections: Any) -> dict[str, Any]:
    """A probe study (plain-python launcher); keyword sections are merged over the defaults
    (`params` replaces them)."""
    return probe_study(PROBE, **sections)


# -- in parallel: `-n 4 --dist loadgroup` (pyproject.toml's addopts, pytest-xdist) ---------
# Each worker has its own tmp_path folders, PostgreSQL server and lock dir per test. What is
# the machine's, not a folder's, runs on one worker in turn: `xdist_group("podman")` (the image
# store, container names), "slurm" (a throwaway cluster on the 2-CPU node), "postgres" (one
# server for them all), "rendezvous" (multi-process trials that take a TCP port of the
# machine's range in a lock dir of their own test).


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked slow first (in their order, then the others in theirs): workers start on
    the long ones, and the short ones fill the gaps at the end instead of a long one alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def own_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's sweeps lease devices among themselves only (not with other tests)."""
    locks = tmp_path / "locks"
    monkeypatch.setenv("SWEEP_LOCK_DIR", str(locks))
    return locks


@pytest.fixture
def write_study(tmp_path: Path) -> Callable[..., Path]:
    def write(
        data: dict[str, Any] | str | None = None, name: str = "study.yaml", **kw: Any
    ) -> Path:
        path = tmp_path / name
        if isinstance(data, str):
            path.write_text(data)
        else:
            path.write_text(yaml.safe_dump(data if data is not None else study_dict(**kw),
                                           sort_keys=False))
        return path

    return write


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    def use(n: int) -> None:
        monkeypatch.setenv("SWEEP_FAKE_GPUS", str(n))

    use(2)
    return use


def load_trials(path: Path, name: str = "probe") -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{path.parent / (name + '.db')}"
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def run_cli(*args: str) -> int:
    return cli.main(list(args))


def spawn_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`python -m sweep ARGS` as a real subprocess."""
    return subprocess.Popen(
        [sys.executable, "-m", "sweep", *args], env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line or environment mentions `text` (e.g. tmp_path)."""
    found = []
    for p in psutil.process_iter(["cmdline", "pid", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        try:
            if text in " ".join(p.info["cmdline"] or []) or any(
                text in v for v in p.environ().values()
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One throwaway PostgreSQL 15 server for the whole session (under pytest-xdist, one per
    worker: each picks a free port and its own folder), stopped and removed after. Tests take
    `postgres_url`, a database of their own on it."""
    from sweep.testing.postgres import throwaway_postgres

    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server, this test's own."""
    import psycopg

    name = f"t{next(_DATABASES)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.rsplit("/", 1)[0] + "/" + name


_DATABASES = itertools.count()
