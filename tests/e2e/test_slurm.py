"""studies/cluster/slurm.sbatch on a real single-node Slurm (started here, thrown away after):
the job is interrupted twice (the time-limit signal the recipe asks for, then `scontrol
requeue`), requeued each time, and the study ends with exactly n_trials finished, every
interrupted trial continued from its checkpoint."""

from __future__ import annotations

import collections
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TRAINERS, load_trials, processes_mentioning, study_dict, wait_until

from sweep._core import names
from sweep.testing import slurm

CKPT_PROBE = TRAINERS / "ckpt_probe.py"
STEPS, N_TRIALS = 40, 4

pytestmark = [
    pytest.mark.xdist_group("slurm"),  # one throwaway cluster at a time on the 2-CPU node
    pytest.mark.skipif(shutil.which("slurmctld", path=os.environ.get("PATH", "") + ":/usr/sbin")
                       is None, reason="slurmctld is not on PATH (apt-get install slurm-wlm "
                       "munge; CI installs them)"),
]


def starts(study: Path) -> list[tuple[int, int, int]]:
    """(lineage, trial number, the step it started at) of every attempt that started."""
    out = []
    for log in (study.parent / "probe" / "checkpoints").glob("*/starts.log"):
        for line in log.read_text().splitlines():
            number, step, _ = line.split()
            out.append((int(log.parent.name), int(number), int(step)))
    return out


def steps(study: Path) -> list[tuple[int, int]]:
    out = []
    for log in (study.parent / "probe" / "checkpoints").glob("*/steps.log"):
        out += [(int(log.parent.name), int(line.split()[1]))
                for line in log.read_text().splitlines()]
    return out


def checkpointing_study(tmp_path: Path, n_trials: int) -> tuple[Path, dict[str, str]]:
    """A study of the checkpointing probe on a SQLite file, and the environment its jobs run
    sweep in (this sweep, 2 simulated devices); skips where no throwaway Slurm can start."""
    why = slurm.available()
    if why is not None:
        pytest.skip(why)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(study_dict(
        study={"n_trials": n_trials, "heartbeat_interval": 1, "reclaim_after": 5},
        trainer={"script": str(CKPT_PROBE), "grace_period": 5.0,
                 "args": ["--steps", str(STEPS), "--sleep", "0.1"]})))
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p),
           "SWEEP_STORAGE": f"sqlite:///{tmp_path / 'probe.db'}", "SWEEP_FAKE_GPUS": "2",
           "SWEEP_LOCK_DIR": os.environ["SWEEP_LOCK_DIR"]}
    return study, env


