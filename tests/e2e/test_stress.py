"""The driver killed with SIGKILL at random moments, six times (SWEEP_STRESS_ROUNDS for more), each
kill followed by a rerun: no trial is ever left RUNNING, every rerun meets the budget exactly, and
no process of a trial outlives a kill by 5 s. Each moment is taken inside the driver's loop (after
its round's first ask, or once its k-th trial started), never by a wall clock from its start: on a
busy machine that kill landed in the interpreter's imports and tested nothing."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import time

import pytest
from conftest import (
    load_trials,
    probes_started,
    processes_mentioning,
    run_cli,
    spawn_cli,
    study_dict,
    wait_until,
)

from sweep._core import names

ROUNDS = int(os.environ.get("SWEEP_STRESS_ROUNDS", "6"))
PER_ROUND = 3  # trials added to the budget each round, so every kill finds work left


def asked(study) -> int:
    """How many of the study's trials were asked (0 before its storage exists). Polled every
    0.05 s while the driver starts: read from the file with sqlite3, read-only (~1 ms; a
    look through Optuna's storage costs ~0.1 CPU-s, a core's worth at that rate)."""
    db = study.parent / "probe.db"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            return c.execute("SELECT COUNT(*) FROM trials WHERE state != 'WAITING'").fetchone()[0]
    except sqlite3.Error:  # not created yet, or being created by the driver
        return 0


@pytest.mark.slow
def test_sigkill_at_random_moments_then_rerun_never_leaves_a_trial_running(write_study,
                                                                           tmp_path, capsys,
                                                                           fake_gpus):
    rng = random.Random(int(os.environ.get("SWEEP_STRESS_SEED", "8")))
    env = {"SWEEP_FAKE_GPUS": "2"}
    log = []
    for round_ in range(ROUNDS):
        budget = PER_ROUND * (round_ + 1)
        study = write_study(study_dict(
            study={"n_trials": budget, "heartbeat_interval": 1, "reclaim_after": 2},
            trainer={"args": ["--sleep", "0.2"], "grace_period": 0.5},
        ))
        before, trials_before = probes_started(study), asked(study)
        # a while after the round's first ask (seconds), or once the k-th trial of the round
        # started (the last one included)
        if round_ % 2 == 0:
            moment = ("after ask", rng.uniform(0.0, 0.5))
        else:
            moment = ("trial", rng.randint(1, PER_ROUND))
        driver = spawn_cli("run", str(study), env=env)
        if moment[0] == "after ask":
            assert wait_until(lambda s=study, n=trials_before: asked(s) > n, 60)
            time.sleep(moment[1])
        else:
            target = before + moment[1]
            assert wait_until(lambda s=study, n=target: probes_started(s) >= n, 60)
        os.kill(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=10)
        assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5), (
            f"round {round_} ({moment}): trial processes outlived the kill by 5 s")

        # the rerun in this process (as `sweep run`, without a second interpreter's imports)
        code = run_cli("run", str(study))
        err = capsys.readouterr().err
        assert code == 0, err
        trials = load_trials(study)
        running = [t.number for t in trials if t.state.name == "RUNNING"]
        finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        log.append((round_, moment, len(trials), len(finished)))
        assert not running, f"round {round_} ({moment}): left RUNNING: {running}"
        assert len(finished) == budget, (round_, moment, err)
        assert wait_until(lambda: not processes_mentioning(str(tmp_path)), 5)
    cut = [t for t in load_trials(study) if t.state.name == "FAIL"]
    assert all(t.user_attrs[names.FAIL_REASON].startswith("driver died") for t in cut), log
