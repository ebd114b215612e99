"""study.yaml validation: good files load, every mistake is one line naming file and key."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import ASKS_ACCELERATES_KEYS, PROBE, ROOT, study_dict

from sweep._core.errors import ConfigError
from sweep.spec import config, searchspace
from sweep.trial import launch_plan


def test_the_example_study_loads_with_resolved_defaults(tmp_path, write_study):
    spec = config.load(write_study())
    assert spec.storage_url == f"sqlite:///{tmp_path / 'probe.db'}"
    assert spec.output_dir == tmp_path / "probe"
    assert spec.trainer.script == PROBE
    assert spec.study.objective_directions == ["minimize"]
    assert spec.study.objective_metrics == ["score"]
    assert spec.gpus.ids == "all" and spec.gpus.trials_per_gpu == 1


def test_relative_paths_are_relative_to_the_yaml(tmp_path, write_study):
    (tmp_path / "train.py").write_text("")
    spec = config.load(write_study(trainer={"script": "train.py"},
                                   study={"output_dir": "out", "storage": "sqlite:///x.db"}))
    assert spec.trainer.script == tmp_path / "train.py"
    assert spec.output_dir == tmp_path / "out"


@ASKS_ACCELERATES_KEYS
def test_repo_studies_load():

    for path in sorted((ROOT / "studies").glob("*.yaml")):
        spec = config.load(path)
        searchspace.build_sampler(spec.study.sampler, spec.searched, str(spec.source))
        searchspace.build_pruner(spec.study.pruner, str(spec.source))


FLOAT = {"type": "float", "low": 0.0, "high": 1.0}
INT = {"type": "int", "low": 1, "high": 4}


def bad(**sections):
    return study_dict(**sections)


def without(section, key):
    data = study_dict()
    del data[section][key]
    return data


BAD_FILES = [
    ("unknown top key", {**study_dict(), "extra": 1}, "extra", "unknown key"),
    ("unknown study key", bad(study={"n_trail": 3}), "study.n_trail", "unknown key"),
    ("wrong type", bad(study={"n_trials": "many"}), "study.n_trials", "integer"),
    ("zero budget", bad(study={"n_trials": 0}), "study.n_trials", "greater than 0"),
    ("misspelt direction", bad(study={"direction": "minimise"}), "study.direction", "minimize"),
    ("path in name", bad(study={"name": "../etc"}), "study.name", "pattern"),
    ("name that is the parent folder", bad(study={"name": ".."}), "study.name",
     "'..' cannot name a study (its output_dir and database are named after it)"),
    ("name that is this folder", bad(study={"name": "."}), "study.name",
     "'.' cannot name a study"),
    ("name that reads as an option", bad(study={"name": "-rf"}), "study.name",
     "not '.', '..' or a leading '-'"),
    ("name with a slash", bad(study={"name": "a/b"}), "study.name", "pattern"),
    ("name with a NUL", bad(study={"name": "a\x00b"}), "study.name", "contains a NUL byte"),
    ("negative timeout", bad(study={"timeout": -5}), "study.timeout", "greater than 0"),
    ("negative trial timeout", bad(trainer={"timeout": -1}), "trainer.timeout", "greater than 0"),
    ("infinite high", bad(params={"x": {"type": "float", "low": 0, "high": float("inf")}}),
     "params.x", "low and high must be finite numbers, and so must high - low (got 0.0, inf)"),
    ("NaN low", bad(params={"x": {"type": "float", "low": float("nan"), "high": 1}}),
     "params.x", "must be finite numbers"),
    ("a range wider than a float holds", bad(params={"x": {
        "type": "float", "low": -1e308, "high": 1e308}}), "params.x", "so must high - low"),
    ("step wider than the range", bad(params={"x": {"type": "float", "low": 0, "high": 1,
                                                      "step": 2}}),
     "params.x", "step (2.0) is larger than the range [0.0, 1.0]"),
    ("int step wider than the range", bad(params={"x": {"type": "int", "low": 0, "high": 3,
                                                          "step": 5}}),
     "params.x", "step (5) is larger than the range [0, 3]"),
    ("low above high", bad(params={"x": {"type": "float", "low": 2, "high": 1}}),
     "params.x", "low (2.0) must not be above high (1.0)"),
    ("param named like a type", bad(params={"float": {"type": "int", "low": 3, "high": 1}}),
     "params.float", "low (3) must not be above high (1)"),
    ("log of zero", bad(params={"x": {"type": "float", "low": 0, "high": 1, "log": True}}),
     "params.x", "log scale needs low > 0"),
    ("unknown param type", bad(params={"x": {"type": "floaty", "low": 0, "high": 1}}),
     "params.x", "floaty"),
    ("empty choices", bad(params={"c": {"type": "categorical", "choices": []}}),
     "params.c.choices", "at least 1"),
    ("missing script", bad(trainer={"script": "nope.py"}), "trainer.script", "no such file"),
    ("script and module", bad(trainer={"module": "a.b"}), "trainer", "exactly one"),
    ("missing metric", without("study", "metric"), "study", "metric is required"),
    ("both directions", bad(study={"directions": ["minimize", "maximize"]}), "study",
     "either direction or directions"),
    ("bad storage", bad(study={"storage": "not a url"}), "study.storage", "not a database URL"),
    ("unknown database", bad(study={"storage": "nosuchdb://x/y"}), "study.storage",
     "unknown database kind"),
    ("sqlite folder missing", bad(study={"storage": "sqlite:////nonexistent/dir/x.db"}),
     "study.storage", "folder does not exist"),
    ("bad sampler", bad(study={"sampler": {"type": "annealing"}}), "study.sampler.type", "tpe"),
    ("bad sampler kwarg", bad(study={"sampler": {"type": "tpe", "n_startup": 3}}),
     "study.sampler.n_startup",
     "TPESampler has no argument 'n_startup' (did you mean 'n_startup_trials'?)"),
    ("bad pruner kwarg", bad(study={"pruner": {"type": "median", "warmup": 3}}),
     "study.pruner.warmup", "MedianPruner has no argument 'warmup'"),
    ("enqueue unknown param", bad(study={"enqueue": [{"z": 1}]}), "study.enqueue.0",
     "not a searched param: z"),
    ("bad mixed precision", bad(trainer={"accelerate": {"mixed_precision": "fp8"}}),
     "trainer.accelerate.mixed_precision", "bf16"),
    ("negative gpu id", bad(gpus={"ids": [-1]}), "gpus.ids", "greater than or equal to 0"),
    ("bad param name", bad(params={"x y": {"type": "fixed", "value": 1}}), "params.x y",
     "pattern"),
    ("param name too long for a database", bad(params={"x" * 201: {"type": "fixed",
                                                                   "value": 1}}),
     "params." + "x" * 201, "at most 200 characters"),
    ("a value too large for a command line",
     bad(params={"x": {"type": "float", "low": 0, "high": 1},
                 "vocab": {"type": "fixed", "value": "w " * 100_000}}),
     "params.vocab", "a value of 200,000 bytes as text: sweep passes at most 120,000 in one "
     "argument or environment variable (Linux takes 128 KiB, less the name)"),
    ("grid missing a searched param",
     bad(study={"sampler": {"type": "grid", "search_space": {"x": [0.1, 0.2]}}},
         params={"x": {"type": "float", "low": 0, "high": 1},
                 "n": {"type": "int", "low": 1, "high": 3}}),
     "study.sampler.search_space", "gives no values for n"),
    ("grid value out of range",
     bad(study={"sampler": {"type": "grid", "search_space": {"x": [0.1, 1.5]}}}),
     "study.sampler.search_space.x", "1.5 is outside [0.0, 1.0]"),
    ("grid value not a choice",
     bad(study={"sampler": {"type": "grid", "search_space": {"c": ["a", 1]}}},
         params={"c": {"type": "categorical", "choices": ["a", "1"]}}),
     "study.sampler.search_space.c", "1 is not one of the choices ['a', '1']"),
    ("not a mapping", "- a\n- b\n", "", "must be a mapping"),
    ("yaml syntax", "study:\n  name: [unclosed\n", "line 3", "YAML syntax error"),
    ("yaml booleans among strings",
     bad(params={"mp": {"type": "categorical", "choices": [False, "bf16"]}}), "params.mp",
     "quote them, e.g. ['no', bf16]"),
    ("unknown placeholder", bad(trainer={"args": ["--out", "{trail_dir}/x"]}),
     "trainer.args.1", "unknown placeholder {trail_dir}"),
    ("unset variable in args", bad(trainer={"args": ["--data", "${SWEEP_TEST_UNSET}/x"]}),
     "trainer.args.1", "$SWEEP_TEST_UNSET is not set in the environment sweep runs in (it "
     "would reach the trainer as the text $SWEEP_TEST_UNSET): export SWEEP_TEST_UNSET before "
     "sweep runs, set it in trainer.env, or write $$SWEEP_TEST_UNSET for a literal dollar"),
    ("unset variable in resume_args", bad(trainer={"resume_args": ["--from", "$NO_SUCH_VAR"]}),
     "trainer.resume_args.1", "$NO_SUCH_VAR is not set"),
    ("JSON arg without doubled braces", bad(trainer={"args": ['{"a": 1}']}),
     "trainer.args.0", "a literal brace is doubled"),
    ("result from two sources", bad(trainer={"result": {"file": "a.json", "stdout": "x"}}),
     "trainer.result", "give exactly one of file, stdout or stderr"),
    ("stdout pattern without a group", bad(trainer={"result": {"stdout": "loss: [0-9.]+"}}),
     "trainer.result", "needs named groups"),
    ("stdout pattern that is no regex", bad(trainer={"result": {"stdout": "(?P<loss>[0-9"}}),
     "trainer.result", "not a regular expression"),
    ("unknown way to pass params", bad(trainer={"pass_params": "stdin"}),
     "trainer.pass_params", "'args', 'env' or 'file'"),
    ("flag on a float", bad(params={"x": {"type": "float", "low": 0, "high": 1, "flag": True}}),
     "params.x.flag", "unknown key"),
    ("accelerate option without accelerate",
     bad(params={"x": {"type": "float", "low": 0, "high": 1, "where": "accelerate"}}),
     "params.x.where", "need trainer.launcher: accelerate (or direct, warm)"),
    ("no such accelerate option",
     bad(trainer={"launcher": "accelerate"},
         params={"x": {"type": "float", "low": 0, "high": 1, "where": "accelerate"}}),
     "params.x.where", "not an `accelerate launch` option sweep can search: x"),
    ("accelerate option given twice",
     bad(trainer={"launcher": "accelerate", "accelerate": {"mixed_precision": "bf16"}},
         params={"mixed_precision": {"type": "categorical", "choices": ["no", "bf16"],
                                     "where": "accelerate"}}),
     "params.mixed_precision", "also set in trainer.accelerate.mixed_precision"),
    ("where nowhere", bad(params={"x": {"type": "float", "low": 0, "high": 1, "where": "env"}}),
     "params.x.where", "'script' or 'accelerate'"),
    ("gpu memory not a size", bad(trainer={"gpu_memory_gb": "lots"}),
     "trainer.gpu_memory_gb", "auto"),
    ("direct with several devices", bad(trainer={"launcher": "direct", "gpus_per_trial": 2}),
     "trainer", "launcher: direct starts one process per trial"),
    ("warm with several devices", bad(trainer={"launcher": "warm", "gpus_per_trial": 2}),
     "trainer", "launcher: warm starts one process per trial"),
    ("preload of no module name", bad(trainer={"launcher": "warm", "preload": ["-c x"]}),
     "trainer.preload.0", "should match pattern"),
    ("gpu memory infinite", bad(trainer={"gpu_memory_gb": float("inf")}),
     "trainer.gpu_memory_gb", "a size in GB"),
    ("gpus per trial as a boolean", bad(trainer={"gpus_per_trial": True}),
     "trainer.gpus_per_trial", "a number is needed, not true"),
    ("hang_after as yes (YAML's true)", bad(trainer={"hang_after": True}),
     "trainer.hang_after", "a number is needed, not true (YAML reads an unquoted yes/no/on/off"),
    ("timeout as yes", bad(trainer={"timeout": True}), "trainer.timeout",
     "a number is needed, not true"),
    ("n_trials as yes", bad(study={"n_trials": True}), "study.n_trials",
     "a number is needed, not true"),
    ("max_retries as no", bad(trainer={"max_retries": False}), "trainer.max_retries",
     "a number is needed, not false"),
    ("a bound as yes", bad(params={"x": {"type": "float", "low": True, "high": 2.0}}),
     "params.x.low", "a number is needed, not true"),
    ("fork_launcher as a word", bad(trainer={"fork_launcher": "yes"}),
     "trainer.fork_launcher", "valid boolean"),
    ("a gpu listed twice", bad(gpus={"ids": [0, 1, 0]}), "gpus.ids", "listed more than once: 0"),
    ("an accelerate flag searched as choices",
     bad(trainer={"launcher": "accelerate"},
         params={"dynamo_use_fullgraph": {"type": "categorical", "choices": ["a", "b"],
                                          "where": "accelerate"}}),
     "params.dynamo_use_fullgraph", "an accelerate flag: give it as type: bool"),
    ("an accelerate value accelerate refuses",
     bad(trainer={"launcher": "accelerate"},
         params={"mixed_precision": {"type": "categorical", "choices": ["no", "fp8x"],
                                     "where": "accelerate"}}),
     "params.mixed_precision", "accelerate takes no, fp16, bf16, not fp8x"),
    ("threads that are no whole number",
     bad(trainer={"launcher": "accelerate"},
         params={"num_cpu_threads_per_process": {"type": "float", "low": 0.5, "high": 4,
                                                 "where": "accelerate"}}),
     "params.num_cpu_threads_per_process", "a whole number of threads"),
]


@pytest.mark.parametrize(("case", "data", "key", "text"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_study_files_exit_2_with_one_line_naming_the_key(case, data, key, text, write_study,
                                                            tmp_path, capsys, fake_gpus):
    from sweep import cli

    path = write_study(data)
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"sweep: error: {path}: {key}"), err
    assert text in lines[0], err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing written


def test_gpu_id_not_in_the_pool_is_a_usage_error(write_study, tmp_path, capsys, fake_gpus):
    from sweep import cli

    path = write_study(gpus={"ids": [0, 7]})
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gpus.ids: [7] not in the pool (available: 0, 1)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


def test_a_real_subprocess_shows_no_traceback_unless_debug(write_study, tmp_path):
    path = write_study(study={"n_trials": -1})
    run = subprocess.run([sys.executable, "-m", "sweep", "run", str(path)],
                         capture_output=True, text=True, env={"SWEEP_FAKE_GPUS": "1",
                                                              "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "study.n_trials" in run.stderr
    debug = subprocess.run([sys.executable, "-m", "sweep", "--debug", "run", str(path)],
                           capture_output=True, text=True)
    assert "Traceback" in debug.stderr


def test_passwords_in_storage_urls_are_never_printed(write_study, capsys):
    from sweep import cli

    path = write_study(study={"storage": "nosuchdb://user:hunter2@db.example/x"})
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "***" in err


def test_params_become_optuna_distributions(write_study):
    spec = config.load(write_study(params={
        "lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
        "layers": {"type": "int", "low": 1, "high": 4, "step": 1},
        "act": {"type": "categorical", "choices": ["relu", "gelu"]},
        "epochs": {"type": "fixed", "value": 3},
    }))
    d = searchspace.distributions(spec.searched)
    assert list(d) == ["lr", "layers", "act"]
    assert d["lr"].log and d["lr"].low == 1e-5
    assert d["layers"].high == 4 and d["layers"].step == 1
    assert d["act"].choices == ("relu", "gelu")
    assert spec.fixed == {"epochs": 3}


def test_config_error_names_file_and_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        config.load(tmp_path / "missing.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'missing.yaml'}: cannot read")


def test_accelerate_config_is_single_process_and_not_distributed():
    data = yaml.safe_load(launch_plan.ACCELERATE_CONFIG)
    assert data["distributed_type"] == "NO" and data["num_processes"] == 1


def misspelt(section, right, wrong):
    data = study_dict()
    data[section][wrong] = data[section].pop(right)
    return data


@pytest.mark.parametrize(("data", "line"), [
    (misspelt("study", "n_trials", "n_trial"),
     "study.n_trial: unknown key `n_trial` (did you mean `n_trials`?)"),
    (misspelt("trainer", "script", "scirpt"),
     "trainer.scirpt: unknown key `scirpt` (did you mean `script`?)"),
    (misspelt("gpus", "sample_interval", "sample_intervall"),
     "gpus.sample_intervall: unknown key `sample_intervall` (did you mean `sample_interval`?)"),
    (bad(params={"x": {"type": "float", "low": 0, "hihg": 1}}),
     "params.x.hihg: unknown key `hihg` (did you mean `high`?)"),
    ({**study_dict(), "parms": {}}, "parms: unknown key `parms` (did you mean `params`?)"),
    (bad(study={"zzz": 1}), "study.zzz: unknown key `zzz` (study takes name, storage, "
     "output_dir, direction, directions, metric, metrics, n_trials, timeout, sampler, "
     "pruner, scheduler, enqueue, max_consecutive_failures, heartbeat_interval, reclaim_after, "
     "grace_period, report)"),
    ({**study_dict(), "source": "x.yaml"}, "source: unknown key `source`"),
    (bad(trainer={"stop_grace": 5, "grace_period": 5}),
     "trainer.grace_period: `grace_period` is another name of `stop_grace`, given too: keep "
     "one"),
    (bad(study={"scheduler": {"type": "asha", "min_steps": 1, "max_steps": 9, "colour": 1}}),
     "study.scheduler.colour: unknown key `colour` (study.scheduler takes keep_checkpoints, "
     "max_checkpoint_gb, min_steps, max_steps, reduction_factor, type)"),
    (bad(study={"scheduler": {"type": "pbt", "population": 4, "interval": 2, "max_steps": 9,
                              "quantil": 0.2}}),
     "study.scheduler.quantil: unknown key `quantil` (did you mean `quantile`?)"),
])
def test_a_misspelt_key_says_which_key_was_meant_and_nothing_else(write_study, data, line):
    """Issue 21 part 5: `n_trial` read as "`n_trials`: required key is missing"."""
    path = write_study(data)
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == f"{path}: {line}"


def test_every_mistake_of_a_file_is_reported_at_once_one_line_each(write_study, capsys,
                                                                   fake_gpus, tmp_path):
    from sweep import cli

    path = write_study(bad(study={"n_trials": 0, "timeout": "soon"},
                           trainer={"timeout": -1, "launcher": "slurm"},
                           params={"x": {"type": "float", "low": 2, "high": 1},
                                   "c": {"type": "categorical", "choices": [[1]]}}))
    assert cli.main(["run", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.removeprefix(f"sweep: error: {path}: ").split(": ")[0] for line in lines] == [
        "study.n_trials", "study.timeout", "trainer.launcher", "trainer.timeout",
        "params.x", "params.c.choices.0"]
    assert all(line.startswith(f"sweep: error: {path}: ") for line in lines)
    assert lines[4].endswith("low (2.0) must not be above high (1.0)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


def test_every_mistake_found_after_the_sections_validate_is_reported_at_once(write_study,
                                                                            tmp_path):
    (tmp_path / "afile").write_text("")
    path = write_study(bad(
        study={"output_dir": "afile", "enqueue": [{"x": 7}], "storage": "nosuchdb://h/d"},
        trainer={"script": "nope.py", "args": ["{trail_dir}"], "env": {"A=B": "1"}},
    ))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert [p.key for p in e.value.problems] == [
        "study.storage", "study.output_dir", "trainer.args.0", "trainer.env.A=B",
        "trainer.script", "study.enqueue.0.x"]
    assert str(e.value).count("\n") == 5
    assert e.value.key == "study.storage"  # the first, as a single error had it


@pytest.mark.parametrize(("params", "env", "line"), [
    ({"lr": FLOAT, "LR": FLOAT}, {},
     "params.LR: params 'lr' and 'LR' are both passed as $SWEEP_PARAM_LR"),
    ({"model.depth": INT, "model_depth": INT}, {},
     "params.model_depth: params 'model.depth' and 'model_depth' are both passed as "
     "$SWEEP_PARAM_MODEL_DEPTH"),
    ({"model-depth": {"type": "fixed", "value": 3}, "model.depth": INT}, {},
     "params.model.depth: params 'model-depth' and 'model.depth' are both passed as "
     "$SWEEP_PARAM_MODEL_DEPTH"),
    ({"lr": FLOAT}, {"SWEEP_PARAM_LR": "0.1"},
     "trainer.env.SWEEP_PARAM_LR: $SWEEP_PARAM_LR is also how param 'lr' is passed"),
])
def test_params_that_share_an_environment_variable_are_refused(write_study, params, env,
                                                                line):
    """Issue 26 item 3: the trainer got one value while the study recorded two."""
    path = write_study(bad(trainer={"pass_params": "env", "env": env}, params=params))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value).startswith(f"{path}: {line}")
    assert len(e.value.problems) == 1
    assert {launch_plan.env_name(name) for name in params} | set(env) == {
        line.split("$")[1].split()[0]}  # the variable the driver would set


def test_params_that_share_a_variable_are_fine_when_not_passed_by_environment(write_study):
    for way in ("args", "file"):
        spec = config.load(write_study(bad(trainer={"pass_params": way},
                                           params={"lr": FLOAT, "LR": FLOAT})))
        assert list(spec.params) == ["lr", "LR"]
    spec = config.load(write_study(bad(
        trainer={"pass_params": "env", "launcher": "accelerate"},
        params={"mixed_precision": {"type": "categorical", "choices": ["no", "bf16"],
                                    "where": "accelerate"},
                "MIXED_PRECISION": {"type": "categorical", "choices": ["a", "b"]}})))
    assert len(spec.params) == 2  # one goes to accelerate, not to the environment


@pytest.mark.parametrize(("source", "flag"), [("env", None), ("flag", "--storage")])
def test_a_bad_storage_url_names_where_it_came_from(write_study, monkeypatch, capsys,
                                                    fake_gpus, source, flag):
    """Issue 26 item 12: a URL from $SWEEP_STORAGE was blamed on a file's study.storage."""
    from sweep import cli

    path = write_study()
    args = ["run", str(path)]
    if source == "env":
        monkeypatch.setenv("SWEEP_STORAGE", "not a url")
    else:
        args += ["--storage", "not a url"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    where = flag or "$SWEEP_STORAGE"
    assert err == f"sweep: error: {path}: {where}: not a database URL (e.g. " \
                  "sqlite:///sweep.db or postgresql://user@host/db)\n"


def test_an_unreachable_storage_from_the_environment_is_blamed_on_it(write_study,
                                                                     monkeypatch, tmp_path,
                                                                     capsys):
    from sweep import cli

    (tmp_path / "dir.db").mkdir()  # exists, and no database opens it
    monkeypatch.setenv("SWEEP_STORAGE", f"sqlite:///{tmp_path / 'dir.db'}")
    path = write_study()
    assert cli.main(["status", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sweep: error: {path}: $SWEEP_STORAGE: cannot read "), err


def test_with_debug_a_usage_error_keeps_exit_2_and_adds_the_traceback(write_study, capsys,
                                                                     fake_gpus):
    """Issue 26 item 12: with --debug, a bad storage URL exited 1."""
    from sweep import cli

    path = write_study(study={"storage": "not a url"})
    assert cli.main(["--debug", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConfigError" in err
    assert err.splitlines()[-1] == f"sweep: error: {path}: study.storage: not a database " \
                                   "URL (e.g. sqlite:///sweep.db or postgresql://user@host/db)"


def test_a_folder_named_as_the_study_file_is_one_line(tmp_path, capsys):
    from sweep import cli

    assert cli.main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"sweep: error: {tmp_path}: the study file is not a regular file (a folder? "
                   "a FIFO?)\n")


@pytest.mark.parametrize(("name", "why"), [
    ("CUDA_VISIBLE_DEVICES", "sweep gives each trial its own devices (its value would be "
     "replaced): choose the pool with gpus.ids, or CUDA_VISIBLE_DEVICES in the driver's "
     "environment, and remove it from trainer.env"),
    ("SWEEP_RESULT_FILE", "sweep sets it for each trial (its value would be replaced): to read "
     "the result from another file, set trainer.result.file, and remove it from trainer.env"),
    ("SWEEP_CHECKPOINT_DIR", "sweep sets it for each trial (its own value would be replaced): "
     "remove it from trainer.env"),
])
def test_a_variable_sweep_sets_per_trial_is_refused_in_trainer_env(write_study, name, why):
    """Issue 32: CUDA_VISIBLE_DEVICES or SWEEP_RESULT_FILE in trainer.env was silently
    replaced by sweep's own value for each trial."""
    path = write_study(trainer={"env": {name: "0"}})
    with pytest.raises(ConfigError) as refused:
        config.load(path)
    assert str(refused.value) == f"{path}: trainer.env.{name}: {why}"


def test_variables_in_args_load_when_the_trial_will_have_them(write_study, monkeypatch):
    """A `$NAME` the driver's environment, `trainer.env`, or sweep itself gives the trial
    loads; `$$` is a dollar; a verb that only reads the study does not look."""
    monkeypatch.setenv("SWEEP_TEST_DATA", "/data")
    monkeypatch.delenv("SWEEP_TEST_UNSET", raising=False)
    args = ["$SWEEP_TEST_DATA", "${OWN}", "$SWEEP_TRIAL_DIR", "$CUDA_VISIBLE_DEVICES",
            "$SWEEP_RUN_ID", "$WANDB_NAME", "$SWEEP_PARAM_X", "cost$$SWEEP_TEST_UNSET", "$5"]
    path = write_study(trainer={"args": args, "env": {"OWN": "1"}, "pass_params": "env"})
    assert config.load(path).trainer.args == args
    unset = write_study(trainer={"args": ["$SWEEP_TEST_UNSET"]}, name="unset.yaml")
    assert config.load(unset, runnable=False).trainer.args == ["$SWEEP_TEST_UNSET"]
    with pytest.raises(ConfigError, match=r"trainer.args.0: \$SWEEP_TEST_UNSET is not set"):
        config.load(unset)
