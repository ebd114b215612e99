"""study.sampler / study.pruner build the Optuna objects with the given arguments."""

from __future__ import annotations

import optuna
import pytest
from conftest import load_trials, run_cli, study_dict

from sweep._core.errors import ConfigError
from sweep.spec import config, searchspace

DISCRETE = {"a": {"type": "categorical", "choices": ["x", "y"]},
            "n": {"type": "int", "low": 1, "high": 3},
            "f": {"type": "float", "low": 0.0, "high": 1.0, "step": 0.5}}


def sampler_of(spec):
    return searchspace.build_sampler(spec.study.sampler, spec.searched, str(spec.source))


def pruner_of(spec):
    return searchspace.build_pruner(spec.study.pruner, str(spec.source))


def spec_with(write_study, params=None, **study):
    extra = {"params": params} if params else {}
    return config.load(write_study(study_dict(study=study, **extra)))


@pytest.mark.parametrize(("cfg", "cls", "attrs"), [
    ({"type": "tpe", "seed": 1, "n_startup_trials": 3}, optuna.samplers.TPESampler,
     {"_n_startup_trials": 3}),
    ({"type": "random", "seed": 5}, optuna.samplers.RandomSampler, {}),
    ({"type": "cmaes", "n_startup_trials": 2}, optuna.samplers.CmaEsSampler,
     {"_n_startup_trials": 2}),
    ({"type": "gp", "n_startup_trials": 4}, optuna.samplers.GPSampler, {"_n_startup_trials": 4}),
    ({"type": "nsga2", "population_size": 10}, optuna.samplers.NSGAIISampler,
     {"_population_size": 10}),
    ({"type": "qmc", "qmc_type": "halton", "scramble": True}, optuna.samplers.QMCSampler,
     {"_qmc_type": "halton", "_scramble": True}),
    ({"type": "bruteforce"}, optuna.samplers.BruteForceSampler, {}),
])
def test_each_sampler_type_is_built_with_its_arguments(write_study, cfg, cls, attrs):
    sampler = sampler_of(spec_with(write_study, sampler=cfg))
    assert type(sampler) is cls
    for key, value in attrs.items():
        assert getattr(sampler, key) == value


def test_tpe_keeps_constant_liar_for_parallel_asks(write_study):
    sampler = sampler_of(spec_with(write_study, sampler={"type": "tpe"}))
    assert sampler._constant_liar is True


def test_grid_comes_from_discrete_params_or_an_explicit_search_space(write_study):
    grid = sampler_of(spec_with(write_study, DISCRETE, sampler={"type": "grid"}))
    assert grid._search_space == {"a": ["x", "y"], "f": [0.0, 0.5, 1.0], "n": [1, 2, 3]}
    explicit = sampler_of(spec_with(
        write_study, sampler={"type": "grid", "search_space": {"x": [0.1, 0.9]}}))
    assert explicit._search_space == {"x": [0.1, 0.9]}
    with pytest.raises(ConfigError, match="grid needs a search_space for float param 'x'"):
        spec_with(write_study, sampler={"type": "grid"})


@pytest.mark.parametrize(("cfg", "cls", "attrs"), [
    ({"type": "none"}, optuna.pruners.NopPruner, {}),
    ({"type": "median", "n_startup_trials": 2, "n_warmup_steps": 1},
     optuna.pruners.MedianPruner, {"_n_startup_trials": 2, "_n_warmup_steps": 1}),
    ({"type": "percentile", "percentile": 25.0}, optuna.pruners.PercentilePruner,
     {"_percentile": 25.0}),
    ({"type": "hyperband", "min_resource": 1, "max_resource": 9},
     optuna.pruners.HyperbandPruner, {"_min_resource": 1, "_max_resource": 9}),
    ({"type": "successive_halving", "min_resource": 2},
     optuna.pruners.SuccessiveHalvingPruner, {"_min_resource": 2}),
    ({"type": "threshold", "upper": 1.0}, optuna.pruners.ThresholdPruner, {"_upper": 1.0}),
    ({"type": "patient", "patience": 2, "wrapped": {"type": "median"}},
     optuna.pruners.PatientPruner, {"_patience": 2}),
])
def test_each_pruner_type_is_built_with_its_arguments(write_study, cfg, cls, attrs):
    pruner = pruner_of(spec_with(write_study, pruner=cfg))
    assert type(pruner) is cls
    for key, value in attrs.items():
        assert getattr(pruner, key) == value
    if cfg["type"] == "patient":
        assert type(pruner._wrapped_pruner) is optuna.pruners.MedianPruner


@pytest.mark.parametrize(("study", "key"), [
    ({"sampler": {"type": "cmaes", "sigma": 1}}, "study.sampler.sigma"),
    ({"pruner": {"type": "hyperband", "max_resources": 3}}, "study.pruner.max_resources"),
    ({"pruner": {"type": "patient", "patience": 1, "wrapped": {"type": "median", "bad": 1}}},
     "study.pruner.wrapped.bad"),
    ({"pruner": {"type": "percentile", "percentile": 150}}, "study.pruner"),
])
def test_a_bad_sampler_or_pruner_argument_is_a_config_error_naming_it(write_study, study, key):
    with pytest.raises(ConfigError) as e:
        spec_with(write_study, **study)
    assert e.value.key == key


def test_pruning_multi_objective_is_refused(write_study):
    data = study_dict(study={"directions": ["minimize", "maximize"], "metrics": ["a", "b"],
                             "pruner": {"type": "median"}})
    del data["study"]["direction"], data["study"]["metric"]
    with pytest.raises(ConfigError, match="cannot prune multi-objective"):
        config.load(write_study(data))


@pytest.mark.slow
def test_an_end_to_end_run_with_qmc(write_study, fake_gpus):
    study = write_study(study={"n_trials": 4, "sampler": {"type": "qmc", "seed": 3}},
                        params={"x": {"type": "float", "low": 0.0, "high": 1.0},
                                "y": {"type": "float", "low": 0.0, "high": 1.0}})
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert len({(t.params["x"], t.params["y"]) for t in trials}) == 4


def test_two_objectives_end_to_end_with_the_pareto_front_in_the_summary(write_study, fake_gpus,
                                                                        capsys):
    from sweep.analysis import summary

    data = study_dict(study={"directions": ["minimize", "maximize"],
                             "metrics": ["score", "size"], "n_trials": 5})
    del data["study"]["direction"], data["study"]["metric"]
    path = write_study(data)
    assert run_cli("run", str(path)) == 0
    s = summary.load(path)
    assert {"values_score", "values_size", "pareto"} <= set(s.trials.columns)
    front = s.trials[s.trials["pareto"]]
    assert len(front) >= 1
    for _, row in s.trials.iterrows():  # nobody off the front dominates a front member
        dominated = any(
            f["values_score"] <= row["values_score"] and f["values_size"] >= row["values_size"]
            and (f["values_score"], f["values_size"]) != (row["values_score"], row["values_size"])
            for _, f in front.iterrows())
        assert row["pareto"] != dominated
    assert run_cli("summary", str(path)) == 0
    assert "Pareto front" in capsys.readouterr().out


def test_a_grid_ends_the_run_when_its_space_is_exhausted(write_study, fake_gpus):
    study = write_study(
        study={"n_trials": 10, "sampler": {"type": "grid"}},
        params={"x": {"type": "categorical", "choices": [0.1, 0.5, 0.9]}},
    )
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study)
    assert sorted(t.params["x"] for t in trials) == [0.1, 0.5, 0.9]
    assert all(t.state.name == "COMPLETE" for t in trials)
