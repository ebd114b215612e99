"""A throwaway single-node Slurm for tests: its own munged, slurmctld and slurmd, with every
file (key, socket, config, state, logs) under one folder and free ports, stopped by their pids.

    with slurm.cluster(tmp_path) as c:
        job = c.sbatch(["studies/cluster/slurm.sbatch"], cwd=ROOT, env={...})
        c.wait(lambda: c.state(job) == "RUNNING", 60)

Needs Debian's `slurm-wlm` and `munge` and root (`available()` says why not). Tested with
slurm-wlm 22.05.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sweep.testing import ports

DAEMONS = ("munged", "slurmctld", "slurmd")


def available() -> str | None:
    """None if a throwaway Slurm can start here, else why not."""
    for name in DAEMONS:
        if shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None:
            return f"{name} is not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a throwaway slurmd must run as root"
    return None


def _daemon(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert found is not None, name
    return found


@dataclass
class Cluster:
    """A running throwaway Slurm: `env` points clients (sbatch, squeue, scontrol) at it."""

    folder: Path
    env: dict[str, str]
    pids: dict[str, int]

    def run(self, argv: Sequence[str], cwd: Path | None = None,
            env: Mapping[str, str] | None = None, check: bool = True) -> str:
        done = subprocess.run(list(argv), cwd=cwd, env={**os.environ, **self.env, **(env or {})},
                              capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def sbatch(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> str:
        """Submit; the job id."""
        return self.run(["sbatch", "--parsable", *argv], cwd, env).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, ...); {} once it is forgotten."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        fields = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields[key] = value
        return fields

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.2)
        return predicate()

    def log(self) -> str:
        """The daemons' logs, for a failing test's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        """Stop the daemons this cluster started, by their pids (SIGTERM, then SIGKILL)."""
        for name in reversed(DAEMONS):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone too
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _pid_of(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):  # written meanwhile
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise RuntimeError(f"no pid file {path}")


def slurm_conf(folder: Path, host: str, ports: Sequence[int], cpus: int) -> str:
    """The configuration of a one-node cluster with its files under `folder`."""
    return "\n".join([
        "ClusterName=sweeptest",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: how long a requeued job waits before it runs again (120 s by default)
        f"AuthInfo=socket={folder / 'munge.socket'},cred_expire=5",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=sched_interval=2",  # a requeued job waits no minute for its turn
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=10",
        "MinJobAge=300",
        "JobRequeue=1",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@contextlib.contextmanager
def cluster(folder: Path, cpus: int = 2) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd with their files in `folder`; stop them after."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, host, ports.free_ports(2), cpus))
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    c = Cluster(folder, {"SLURM_CONF": str(conf)}, {})
    try:
        subprocess.run([_daemon("munged"), "--force", f"--socket={folder / 'munge.socket'}",
                        f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
                        f"--log-file={folder / 'munged.log'}",
                        f"--seed-file={folder / 'munged.seed'}"], check=True, timeout=30,
                       capture_output=True)
        c.pids["munged"] = _pid_of(folder / "munged.pid")
        env = {**os.environ, **c.env}
        subprocess.run([_daemon("slurmctld"), "-f", str(conf)], env=env, check=True,
                       timeout=30, capture_output=True)
        c.pids["slurmctld"] = _pid_of(folder / "slurmctld.pid")
        subprocess.run([_daemon("slurmd"), "-f", str(conf)], env=env, check=True, timeout=30,
                       capture_output=True)
        c.pids["slurmd"] = _pid_of(folder / "slurmd.pid")
        if not c.wait(lambda: "idle" in c.run(["sinfo", "-h", "-o", "%T"], check=False), 60):
            raise RuntimeError(f"the node did not come up:\n{c.log()}")
        yield c
    finally:
        c.stop()
