"""Several drivers share one study through PostgreSQL (a throwaway server on loopback)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import spawn_cli, study_dict

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """Start a PostgreSQL 15 server for this module; stop it and remove its files after."""
    if shutil.which("initdb") is None:
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are not on PATH")
    home = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    data, sock = home / "data", home / "sock"
    sock.mkdir()
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        shutil.chown(home, "postgres")
        shutil.chown(sock, "postgres")
        home.chmod(0o755)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run([*as_postgres, "initdb", "-D", str(data), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)
    subprocess.run([*as_postgres, "pg_ctl", "-D", str(data), "-l", str(home / "log"),
                    "-o", f"-p {port} -k {sock} -h 127.0.0.1", "-w", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def test_two_drivers_share_one_study_to_its_budget(postgres_url, write_study):
    data = study_dict(study={"n_trials": 8, "storage": postgres_url, "name": "shared"},
                      trainer={"args": ["--sleep", "0.5"]})
    a = write_study(data, name="a.yaml")
    data["study"]["output_dir"] = "host-b"
    b = write_study(data, name="b.yaml")
    drivers = [spawn_cli("run", str(path), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": host})
               for path, host in ((a, "host-a"), (b, "host-b"))]  # two hosts, two pools
    for d in drivers:
        _, err = d.communicate(timeout=180)
        assert d.returncode == 0, err

    trials = optuna.load_study(study_name="shared", storage=postgres_url).trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert 8 <= len(complete) <= 8 + 3  # both may start the last free slots at once
    assert not [t for t in trials if t.state.name == "RUNNING"]
    pids = {t.user_attrs["owner"]["pid"] for t in complete}
    assert len(pids) == 2, "both drivers ran trials"
    assert len({t.number for t in trials}) == len(trials)


def test_a_bad_postgres_password_is_not_printed(write_study, capsys):
    from conftest import run_cli

    path = write_study(study={"storage": "postgresql://u:s3cret@127.0.0.1:1/none"})
    os.environ["SWEEP_FAKE_GPUS"] = "1"
    try:
        code = run_cli("run", str(path))
    finally:
        del os.environ["SWEEP_FAKE_GPUS"]
    assert code == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and err.count("\n") == 1
    assert "study.storage: cannot open postgresql://u:***@127.0.0.1:1/none" in err


@pytest.mark.slow
def test_three_drivers_on_one_postgres_study_spend_exactly_its_budget(postgres_url,
                                                                      write_study):
    from test_budget import check_exact, three_drivers_at_once

    three_drivers_at_once(write_study, storage=postgres_url, name="three")
    check_exact(optuna.load_study(study_name="three", storage=postgres_url).trials)
