"""An interrupted trial continues where it stopped: the driver SIGTERMed six times and
SIGKILLed six times at random moments while a trial runs (once it has made a step in that
round, then a random while), each time followed by a rerun, with a trainer that
checkpoints every step. Exactly n_trials finish, every lineage ran each of its steps once plus
at most one per interruption that hit it, nothing is left RUNNING or queued, and no process
outlives the end by 5 s."""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from pathlib import Path

import pytest
from conftest import load_trials, processes_mentioning, spawn_cli, study_dict, wait_until

CKPT_PROBE = Path(__file__).parent / "trainers" / "ckpt_probe.py"
STEPS = 30
N_TRIALS = 8
CUT = ("interrupted", "driver died")


def steps_logged(study: Path) -> list[tuple[int, int, int]]:
    """(lineage, trial number, step) of every step any attempt ran."""
    out = []
    for log in (study.parent / "probe" / "checkpoints").glob("*/steps.log"):
        for line in log.read_text().splitlines():
            number, step = line.split()
            out.append((int(log.parent.name), int(number), int(step)))
    return out


@pytest.mark.slow
def test_sigterm_and_sigkill_at_random_moments_each_trial_continues_from_its_checkpoint(
        write_study, tmp_path):
    rng = random.Random(int(os.environ.get("SWEEP_STRESS_SEED", "22")))
    study = write_study(study_dict(
        study={"n_trials": N_TRIALS, "heartbeat_interval": 1, "reclaim_after": 2},
        trainer={"script": str(CKPT_PROBE), "grace_period": 2.0,
                 "args": ["--steps", str(STEPS), "--sleep", "0.05"]},
    ))
    env = {"SWEEP_FAKE_GPUS": "2"}
    kinds = [signal.SIGTERM] * 6 + [signal.SIGKILL] * 6
    rng.shuffle(kinds)
    log = []
    for round_, kind in enumerate(kinds):
        before = len(steps_logged(study))
        driver = spawn_cli("run", str(study), env=env)
        # a moment while a trial runs: once it has made a step in this round, then a while
        assert wait_until(lambda b=before: len(steps_logged(study)) > b, 60), (round_, log)
        time.sleep(rng.uniform(0.0, 0.3))
        driver.send_signal(kind)
        _, err = driver.communicate(timeout=30)
        log.append((round_, kind.name, driver.returncode))
        if kind is signal.SIGTERM:
            assert driver.returncode == 130, err
            assert "Traceback" not in err
            assert not [t for t in load_trials(study) if t.state.name == "RUNNING"], log
        assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5), (
            f"round {round_} ({kind.name}): trial processes outlived the driver by 5 s")

    rerun = spawn_cli("run", str(study), env=env)
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5)

    trials = load_trials(study)
    states = collections.Counter(t.state.name for t in trials)
    assert states["COMPLETE"] == N_TRIALS and states["RUNNING"] == states["WAITING"] == 0, states
    assert all(t.user_attrs["fail_reason"].startswith(CUT) for t in trials
               if t.state.name == "FAIL")
    # a kill between Optuna's ask and the owner record leaves a trial that never got params
    # (no trainer ran): told FAIL "driver died before recording itself", nothing to continue
    never_ran = [t for t in trials if t.state.name == "FAIL" and not t.params]
    assert all("before recording itself" in t.user_attrs["fail_reason"] for t in never_ran), [
        (t.number, t.user_attrs, t.system_attrs) for t in never_ran]
    by_lineage: dict[int, list] = collections.defaultdict(list)
    for t in (t for t in trials if t not in never_ran):
        by_lineage[t.user_attrs.get("retry_of", t.number)].append(t)
    assert len(by_lineage) == N_TRIALS
    hits_total = 0
    ran = collections.Counter(lineage for lineage, _, _ in steps_logged(study))
    steps = collections.defaultdict(set)
    for lineage, _, step in steps_logged(study):
        steps[lineage].add(step)
    for origin, attempts in by_lineage.items():
        done = [t for t in attempts if t.state.name == "COMPLETE"]
        assert len(done) == 1, (origin, attempts)
        hits = sum(t.state.name == "FAIL" for t in attempts)
        hits_total += hits
        assert steps[origin] == set(range(STEPS)), origin
        assert STEPS <= ran[origin] <= STEPS + hits, (origin, ran[origin], hits)
        assert {t.params["x"] for t in attempts} == {done[0].params["x"]}
        assert {t.user_attrs["run_id"] for t in attempts} == {done[0].user_attrs["run_id"]}
        # the continuation carries the curve of the attempts before it
        assert set(done[0].intermediate_values) >= set().union(
            *(t.intermediate_values for t in attempts))
        # the retries of max_retries are not spent by interruptions
        assert all(t.user_attrs.get("retries", 0) == 0 for t in attempts)
    assert hits_total >= len(kinds), (hits_total, log)
