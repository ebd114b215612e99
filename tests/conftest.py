"""Shared helpers of every folder of tests/: study files in tmp_path, runs through the CLI,
reading storage back, the test trainers' and examples' paths, a figure's silent panels, a dead
driver's trial. tests/ mirrors sweep/ (`tests/<package>/test_<module>.py`; `tests/e2e/` for the
files that start real processes); test files' names are unique across its folders (pytest
imports each by its name, from its folder)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import psutil
import pytest
import yaml
from forked_cli import ForkedCli, can_fork
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep import cli
from sweep._core import names
from sweep.study.storage import checked_rdb
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep, probe_study

# Bytecode is written and reused, whatever the shell says (PYTHONDONTWRITEBYTECODE): otherwise
# every worker rewrites and compiles every test module (~8 CPU-s each) and every driver,
# trainer and probe the tests start compiles sweep again. Set before xdist starts its workers.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ROOT = Path(__file__).resolve().parent.parent
TRAINERS = ROOT / "tests" / "trainers"  # the test trainers, run as real subprocesses
EXAMPLES = ROOT / "tests" / "examples"  # scripts people already have, swept unmodified
PROBE = TRAINERS / "probe.py"


def study_dict(**sections: Any) -> dict[str, Any]:
    """A probe study (plain-python launcher); keyword sections are merged over the defaults
    (`params` replaces them)."""
    return probe_study(PROBE, **sections)


# -- in parallel: `-n 6 --dist loadgroup` (pyproject.toml's addopts, pytest-xdist) ---------
# Each worker has its own tmp_path folders, PostgreSQL server and lock dir per test. What is
# the machine's, not a folder's, runs on one worker in turn: `xdist_group("podman")` (the image
# store, container names), "slurm" (a throwaway cluster on the 2-CPU node), "postgres" (one
# server for them all), "rendezvous" (multi-process trials that take a TCP port of the
# machine's range in a lock dir of their own test). "chromium": the report's pages, in one
# browser (tests/browser.py) instead of one each. Others share one expensive answer that a
# process keeps: "summary-finished-study" (analysis/test_summary.py), "warm-server"
# (launch/test_warm.py) and "accelerate-keys" (below).


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Before xdist starts two workers or more: in a checkout whose test modules were never
    imported (a clean clone, as CI's), collect them once here, so that each worker reads what
    pytest rewrote and Python compiled (`__pycache__`) instead of all of them doing it at once.
    Best effort: only the paths given are passed on, and a collection that fails or hangs
    changes nothing (the workers collect, and say, as they would have)."""
    if (len(specs) < 2 or sys.pycache_prefix is not None
            or any((ROOT / "tests").glob("**/__pycache__/test_*.pyc"))):
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                        "-p", "no:cacheprovider", *config.args],
                       cwd=config.invocation_params.dir, env={**os.environ, "PYTEST_ADDOPTS": ""},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       check=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked slow first (in their order, then the others in theirs): workers start on
    the long ones, and the short ones fill the gaps at the end instead of a long one alone.
    Those marked grpc after all others (slow first among them too): a test process that has
    loaded gRPC starts the drivers of the tests after it as new interpreters, not as forks
    (`forked_cli.can_fork`: a fork of a process with gRPC's core loaded aborts), seconds of
    CPU each."""
    items.sort(key=lambda item: (item.get_closest_marker("grpc") is not None,
                                 item.get_closest_marker("slow") is None))


@pytest.fixture(autouse=True)
def grpc_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that loads gRPC into this process is marked grpc (see above), or it fails."""
    before = "grpc" in sys.modules
    yield
    if not before and "grpc" in sys.modules and request.node.get_closest_marker("grpc") is None:
        pytest.fail("this test loaded gRPC into the test process: mark it "
                    "@pytest.mark.grpc, so that it runs after the tests that fork drivers")


# Tests that ask this interpreter's accelerate for its config keys in the test process (a
# study with an accelerate config file; the probe imports accelerate and torch, a few CPU-s,
# and `interpreter.probe` keeps its answer for the process's life) run on one worker, which
# asks once for them all. Two others ask too, and stay out: the two-process trials' test is
# in "rendezvous" (a test has one group), and the launchers' comparison asks in its own
# worker before it forks its drivers.
ASKS_ACCELERATES_KEYS = pytest.mark.xdist_group("accelerate-keys")


@pytest.fixture(scope="session", autouse=True)
def probed_interpreter() -> None:
    """This interpreter asked about itself once per worker, as a run of a study whose script
    is in tests/trainers asks it (`interpreter.probe` keeps its answers for the process's
    life): the drivers `spawn_cli` forks from this process have the answer, instead of each
    starting the probe's interpreter again, as the runs in this process do already."""
    from sweep.launch import provenance
    from sweep.spec import interpreter

    interpreter.probe(sys.executable, modules=provenance.script_imports(TRAINERS))


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


def probes_started(study: Path, name: str = "probe") -> int:
    """How many trials of `study` (output folder `name` beside it) have a probe trainer that
    started (its `probe_start.json`: a look at files, not at the storage)."""
    return len(list((study.parent / name / "trials").glob("*/probe_start.json")))


def load_trials(path: Path, name: str = "probe") -> list[optuna.trial.FrozenTrial]:
    """The trials of study `name` beside the study file `path`; KeyError while its SQLite
    file is not made yet (opening it then would race the driver that makes it to the
    schema's tables: Optuna makes them on opening)."""
    db = path.parent / (name + ".db")
    if not made(db):
        raise KeyError(f"{db}: not made yet")
    rdb = checked_rdb(f"sqlite:///{db}", skip_table_creation=True)
    try:
        return optuna.load_study(study_name=name, storage=rdb).get_trials(deepcopy=False)
    finally:
        rdb.engine.dispose()  # closed now, not when the collector frees it (`spawn_cli`)


def made(db: Path) -> bool:
    """Whether Optuna has made the SQLite file `db` (its schema version stamped), read-only."""
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as c:
            return c.execute("select count(*) from alembic_version").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def run_cli(*args: str) -> int:
    return cli.main(list(args))


def spawn_cli(*args: str, env: dict[str, str] | None = None,
              fresh: bool = False) -> subprocess.Popen[str]:
    """`python -m sweep ARGS` as a real subprocess: a fork of this process started as the
    command would start (`forked_cli`: no interpreter to start, no imports), or a new
    interpreter: with `fresh` (where its first instants or its command line are the point)
    or while this process holds a SQLite file open beside a study file in `args`."""
    full = {**os.environ, **(env or {})}
    near = [Path(a).resolve().parent for a in args if Path(a).is_file()]
    if not fresh and not can_fork(near):
        gc.collect()  # a storage the test read and dropped holds its file until collected
    if not fresh and can_fork(near):
        return ForkedCli(args, full)
    return subprocess.Popen([sys.executable, "-m", "sweep", *args], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def assert_gone(pid: int, said: str) -> None:
    """`pid` ends within 5 s (else it is killed, and the test fails with `said`); a zombie
    that whoever it was handed to has not reaped yet (a busy machine) has ended."""
    for _ in range(250):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"{said} (pid {pid})")


def wait_until(predicate: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Whether `predicate` holds within `timeout` s, looked at every `every` s, or less often
    where one look is dear (a storage opened, every process scanned): a look takes at most a
    fifth of the time, so a wait never holds a core the processes it waits for need."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        began = time.monotonic()
        if predicate():
            return True
        time.sleep(max(every, 4 * (time.monotonic() - began)))
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


# -- figures: a panel left empty must say why (test_report, test_lineage_figures) ----------


def _numbers(values: Any) -> np.ndarray | None:
    try:
        return np.asarray(values if values is not None else [], dtype=float)
    except (TypeError, ValueError):  # categories
        return None


def draws(trace: Any) -> bool:
    """Whether a trace draws anything: a point with both coordinates, a bar not of 0."""
    x, y = _numbers(trace.x), _numbers(trace.y)
    if trace.type == "bar":
        heights = x if trace.orientation == "h" else y
        return heights is not None and bool((np.nan_to_num(heights) != 0).any())
    if x is None or y is None:
        known = y if x is None else x
        return known is not None and bool(np.isfinite(known).any())
    return bool((np.isfinite(x) & np.isfinite(y)).any())


def silent_panels(fig: Any) -> list[str]:
    """What in `fig` is empty without a sentence saying why: each subplot (by its x-axis)
    that no trace draws in and no note sits in, each legend entry that draws nothing."""
    layout = fig.layout.to_plotly_json()
    if not fig.data:  # a figure of one note
        return [] if layout.get("annotations") else ["the figure"]
    notes = {a["xref"].split()[0] for a in layout.get("annotations", [])
             if a.get("xref", "").endswith(" domain")}
    silent = []
    for key in sorted(k for k in layout if re.fullmatch(r"xaxis\d*", k)):
        axis = "x" + key[5:]
        if axis not in notes and not any(draws(t) for t in fig.data
                                         if (t.xaxis or "x") == axis):
            silent.append(f"subplot {axis}")
    silent += [f"legend entry {t.name}" for t in fig.data
               if t.name and t.showlegend is not False and not draws(t)]
    return silent


# -- a dead driver's trial left RUNNING (test_reclaim, test_savings) ------------------------


def with_orphan(tmp_path: Path, live: Any = lambda clock: [], guard: int | None = None,
                locked_until: float = 0.0, n_trials: int = 1,
                **sections: Any) -> tuple[Sweep, list[Any]]:
    """A sweep whose study holds trial 0, RUNNING, of a dead driver of this host, whose
    processes are `live(clock)` (`guard`: the pid of the one that is its guard); its
    lineage's lock is held until `locked_until`. Returns it and the signals the reclaimer
    sent (test_reclaim's `Leftover`s are such processes)."""
    s = Sweep(tmp_path, lambda p: Script(runs=1.0, result={"score": p["x"]}), gpus=1,
              study={"n_trials": n_trials}, **sections)
    folder = str(s.spec.output_dir / "trials" / "0")
    s.store.study.add_trial(optuna.trial.create_trial(
        state=TrialState.RUNNING, params={"x": 0.5},
        distributions={"x": FloatDistribution(0.0, 1.0)},
        user_attrs={names.OWNER: {"host": "test-host", "pid": os.getpid(), "started": 1.0,
                              "gpu": 0, "dir": folder}, names.ATTEMPT: 0}))
    sent: list[Any] = []
    procs: list[Any] = live(s.clock)

    def send(found: list[Any], sig: int) -> list[int]:
        sent.append((s.clock.t, signal.Signals(sig).name, sorted(p.pid for p in found)))
        for p in found:
            p.signal(sig)
        return [p.pid for p in found]

    reclaim = s.driver.reclaim
    reclaim.find = lambda d: [p for p in procs if p.alive] if d == folder else []  # type: ignore
    reclaim.is_guard = lambda p: p.pid == guard  # type: ignore[assignment,attr-defined]
    reclaim.send = send  # type: ignore[assignment]
    reclaim.locked = lambda out, origin: origin == 0 and s.clock.t < locked_until
    return s, sent
