"""Several drivers share one study through PostgreSQL (a throwaway server on loopback, one for
the session: conftest's `postgres_url` is a database of its own for each test)."""

from __future__ import annotations

import os

import optuna
import pytest
from conftest import spawn_cli, study_dict

from sweep._core import names

pytestmark = [pytest.mark.slow,
              pytest.mark.xdist_group("postgres")]  # one server for them all (conftest)


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
    assert "study.storage: cannot read postgresql://u:***@127.0.0.1:1/none" in err


def test_three_drivers_on_one_postgres_study_spend_exactly_its_budget(postgres_url,
                                                                      write_study, tmp_path):
    """Three hosts, three pools, started together; one of them (h1) with an output_dir of its
    own (a host that does not share the others' folder) runs trials too: the budget lock on
    the database holds for all (never one more trial, whoever starts the last), each baseline
    queued once. Trials sleep 1 s: the others' 4 slots need two rounds of 1 s for 7 trials,
    time for a driver slow to start to take its share (sleeping costs no CPU)."""
    from test_budget import BASELINES, check_exact

    data = study_dict(study={"n_trials": 7, "storage": postgres_url, "name": "three",
                             "enqueue": BASELINES},
                      trainer={"args": ["--sleep", "1"]})
    shared = write_study(data, name="shared.yaml")
    data["study"]["output_dir"] = "host-b"
    own = write_study(data, name="own.yaml")
    drivers = [spawn_cli("run", str(path), env={"SWEEP_FAKE_GPUS": "2", "SWEEP_HOST": host})
               for path, host in ((shared, "h0"), (own, "h1"), (shared, "h2"))]
    for d in drivers:
        _, err = d.communicate(timeout=180)
        assert d.returncode == 0, err

    trials = optuna.load_study(study_name="three", storage=postgres_url).trials
    check_exact(trials)  # exactly 7 COMPLETE (none RUNNING), >= 2 hosts, no params twice
    assert len({t.user_attrs[names.OWNER]["pid"] for t in trials}) >= 2
    assert "h1" in {t.user_attrs[names.HOST] for t in trials}  # the host with its own folder
    assert list((tmp_path / "host-b" / "trials").iterdir())
    assert len({t.number for t in trials}) == len(trials)


def test_server_binaries_are_found_where_debian_puts_them(tmp_path, monkeypatch):
    """Issue 21 part 5: Debian's `postgresql` keeps initdb and pg_ctl off PATH, under
    /usr/lib/postgresql/<version>/bin: the newest version there is used."""
    from sweep.testing.postgres import server_binaries

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert server_binaries(str(tmp_path / "lib")) is None
    for version in ("9.6", "15", "16"):
        folder = tmp_path / "lib" / version / "bin"
        folder.mkdir(parents=True)
        for name in ("initdb", "pg_ctl") if version != "16" else ("initdb",):
            (folder / name).write_text("")
    assert server_binaries(str(tmp_path / "lib")) == tmp_path / "lib" / "15" / "bin"
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "initdb").write_text("#!/bin/sh\n")
    (on_path / "initdb").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    assert server_binaries(str(tmp_path / "lib")) == on_path


def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(monkeypatch):
    """The port the kernel found free was taken by another process before the server bound
    it (seen once: every PostgreSQL test of a session failed at its fixture): the server
    starts on the next free port, and the first one's process keeps its own. (A server of
    this test's own, beside the session's.)"""
    import socket

    import psycopg

    from sweep.testing import ports, postgres

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        first = iter([[port]])
        monkeypatch.setattr(ports, "free_ports",
                            lambda n, real=ports.free_ports: next(first, None) or real(n))
        with postgres.throwaway_postgres() as url, psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert f":{port}/" not in url
        assert next(first, None) is None  # the taken port was tried first
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # and is still the other process's


def test_a_server_that_cannot_start_for_another_reason_says_why_at_once(tmp_path, monkeypatch):
    """Only a port taken is tried again: any other failure (here a folder with no cluster in
    it, or, as root, pg_ctl's refusal of root) is one error, after one try, with what pg_ctl
    said."""
    from sweep.testing import ports, postgres

    binaries = postgres.server_binaries()
    assert binaries is not None
    asked: list[int] = []
    monkeypatch.setattr(ports, "free_ports",
                        lambda n, real=ports.free_ports: asked.extend(real(n)) or asked[-n:])
    with pytest.raises(RuntimeError) as e:
        postgres._start([], str(binaries / "pg_ctl"), tmp_path / "none", tmp_path,
                        tmp_path / "log")
    said = str(e.value)
    assert len(asked) == 1 and said.startswith(f"PostgreSQL did not start on port {asked[0]}:\n")
    assert said.count("\n") >= 1 and "Address already in use" not in said
