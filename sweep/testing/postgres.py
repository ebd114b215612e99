"""A throwaway PostgreSQL server on loopback, for tests and benchmarks (`initdb`, `pg_ctl`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sweep.testing import ports

DEBIAN_BINARIES = "/usr/lib/postgresql"  # Debian's `postgresql` package: <version>/bin/


def server_binaries(debian: str = DEBIAN_BINARIES) -> Path | None:
    """The folder of PostgreSQL's `initdb` and `pg_ctl`: on PATH, else Debian's
    `<debian>/<version>/bin` of the newest version; None if there is none."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).parent
    versions = []
    for folder in Path(debian).glob("*/bin"):
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            version = folder.parent.name
            versions.append((tuple(int(p) for p in version.split(".") if p.isdigit()), folder))
    return max(versions)[1] if versions else None


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a PostgreSQL server in a temporary folder on a free port; its URL. Stopped and
    removed on exit. As root the server runs as the `postgres` user (it refuses root)."""
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) are neither on PATH "
                           f"nor in {DEBIAN_BINARIES}/<version>/bin")
    initdb, pg_ctl = str(binaries / "initdb"), str(binaries / "pg_ctl")
    home = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    data, sock = home / "data", home / "sock"
    sock.mkdir()
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        for path in (home, sock):
            shutil.chown(path, "postgres")
        home.chmod(0o755)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    try:
        subprocess.run([*as_postgres, initdb, "-D", str(data), "-A", "trust", "-U",
                        "postgres"], check=True, capture_output=True)
        port = _start(as_postgres, pg_ctl, data, sock, home / "log")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _start(as_postgres: list[str], pg_ctl: str, data: Path, sock: Path, log: Path,
           tries: int = 3) -> int:
    """Start the server on a free port; the port. A port found free can be taken by another
    process before the server binds it: then again on another, up to `tries` times. Any other
    failure (a timeout, a bad folder), or the last try's: RuntimeError with what pg_ctl and
    the server said of that try."""
    while True:
        tries -= 1
        [port] = ports.free_ports(1)
        before = log.stat().st_size if log.exists() else 0
        done = subprocess.run([*as_postgres, pg_ctl, "-D", str(data), "-l", str(log),
                               "-o", f"-p {port} -k {sock} -h 127.0.0.1 -c lc_messages=C", "-w",
                               "start"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return port
        try:
            with log.open("rb") as f:
                f.seek(before)
                said = f.read().decode(errors="replace")
        except OSError:
            said = ""
        if "Address already in use" not in said or tries <= 0:  # in lc_messages C
            lines = (said + done.stderr).strip().splitlines()[-10:]
            raise RuntimeError(f"PostgreSQL did not start on port {port}:\n"
                               + "\n".join(lines))
