"""studies/cluster/: the Slurm script, the Kubernetes manifest and the study files they run.

No scheduler runs here: the script is run with a stand-in `srun` and `python` on PATH, the
manifest is parsed, and the study files are loaded as `sweep run` would read them."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from sweep.spec import config

CLUSTER = ROOT / "studies" / "cluster"
SBATCH = CLUSTER / "slurm.sbatch"
BASH = shutil.which("bash") or "/bin/bash"


@pytest.fixture
def storage_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """$SWEEP_STORAGE for loading: PostgreSQL when its driver is installed (nothing connects),
    else SQLite in tmp_path."""
    from sqlalchemy.engine import make_url

    url = "postgresql://sweep@db.example/sweeps"
    try:
        make_url(url).get_dialect().import_dbapi()
    except ImportError:
        url = f"sqlite:///{tmp_path / 'cluster.db'}"
    monkeypatch.setenv(config.STORAGE_ENV, url)
    return url


def stand_ins(folder: Path) -> Path:
    """`srun` that runs its command once as node `node7`, `python` that prints what it got."""
    folder.mkdir()
    scripts = {
        "srun": '#!/bin/sh\necho "srun $*" >&2\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
                'SLURMD_NODENAME=node7 exec "$@"\n',
        "python": '#!/bin/sh\necho "python $* host=$SWEEP_HOST storage=$SWEEP_STORAGE"\n',
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def run_sbatch(tmp_path: Path, *args: str, storage: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != config.STORAGE_ENV}
    env["PATH"] = f"{stand_ins(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    if storage is not None:
        env[config.STORAGE_ENV] = storage
    return subprocess.run([BASH, str(SBATCH), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=10)


def test_the_sbatch_script_parses():
    done = subprocess.run([BASH, "-n", str(SBATCH)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr


def test_the_sbatch_script_asks_for_one_driver_per_gpu_node():
    text = SBATCH.read_text()
    directives = [line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert "--ntasks-per-node=1" in directives
    assert any(d.startswith("--gres=gpu:") for d in directives)
    assert any(d.startswith("--nodes=") for d in directives)
    # the batch shell is signalled before the time limit: it stops the drivers and requeues
    assert "--signal=B:USR1@300" in directives and "--requeue" in directives
    assert "--open-mode=append" in directives  # each run of a requeued job adds to its log
    assert "SWEEP_STORAGE" in text
    assert "set -euo pipefail" in text


def test_the_sbatch_script_refuses_to_start_without_storage(tmp_path):
    done = run_sbatch(tmp_path, storage=None)
    assert done.returncode != 0
    assert "SWEEP_STORAGE" in done.stderr
    assert "srun" not in done.stderr and not done.stdout  # stopped before srun


def test_the_sbatch_script_refuses_a_missing_study_file(tmp_path):
    done = run_sbatch(tmp_path, "no/such/study.yaml", storage="postgresql://u@h/db")
    assert done.returncode == 2
    assert "no/such/study.yaml" in done.stderr and "srun" not in done.stderr


def test_the_sbatch_script_starts_one_driver_per_node_with_its_host(tmp_path):
    done = run_sbatch(tmp_path, storage="postgresql://u@h/db")
    assert done.returncode == 0, done.stderr
    assert "--ntasks-per-node=1" in done.stderr
    assert done.stdout.splitlines() == [
        "python -m sweep run studies/cluster/study.yaml host=node7 storage=postgresql://u@h/db"
    ]
    (tmp_path / "other").mkdir()
    other = run_sbatch(tmp_path / "other", "studies/quickstart.yaml", storage="sqlite:///x.db")
    assert other.returncode == 0, other.stderr
    assert "run studies/quickstart.yaml host=node7" in other.stdout


def manifest() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((CLUSTER / "job.yaml").read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert len(kinds) == len(docs), "one document of each kind"
    return kinds


def test_the_job_runs_one_driver_per_gpu_node():
    docs = manifest()
    job = docs["Job"]
    assert job["apiVersion"] == "batch/v1"
    spec = job["spec"]
    assert spec["parallelism"] == spec["completions"] >= 1
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    labels = spec["template"]["metadata"]["labels"]
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    (box,) = pod["containers"]
    assert box["command"] == ["python", "-m", "sweep", "run", "/work/study.yaml"]
    assert box["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {e["name"]: e for e in box["env"]}
    assert env["SWEEP_STORAGE"]["valueFrom"]["secretKeyRef"] == {"name": "sweep-storage",
                                                                 "key": "url"}
    assert env["SWEEP_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m["name"] for m in box["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/work"]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    claim = volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"] == "sweep-output"
    assert "ReadWriteMany" in docs["PersistentVolumeClaim"]["spec"]["accessModes"]


def test_a_pod_stopped_by_sigterm_is_replaced_and_its_trials_continue():
    """Pod deletion or a node drain: SIGTERM, the trials get stop_grace to save (inside the
    pod's termination grace), the driver exits 130, and the Job starts another pod."""
    docs = manifest()
    spec = docs["Job"]["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onExitCodes": {"containerName": "driver", "operator": "In",
                                                "values": [130]}} in rules
    assert any(r.get("onPodConditions") == [{"type": "DisruptionTarget"}] for r in rules)
    study = yaml.safe_load(docs["ConfigMap"]["data"]["study.yaml"])
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= study["trainer"]["stop_grace"] + 30


def test_the_configmap_study_loads(tmp_path, storage_url):
    text = manifest()["ConfigMap"]["data"]["study.yaml"]
    assert "storage:" not in yaml.safe_load(text)["study"]
    path = tmp_path / "study.yaml"
    path.write_text(text)
    spec = config.load(path, runnable=False)
    assert spec.study.storage == storage_url
    assert spec.study.output_dir == Path("/shared/sweep-output")
    assert str(spec.trainer.script).startswith("/")
    assert not str(spec.trainer.script).startswith("/work/")  # the ConfigMap mount hides it


def test_the_slurm_study_loads(storage_url):
    path = CLUSTER / "study.yaml"
    assert "storage" not in yaml.safe_load(path.read_text())["study"]
    spec = config.load(path, runnable=False)
    assert spec.study.storage == storage_url
    assert spec.study.output_dir == CLUSTER / "cluster-output"
    assert spec.trainer.script == ROOT / "trainers" / "mlp.py"
    assert spec.trainer.script.is_file()
