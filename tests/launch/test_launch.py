"""The pure argv/env builder of a trial."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.spec.schema import TrainerSection
from sweep.trial import folders, launch_plan

PATHS = folders.TrialPaths(Path("/out/trials/7"))


def test_accelerate_launch_is_pinned_and_ignores_the_users_default_config():
    trainer = TrainerSection(script=Path("/t/train.py"), args=["--epochs", "5"],
                             env={"WANDB_MODE": "offline", "SEED": 3},
                             accelerate={"mixed_precision": "bf16"})
    plan = launch_plan.build_launch(trainer, 7, {"lr": 0.001, "layers": 2, "act": "gelu"}, 2, PATHS,
                               Path("/out/accelerate_config.yaml"), python="/py")
    assert plan.argv == [
        "/py", "-m", "accelerate.commands.launch",
        "--config_file", "/out/accelerate_config.yaml",
        "--num_processes", "1", "--num_machines", "1", "--gpu_ids", "2",
        "--mixed_precision", "bf16",
        "/t/train.py", "--epochs", "5", "--lr", "0.001", "--layers", "2", "--act", "gelu",
    ]
    assert plan.env == {
        "WANDB_MODE": "offline", "SEED": "3",
        "CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "SWEEP_TRIAL_NUMBER": "7", "SWEEP_TRIAL_DIR": "/out/trials/7",
        "SWEEP_PARAMS_FILE": "/out/trials/7/params.json",
        "SWEEP_RESULT_FILE": "/out/trials/7/result.json",
        "SWEEP_REPORT_FILE": "/out/trials/7/reports.jsonl",
        "SWEEP_CHECKPOINT_DIR": "/out/checkpoints/7",
    }


def test_module_entry_points_and_the_plain_python_launcher():
    acc = launch_plan.build_launch(TrainerSection(module="pkg.train"), 0, {}, 0, PATHS,
                              Path("/c.yaml"), python="/py")
    assert acc.argv[-2:] == ["--module", "pkg.train"]
    plain = launch_plan.build_launch(TrainerSection(module="pkg.train", launcher="python"), 0,
                                {"x": 1}, 3, PATHS, Path("/c.yaml"), python="/py",
                                through_accelerate=False)
    assert plain.argv == ["/py", "-m", "pkg.train", "--x", "1"]
    assert plain.env["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize(("value", "text"), [
    ("a b; rm -rf /", "a b; rm -rf /"),
    (True, "true"), (False, "false"), (None, "null"),
    (0.1, "0.1"), (1e-05, "1e-05"), (3, "3"),
    ([1, 2], "[1, 2]"), ({"a": 1}, '{"a": 1}'),
])
def test_param_values_are_single_argv_elements(value, text):
    assert launch_plan.param_args({"p": value}) == ["--p", text]


def test_command_line_can_be_pasted_into_a_shell():
    trainer = TrainerSection(script=Path("/t/my train.py"), launcher="python")
    plan = launch_plan.build_launch(trainer, 1, {"name": "it's"}, 0, PATHS, Path("/c"),
                               python=sys.executable, through_accelerate=False)
    words = shlex.split(plan.command_line())
    assert words[-3:] == ["/t/my train.py", "--name", "it's"]
    assert "CUDA_VISIBLE_DEVICES=0" in words


def test_prepare_trial_dir_writes_params_and_command(tmp_path):
    paths = folders.TrialPaths.of(tmp_path, 4)
    plan = launch_plan.build_launch(TrainerSection(script=Path("/t.py"), launcher="python"), 4,
                               {"lr": 0.5}, 1, paths, tmp_path / "c.yaml",
                               through_accelerate=False)
    paths.dir.parent.mkdir(parents=True)
    paths.made.write_text("4\n")  # sweep's, from an earlier run with the same output_dir
    paths.dir.mkdir()
    paths.command.write_text("#!/bin/sh\n")
    paths.result.write_text("{}")
    folders.prepare_trial_dir(plan, {"lr": 0.5})
    assert (tmp_path / "trials" / "4" / "params.json").read_text().strip() == '{\n  "lr": 0.5\n}'
    assert "--lr 0.5" in paths.command.read_text()
    assert not paths.result.exists()


def _param(**kw):
    from sweep.spec.schema import Spec

    return Spec.model_validate({
        "study": {"name": "s", "metric": "m", "n_trials": 1},
        "trainer": {"script": "t.py"}, "params": {"p": kw},
    }).params["p"]


@pytest.mark.parametrize(("how", "value", "prefix", "argv"), [
    ({"type": "float", "low": 0, "high": 1}, 0.5, "--", ["--p", "0.5"]),
    ({"type": "float", "low": 0, "high": 1, "arg": "--learning-rate"}, 0.5, "--",
     ["--learning-rate", "0.5"]),
    ({"type": "float", "low": 0, "high": 1}, 0.5, "-", ["-p", "0.5"]),
    ({"type": "float", "low": 0, "high": 1}, 0.5, "", ["p=0.5"]),  # Hydra style
    ({"type": "float", "low": 0, "high": 1, "prefix": ""}, 0.5, "--", ["p=0.5"]),
    ({"type": "float", "low": 0, "high": 1, "arg": "model.lr", "prefix": ""}, 0.5, "--",
     ["model.lr=0.5"]),
    ({"type": "bool"}, True, "--", ["--p", "true"]),
    ({"type": "bool", "flag": True}, True, "--", ["--p"]),
    ({"type": "bool", "flag": True}, False, "--", []),
    ({"type": "bool", "flag": True, "arg": "--use-amp"}, True, "--", ["--use-amp"]),
    ({"type": "fixed", "value": True, "flag": True, "arg": "--no-shuffle"}, True, "--",
     ["--no-shuffle"]),
])
def test_params_reach_the_script_the_way_it_expects(how, value, prefix, argv):
    assert launch_plan.param_args({"p": value}, {"p": _param(**how)}, prefix) == argv


def test_placeholders_and_variables_in_args_env_and_the_result_file(tmp_path):
    trainer = TrainerSection(
        script=Path("/t/train.py"), launcher="python",
        args=["--out", "{trial_dir}/hf", "--n", "{trial_number}", "--data", "{study_dir}/d",
              "--log", "$SWEEP_TRIAL_DIR/x", "--cuda", "${CUDA_VISIBLE_DEVICES}", "--cost",
              "$$5", "--unknown", "$NOT_SET", "--json", "{{\"a\": 1}}"],
        env={"OUT": "{output_dir}/o"}, result={"file": "{trial_dir}/hf/all_results.json"})
    plan = launch_plan.build_launch(trainer, 7, {}, 3, PATHS, Path("/a.yaml"), python="/py",
                               places={"study_dir": "/s", "output_dir": "/out"}, environ={},
                               through_accelerate=False)
    assert plan.argv[2:] == [
        "--out", "/out/trials/7/hf", "--n", "7", "--data", "/s/d",
        "--log", "/out/trials/7/x", "--cuda", "3", "--cost", "$5",
        "--unknown", "$NOT_SET", "--json", '{"a": 1}',
    ]
    assert plan.env["OUT"] == "/out/o"
    assert plan.result == Path("/out/trials/7/hf/all_results.json")


@pytest.mark.parametrize("mode", ["env", "file"])
def test_params_by_environment_or_file_leave_argv_alone(mode):
    trainer = TrainerSection(script=Path("/t/train.py"), launcher="python", pass_params=mode,
                             args=["--epochs", "1"])
    plan = launch_plan.build_launch(trainer, 1, {"lr": 0.1, "model.depth": 4}, 0, PATHS,
                               Path("/a.yaml"), python="/py", through_accelerate=False)
    assert plan.argv == ["/py", "/t/train.py", "--epochs", "1"]
    assert plan.env["SWEEP_PARAMS_FILE"] == "/out/trials/7/params.json"
    if mode == "env":
        assert plan.env["SWEEP_PARAM_LR"] == "0.1" and plan.env["SWEEP_PARAM_MODEL_DEPTH"] == "4"
    else:
        assert not [k for k in plan.env if k.startswith("SWEEP_PARAM_")]


def test_params_where_accelerate_go_on_the_launchers_command_line():
    from sweep.spec.searchspace import BoolParam, CategoricalParam, FloatParam

    trainer = TrainerSection(script=Path("/t/train.py"))
    passing = {
        "mixed_precision": CategoricalParam(type="categorical", choices=["no", "bf16"],
                                            where="accelerate"),
        "dynamo_use_fullgraph": BoolParam(type="bool", where="accelerate"),
        "lr": FloatParam(type="float", low=0.0, high=1.0),
    }
    params = {"mixed_precision": "bf16", "dynamo_use_fullgraph": True, "lr": 0.1}
    plan = launch_plan.build_launch(trainer, 7, params, 0, PATHS, Path("/a.yaml"), python="/py",
                               passing=passing)
    script = plan.argv.index("/t/train.py")
    assert plan.argv[script:] == ["/t/train.py", "--lr", "0.1"]
    settings = plan.argv[:script]
    at = settings.index("--mixed_precision")
    assert settings[at + 1] == "bf16" and "--dynamo_use_fullgraph" in settings
    params["dynamo_use_fullgraph"] = False
    plan = launch_plan.build_launch(trainer, 7, params, 0, PATHS, Path("/a.yaml"), python="/py",
                               passing=passing)
    assert "--dynamo_use_fullgraph" not in plan.argv  # a false flag is left out
    assert launch_plan.script_params(params, passing) == {"lr": 0.1}  # what params.json holds
    env_trainer = TrainerSection(script=Path("/t/train.py"), pass_params="env")
    plan = launch_plan.build_launch(env_trainer, 7, params, 0, PATHS, Path("/a.yaml"),
                               python="/py", passing=passing)
    assert "SWEEP_PARAM_MIXED_PRECISION" not in plan.env and "SWEEP_PARAM_LR" in plan.env


def test_direct_runs_one_interpreter_with_accelerates_variables_under_sweeps():
    trainer = TrainerSection(script=Path("/t/train.py"), launcher="direct", args=["--e", "1"])
    accelerate_env = {"ACCELERATE_MIXED_PRECISION": "bf16", "OMP_NUM_THREADS": "1",
                      "SWEEP_TRIAL_DIR": "/not/this/one"}
    plan = launch_plan.build_launch(trainer, 7, {"lr": 0.1}, 2, PATHS, Path("/a.yaml"),
                                    python="/py",
                               launcher_env=accelerate_env, pin="GPU-x",
                               through_accelerate=False)
    assert plan.argv == ["/py", "/t/train.py", "--e", "1", "--lr", "0.1"]
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and plan.env["OMP_NUM_THREADS"] == "1"
    assert plan.env["SWEEP_TRIAL_DIR"] == "/out/trials/7"  # sweep's own variables win
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "GPU-x"


def test_accelerates_environment_is_computed_once_per_options_and_cached(tmp_path, monkeypatch):
    from sweep.launch import _direct
    from sweep.launch._direct import AccelerateEnv

    calls = []

    def compute(self, options):
        calls.append(options)
        return {"ACCELERATE_MIXED_PRECISION": options[-1]}

    monkeypatch.setattr(AccelerateEnv, "_compute", compute)
    monkeypatch.setattr(_direct, "_COMPUTED", {})  # this process's, as a new one has it
    first = AccelerateEnv(tmp_path, "host-a")
    assert first.get(["--mixed_precision", "bf16"]) == {"ACCELERATE_MIXED_PRECISION": "bf16"}
    assert first.get(["--mixed_precision", "bf16"]) and len(calls) == 1  # memory
    later = AccelerateEnv(tmp_path, "host-a")  # the next run: from the file
    assert later.get(["--mixed_precision", "bf16"])["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert len(calls) == 1
    other = AccelerateEnv(tmp_path / "other", "host-a")  # another study in this process
    assert other.get(["--mixed_precision", "bf16"])["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert len(calls) == 1 and len(list((tmp_path / "other").glob("accelerate_env.*"))) == 1
    assert later.get(["--mixed_precision", "no"]) and len(calls) == 2  # other options
    AccelerateEnv(tmp_path, "host-b").get(["--mixed_precision", "bf16"])  # another host
    assert len(calls) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # what accelerate reads changed
    AccelerateEnv(tmp_path, "host-a").get(["--mixed_precision", "bf16"])
    assert len(calls) == 4


@pytest.mark.slow
def test_options_accelerate_refuses_are_one_line(tmp_path):
    from sweep._core.errors import SweepError
    from sweep.launch._direct import AccelerateEnv

    env = AccelerateEnv(tmp_path, "h", python=sys.executable)
    with pytest.raises(SweepError, match="accelerate refused the options --no_such_option"):
        env.get(["--no_such_option"])


def _spec(tmp_path, **trainer):
    from sweep.spec.schema import Spec

    return Spec.model_validate({
        "study": {"name": "s", "metric": "m", "n_trials": 1, "output_dir": str(tmp_path)},
        "trainer": {"script": "/t/train.py", **trainer},
        "params": {"x": {"type": "float", "low": 0, "high": 1}}})


def test_the_launcher_is_chosen_once_by_name(tmp_path, monkeypatch):
    """`make` is the one place that reads `trainer.launcher`; the default starts
    `accelerate launch` per trial, with sweep's config from the package (a file that exists
    wherever sweep is installed: a command sweep prints runs when pasted)."""
    from sweep.launch._accelerate import AccelerateLauncher, PythonLauncher
    from sweep.launch._direct import AccelerateEnv, DirectLauncher
    from sweep.launch._warm import WarmLauncher
    from sweep.launch.make import make

    monkeypatch.setattr(AccelerateEnv, "get", lambda self, options: {"A": "1"})
    kinds = {name: type(make(_spec(tmp_path, launcher=name), "h", tmp_path,
                                       spawn=lambda *a, **k: None))
             for name in ("accelerate", "direct", "warm", "python")}
    assert kinds == {"accelerate": AccelerateLauncher,
                     "direct": DirectLauncher,
                     "warm": WarmLauncher, "python": PythonLauncher}
    default = make(_spec(tmp_path), "h", tmp_path)
    plan = default.plan(3, {"x": 0.5}, 1)
    assert plan.argv[1:5] == ["-m", "accelerate.commands.launch", "--config_file",
                              str(launch_plan.ACCELERATE_CONFIG_FILE)]
    assert launch_plan.ACCELERATE_CONFIG_FILE.read_text() == launch_plan.ACCELERATE_CONFIG
    assert "distributed_type: 'NO'" in launch_plan.ACCELERATE_CONFIG
    direct = make(_spec(tmp_path, launcher="direct"), "h", tmp_path)
    assert direct.plan(3, {"x": 0.5}, 1).argv[1:] == ["/t/train.py", "--x", "0.5"]
    assert direct.plan(3, {"x": 0.5}, 1).env["A"] == "1"
    python = make(_spec(tmp_path, launcher="python"), "h", tmp_path)
    assert "A" not in python.plan(3, {"x": 0.5}, 1).env


def test_no_module_but_the_factory_asks_which_launcher_a_run_has():
    import re

    package = Path(launch_plan.__file__).parent.parent
    asks = re.compile(r"\.launcher\s*(==|!=|in\b|not in\b)|launcher\s*==\s*\"")
    found = [p.relative_to(package).as_posix() for p in package.rglob("*.py")
             if asks.search(p.read_text())]
    assert sorted(found) == ["launch/make.py",  # the factory, and the checks
                             "spec/_container_checks.py", "spec/checks.py", "spec/schema.py"]


def test_settings_of_old_or_other_launchers_are_named_once(tmp_path):
    from sweep.launch.make import make

    said: list[str] = []
    make(_spec(tmp_path, fork_launcher=False, preload=["json"]), "h", tmp_path,
                   said.append)
    assert said == [
        "trainer.preload is for launcher: warm; launcher is accelerate: nothing is preloaded",
        "trainer.fork_launcher is no longer used: every trial starts as a new process "
        "(launcher: warm is the fast path for trials of seconds); remove it from the study "
        "file"]
    said.clear()
    make(_spec(tmp_path, fork_launcher=True), "h", tmp_path, said.append, dry=True)
    assert said == []  # a dry run says nothing of it


def test_a_dry_runs_line_makes_the_trial_folder_and_params_file_first(tmp_path):
    from sweep.commands._dry_run import runnable

    paths = folders.TrialPaths.of(tmp_path / "o u t", 2)
    plan = launch_plan.build_launch(TrainerSection(script=Path("/t.py"), launcher="python"), 2,
                               {"lr": 0.5}, 1, paths, Path("/c"), python=sys.executable,
                               through_accelerate=False)
    line = runnable(plan, {"lr": 0.5})
    assert line.startswith(f"mkdir -p {shlex.quote(str(paths.dir))} && printf ")
    assert line.endswith(plan.command_line())
    script = line.split(" && ")
    subprocess.run(["sh", "-c", " && ".join(script[:2])], check=True)
    assert json.loads(paths.params.read_text()) == {"lr": 0.5}


def test_a_recursive_alias_in_the_accelerate_config_file_is_one_line(tmp_path):
    """Issue 32: `&a [*a]` made every verb hang with memory growing."""
    from sweep.spec import accelconfig

    path = tmp_path / "team.yaml"
    path.write_text("distributed_type: 'NO'\ndynamo_config: &a [*a]\n")
    with pytest.raises(accelconfig.ConfigFileError) as refused:
        accelconfig.read(path)
    assert str(refused.value) == (
        f"{path}: line 2: an alias refers to the value that contains it")


def test_every_variable_sweep_sets_for_a_trial_is_one_its_args_may_name():
    """The load-time check of `$NAME` in args knows every variable `build_launch` sets (a
    stream report, a port, params by environment, a tracker's and a lineage's variables)."""
    from sweep.spec.checks import trial_variables
    from sweep.trial import lineage

    trainer = TrainerSection(script=Path("/t/train.py"), launcher="python", pass_params="env",
                             report={"stdout": r"loss (?P<value>\S+)"}, env={"OWN": "1"})
    params = {"lr": _param(type="float", low=0.1, high=1.0)}
    start = lineage.Start(Path("/out/checkpoints/7"), run_id="s-7-ab")
    plan = launch_plan.build_launch(trainer, 7, {"lr": 0.5}, 3, PATHS, Path("/a.yaml"),
                                    python="/py", port=29500, start=start, study="s",
                                    through_accelerate=False)
    assert {"PYTHONUNBUFFERED", "SWEEP_MAIN_PORT", "SWEEP_PARAM_LR", "WANDB_NAME",
            "WANDB_RUN_ID", "OWN"} <= set(plan.env)
    assert set(plan.env) <= trial_variables(trainer, params, {})
