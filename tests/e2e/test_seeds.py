"""A seeded study stays reproducible and continues with new points when it is run again."""

from __future__ import annotations

import pytest
from conftest import load_trials, run_cli, study_dict

from sweep.spec import searchspace


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_rerun_of_a_seeded_study_never_repeats_and_two_fresh_runs_agree(
    write_study, fake_gpus, tmp_path, sampler
):
    """Issue 10: a fresh process re-created the sampler with the same seed, so trials 4-7
    were copies of trials 0-3 (here: a run of 2, then one to 4, so trials 2-3 would be)."""
    runs = []
    for attempt in ("a", "b"):
        params = {"x": {"type": "float", "low": 0.0, "high": 1.0},
                  "n": {"type": "int", "low": 1, "high": 1000}}
        for budget in (2, 4):
            study = write_study(study_dict(
                study={"name": f"seeded-{attempt}", "n_trials": budget,
                       "sampler": {"type": sampler, "seed": 0}},
                trainer={"args": ["--sleep", "0"]},  # what is checked is the params asked
                params=params))
            assert run_cli("run", str(study)) == 0
        trials = load_trials(study, f"seeded-{attempt}")
        runs.append([(t.number, t.params["x"], t.params["n"]) for t in trials])
    first, again = runs
    assert len({(x, n) for _, x, n in first}) == 4  # no repeats across the two runs
    assert first == again  # the same seed, the same trials


def test_per_trial_seeds_differ_by_trial_and_keep_the_sequence_samplers_seed():
    seed = searchspace.trial_seed
    assert seed(0, 1) != seed(0, 2) != seed(1, 1)
    assert searchspace.trial_seed(0, 7) == searchspace.trial_seed(0, 7)
    assert set(searchspace.PER_TRIAL_SEED).isdisjoint({"qmc", "grid", "bruteforce"})
