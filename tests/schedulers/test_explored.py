"""Whether a PBT exploit runs with its perturbed params or its donor's restored ones, judged
from what the script logs (`trainer.logged_params`); and the study-file checks of the key."""

from __future__ import annotations

import pytest
from test_schedulers import load

from sweep._core import names
from sweep._core.errors import ConfigError
from sweep.schedulers import _explore

PBT = {"type": "pbt", "population": 4, "interval": 5, "max_steps": 50}
LOGGED = {"lr": {"stdout": r"lr=(?P<value>\S+)"}}


def test_a_boundary_is_the_highest_multiple_of_the_interval_just_passed():
    assert _explore.boundary(None, 5, 5) == 5
    assert _explore.boundary(4, 11, 5) == 10
    assert _explore.boundary(5, 9, 5) is None
    assert _explore.boundary(None, 3, 5) is None


def test_the_donors_note_is_the_one_at_or_before_the_boundary():
    notes = {"5": 0.9, "10": 0.8, "20": 0.6}
    assert _explore.at_or_before(notes, 10) == 0.8
    assert _explore.at_or_before(notes, 15) == 0.8
    assert _explore.at_or_before(notes, 4) is None


def test_a_value_that_follows_the_donors_schedule_is_restored_and_the_perturbed_one_is_not():
    # the donor ran 0.01, logged 0.005 at this boundary (a schedule halved it); the exploit
    # was given 0.0125 (x1.25): honest, it logs 0.00625; restored, the donor's 0.005
    assert _explore.restored(0.00625, 0.005, 0.0125, 0.01) is False
    assert _explore.restored(0.005, 0.005, 0.0125, 0.01) is True
    assert _explore.restored(0.0049, 0.005, 0.008, 0.01) is True  # x0.8, a step later
    # compared with the configured values, the restored one on a schedule would be missed:
    # why the donor's logged value is the reference
    assert _explore.restored(0.005, None, 0.0125, 0.01) is False
    # without a schedule the donor's param stands for its log
    assert _explore.restored(0.0125, None, 0.0125, 0.01) is False
    # not perturbed, or not positive: cannot be told
    assert _explore.restored(0.01, 0.01, 0.01, 0.01) is None
    assert _explore.restored(-1.0, 0.01, 0.0125, 0.01) is None


def test_logged_params_load_and_are_checked_against_the_study(tmp_path):
    spec = load(tmp_path, study={"n_trials": 4, "scheduler": PBT},
                params={"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
                trainer={names.LOGGED_PARAMS: LOGGED})
    assert spec.trainer.logged_params["lr"].patterns == [r"lr=(?P<value>\S+)"]
    cases = [
        ({"n_trials": 4}, {"lr": {"type": "float", "low": 1e-4, "high": 1e-1}}, LOGGED,
         "trainer.logged_params", "checked on PBT exploits only"),
        ({"n_trials": 4, "scheduler": PBT}, {"opt": {"type": "categorical",
                                                     "choices": ["a", "b"]}},
         {"opt": {"stdout": r"opt=(?P<value>\S+)"}}, "trainer.logged_params.opt",
         "not a float or int param this study searches"),
        ({"n_trials": 4, "scheduler": PBT}, {"lr": {"type": "float", "low": 1e-4,
                                                    "high": 1e-1}},
         {"lr": {"stdout": r"lr=(\S+)"}}, "trainer.logged_params.lr.stdout",
         "needs named groups"),
    ]
    for study, params, logged, key, text in cases:
        with pytest.raises(ConfigError) as e:
            load(tmp_path, study=study, params=params, trainer={names.LOGGED_PARAMS: logged})
        [problem] = e.value.problems
        assert (problem.key, text in problem.message) == (key, True), problem


def test_the_documented_pattern_reads_the_learning_rate_a_hf_trainer_logs(tmp_path):
    from sweep.trial.intermediate import OutputReader

    log = tmp_path / "stdout.log"
    log.write_text("{'loss': 0.6931, 'grad_norm': 1.25, 'learning_rate': 4.8e-05, "
                   "'epoch': 0.04}\n 10%|█         | 5/50 [00:01<00:09]\r"
                   "{'loss': 0.65, 'grad_norm': 1.1, 'learning_rate': 4.6e-05, 'epoch': 0.08}\n")
    reader = OutputReader(log, ["'learning_rate': (?P<value>[0-9.e+-]+)"], "learning_rate")
    assert reader.read() == [(1, 4.8e-05), (2, 4.6e-05)]