@pytest.mark.slow
def test_the_sbatch_recipe_is_interrupted_twice_requeued_and_every_trial_continues(tmp_path):
    study, env = checkpointing_study(tmp_path, N_TRIALS)
    with slurm.cluster(tmp_path / "slurm") as c:
        job = c.sbatch(["--nodes=1", "--gres=none", "--cpus-per-task=1",
                        f"--output={tmp_path}/%x-%j.out", "studies/cluster/slurm.sbatch",
                        str(study)], cwd=ROOT, env=env)
        out = tmp_path / f"sweep-{job}.out"

        def progress(runs: int) -> None:
            """Wait for run `runs` of the job to have made steps of two trials."""
            assert c.wait(lambda: c.job(job).get("Restarts") == str(runs)
                          and c.state(job) == "RUNNING", 60), (c.job(job), c.log())
            before = len(steps(study))
            assert wait_until(lambda: len(steps(study)) >= before + 6, 60), out.read_text()

        progress(0)
        # what --signal=B:USR1@300 does before the time limit: the recipe stops and requeues
        c.run(["scancel", "--batch", "--signal=USR1", job])
        progress(1)
        c.run(["scontrol", "requeue", job])  # as a preemption does: SIGTERM to the whole job
        progress(2)
        assert c.wait(lambda: c.state(job) == "COMPLETED", 120), (c.job(job), out.read_text())
        log = out.read_text()
        assert c.job(job)["ExitCode"] == "0:0"
    assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5)
    assert log.count("slurm.sbatch: job") == 3, log  # three runs of one job
    assert "requeueing job" in log and "probe: 4/4 trials finished" in log, log

    trials = load_trials(study)
    states = collections.Counter(t.state.name for t in trials)
    assert states["COMPLETE"] == N_TRIALS and states["RUNNING"] == states["WAITING"] == 0, states
    cut = [t for t in trials if t.state.name == "FAIL"]
    assert len(cut) >= 4 and {t.user_attrs[names.FAIL_REASON] for t in cut} == {"interrupted"}
    started = {number: step for _, number, step in starts(study)}
    ran = collections.Counter(lineage for lineage, _ in steps(study))
    for t in cut:  # each continued from its checkpoint: at the step after its last
        then = next(n for n in trials if n.user_attrs.get(names.CONTINUES) == t.number)
        done_before = len({s for lineage, s in steps(study)
                           if lineage == t.user_attrs.get(names.RETRY_OF, t.number)
                           and s < started[then.number]})
        assert started[then.number] == done_before > 0 or started[then.number] == 0
    for origin in {t.user_attrs.get(names.RETRY_OF, t.number) for t in trials}:
        hits = sum(t.user_attrs.get(names.RETRY_OF, t.number) == origin for t in cut)
        assert STEPS <= ran[origin] <= STEPS + hits, (origin, ran[origin], hits)
    assert sum(step > 0 for step in started.values()) >= 2  # continued, not started over


@pytest.mark.slow
def test_in_a_job_array_a_task_stops_and_requeues_only_itself(tmp_path):
    """Issue 32: in an array, $SLURM_JOB_ID of the task that holds the array's own id names
    the whole array: its time-limit trap sent TERM to its sibling's step and requeued the
    sibling. The recipe uses the task's own id (ARRAYID_TASKID): the signalled task stops
    gently and is requeued; its sibling runs on untouched, once."""
    study, env = checkpointing_study(tmp_path, 6)
    with slurm.cluster(tmp_path / "slurm") as c:
        array = c.sbatch(["--array=0-1", "--nodes=1", "--gres=none", "--cpus-per-task=1",
                          f"--output={tmp_path}/%x-%A_%a.out", "studies/cluster/slurm.sbatch",
                          str(study)], cwd=ROOT, env=env)
        tasks = [f"{array}_0", f"{array}_1"]
        assert c.wait(lambda: all(c.state(t) == "RUNNING" for t in tasks), 60), c.log()
        # the task that holds the array's own id: the one whose trap reached the whole array
        owner = next(t for t in tasks if c.job(t)["JobId"] == array)
        sibling = next(t for t in tasks if t != owner)
        assert wait_until(lambda: len(steps(study)) >= 6, 60)
        c.run(["scancel", "--batch", "--signal=USR1", owner])  # its time limit is near
        assert c.wait(lambda: c.job(owner).get("Restarts") == "1", 60), (c.job(owner), c.log())
        assert c.wait(lambda: all(c.state(t) == "COMPLETED" for t in tasks), 240), (
            [c.job(t) for t in tasks])
        logs = {t: (tmp_path / f"sweep-{t}.out").read_text() for t in tasks}
        assert c.job(sibling)["Restarts"] == "0", logs[sibling]
    assert logs[owner].count("slurm.sbatch: job") == 2, logs[owner]
    assert f"requeueing job {owner}" in logs[owner], logs[owner]
    assert logs[sibling].count("slurm.sbatch: job") == 1, logs[sibling]  # never rerun
    assert "interrupted" not in logs[sibling] and "SIGTERM" not in logs[sibling], logs[sibling]
    trials = load_trials(study)
    assert collections.Counter(t.state.name for t in trials)["COMPLETE"] == 6
