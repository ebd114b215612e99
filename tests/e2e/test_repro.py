"""Issue 25: reproducible trials. A team's accelerate config file as the base of each trial's
launch config, the trainer's own interpreter, a working folder per trial, and a record of
what ran (env.json, code.patch, code_version)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import (
    ASKS_ACCELERATES_KEYS,
    ROOT,
    assert_gone,
    load_trials,
    run_cli,
    spawn_cli,
    study_dict,
)

from sweep._core import names
from sweep._core.errors import ConfigError
from sweep.launch import provenance
from sweep.spec import accelconfig, config, interpreter, schema
from sweep.trial import launch_plan
from sweep.trial.folders import TrialPaths

TEAM = ROOT / "studies" / "accelerate" / "fsdp.yaml"
KEYS = ("compute_environment", "debug", "distributed_type", "fsdp_config", "gpu_ids",
        "machine_rank", "main_process_port", "mixed_precision", "num_machines",
        "num_processes", "use_cpu", "deepspeed_config", "dynamo_config")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                           *args], capture_output=True, text=True, check=True).stdout


# ---- the merged launch config (pure) ----------------------------------------------------


def test_one_device_trials_keep_the_files_settings_under_sweeps_own():
    data = accelconfig.read(TEAM)
    merged = accelconfig.merge({**data, "distributed_type": "MULTI_GPU",
                                "main_process_ip": "10.0.0.1", "main_process_port": 1234}, 1)
    assert merged.config["distributed_type"] == "NO"  # else torchrun on a fixed port
    assert (merged.config["num_processes"], merged.config["num_machines"],
            merged.config["machine_rank"]) == (1, 1, 0)
    assert not {"gpu_ids", "main_process_ip", "main_process_port"} & set(merged.config)
    assert merged.config["fsdp_config"] == data["fsdp_config"]
    assert (merged.config["mixed_precision"], merged.config["debug"]) == ("bf16", True)
    assert merged.notes == ()
    fsdp = accelconfig.merge(data, 1)
    assert fsdp.distributed_type == "NO" and fsdp.notes == (
        "trainer.accelerate.config_file: distributed_type FSDP needs several processes, and "
        "trials have one device (gpus_per_trial: 1): they run without FSDP",)


def test_several_device_trials_keep_fsdp_and_get_no_multi_gpu_flag():
    data = accelconfig.read(TEAM)
    merged = accelconfig.merge(data, 2)
    assert merged.distributed_type == "FSDP" and merged.config["num_processes"] == 2
    assert accelconfig.merge({**data, "distributed_type": "NO"}, 2).distributed_type == (
        "MULTI_GPU")
    spec = schema.TrainerSection(script=Path("t.py"), gpus_per_trial=2)
    fsdp = launch_plan.accelerate_settings(spec, Path("c.yaml"), "0,1", 29600, None, "FSDP")
    multi = launch_plan.accelerate_settings(spec, Path("c.yaml"), "0,1", 29600, None, "MULTI_GPU")
    assert "--multi_gpu" not in fsdp  # the flag would make accelerate ignore the file's FSDP
    assert fsdp == ["--config_file", "c.yaml", "--num_processes", "2", "--num_machines", "1",
                    "--gpu_ids", "0,1", "--main_process_port", "29600"]
    assert multi[2] == "--multi_gpu"
    assert merged.digest == accelconfig.merge(dict(reversed(list(data.items()))), 2).digest


@pytest.mark.parametrize(("change", "settings", "expected"), [
    ({"num_machines": 2}, {}, "num_machines is 2: sweep runs each trial on one machine "
     "(several hosts run their own drivers of one study: docs/how-to/several-hosts.md); set "
     "num_machines: 1"),
    ({"gradient_accumulation_steps": 4}, {}, "keys the trainer's accelerate does not know: "
     "gradient_accumulation_steps (accelerate refuses them too: remove them, or write the "
     "file again with `accelerate config`)"),
    ({"distributed_type": "DEEPSPEED"}, {}, "distributed_type is DEEPSPEED, and deepspeed is "
     "not installed in the trainer's interpreter: install it there (pip install deepspeed)"),
    ({"compute_environment": "AMAZON_SAGEMAKER"}, {}, "compute_environment is "
     "'AMAZON_SAGEMAKER': sweep launches trials on this machine; set compute_environment: "
     "LOCAL_MACHINE"),
    ({}, {"mixed_precision": "fp16"}, "mixed_precision is 'bf16' here and 'fp16' in "
     "trainer.accelerate.mixed_precision: give it in one place"),
    ({"dynamo_config": {"dynamo_backend": "INDUCTOR"}}, {"dynamo_backend": "eager"},
     "dynamo_config.dynamo_backend is 'INDUCTOR' here and 'eager' in "
     "trainer.accelerate.dynamo_backend: give it in one place"),
])
def test_what_contradicts_sweep_is_one_message(change, settings, expected):
    data = {**accelconfig.read(TEAM), **change}
    keys = KEYS + tuple(accelconfig.read(TEAM))
    assert accelconfig.problems(data, keys, False, settings.get("mixed_precision"),
                                settings.get("dynamo_backend")) == [expected]


def test_a_consistent_file_has_no_problems():
    data = accelconfig.read(TEAM)
    assert accelconfig.problems(data, KEYS + tuple(data), False, "bf16", None) == []
    assert accelconfig.problems({**data, "distributed_type": "DEEPSPEED"}, None, True, None,
                                None) == []


@ASKS_ACCELERATES_KEYS
@pytest.mark.slow
def test_accelerates_own_keys_are_what_the_probe_reports(tmp_path):
    """Contract: the keys `interpreter.probe` reads from accelerate's ClusterConfig are those
    accelerate's own loader takes: a file it writes passes `problems`, and a key it refuses
    (gradient_accumulation_steps at the top level) is refused by both."""
    from accelerate.commands.config.config_args import ClusterConfig

    keys = interpreter.probe(sys.executable, keys=True).keys
    assert keys is not None and "fsdp_config" in keys and "num_machines" in keys
    written = tmp_path / "written.yaml"
    ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU",
                  mixed_precision="bf16", use_cpu=False, debug=True, num_processes=2,
                  machine_rank=0, num_machines=1).to_yaml_file(written)
    assert accelconfig.problems(accelconfig.read(written), keys, False, None, None) == []
    assert accelconfig.problems(accelconfig.read(TEAM), keys, False, None, None) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text(written.read_text() + "gradient_accumulation_steps: 4\n")
    with pytest.raises(ValueError, match="unknown keys"):
        ClusterConfig.from_yaml_file(bad)
    assert accelconfig.problems(accelconfig.read(bad), keys, False, None, None)[0].startswith(
        "keys the trainer's accelerate does not know: gradient_accumulation_steps")


CHOICES = {"distributed_type": ("NO", "MULTI_GPU", "FSDP"),
           "mixed_precision": ("no", "fp16", "bf16"), "dynamo_backend": ("NO", "INDUCTOR")}


@pytest.mark.parametrize(("change", "expected"), [
    ({"mixed_precision": "fp17"}, "mixed_precision is 'fp17': the trainer's accelerate takes "
     "no, fp16, bf16 (accelerate refuses it too: give one of them)"),
    ({"distributed_type": "BOGUS"}, "distributed_type is 'BOGUS': the trainer's accelerate "
     "takes NO, MULTI_GPU, FSDP (accelerate refuses it too: give one of them)"),
    ({"dynamo_config": {"dynamo_backend": "turbo"}}, "dynamo_config.dynamo_backend is "
     "'turbo': the trainer's accelerate takes NO, INDUCTOR (accelerate refuses it too: give "
     "one of them)"),
    ({"mixed_precision": 16}, "mixed_precision is 16: the trainer's accelerate takes no, fp16, "
     "bf16 (accelerate refuses it too: give one of them)"),
])
def test_a_value_the_trainers_accelerate_refuses_is_one_message(change, expected):
    data = {**accelconfig.read(TEAM), **change}
    assert accelconfig.problems(data, None, False, None, None, choices=CHOICES) == [expected]


def test_values_in_accelerates_case_are_taken():
    data = {**accelconfig.read(TEAM), "mixed_precision": "BF16",
            "dynamo_config": {"dynamo_backend": "inductor"}}
    assert accelconfig.problems(data, None, False, None, None, choices=CHOICES) == []


@ASKS_ACCELERATES_KEYS
def test_the_probe_reports_accelerates_own_enums_and_a_bad_value_is_refused_by_load(tmp_path):
    """Contract: the values come from accelerate's public enums (accelerate.utils), asked in
    the trainer's interpreter; a bad one is refused before anything is written."""
    from accelerate.utils import DistributedType, DynamoBackend, PrecisionType

    choices = interpreter.probe(sys.executable, keys=True).choices
    assert choices == {"distributed_type": tuple(e.value for e in DistributedType),
                       "mixed_precision": tuple(e.value for e in PrecisionType),
                       "dynamo_backend": tuple(e.value for e in DynamoBackend)}
    study = team_study(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(team.read_text().replace("mixed_precision: bf16", "mixed_precision: fp17"))
    with pytest.raises(ConfigError) as e:
        config.load(study)
    assert str(e.value) == (f"{study}: trainer.accelerate.config_file: {team}: "
                            "mixed_precision is 'fp17': the trainer's accelerate takes "
                            f"{', '.join(choices['mixed_precision'])} (accelerate refuses it "
                            "too: give one of them)")


# ---- the study file ----------------------------------------------------------------------


def team_study(tmp_path: Path, **accelerate: object) -> Path:
    shutil.copy(TEAM, tmp_path / "team.yaml")
    data = study_dict(trainer={"launcher": "accelerate",
                               "accelerate": {"config_file": "team.yaml", **accelerate}})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@ASKS_ACCELERATES_KEYS
@pytest.mark.slow
def test_several_machines_in_the_config_are_refused_in_one_line_before_anything_is_written(
        tmp_path, capsys):
    study = team_study(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(team.read_text().replace("num_machines: 1", "num_machines: 2"))
    assert run_cli("run", str(study)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"sweep: error: {study}: trainer.accelerate.config_file: {team}: "
                   "num_machines is 2: sweep "
                   "runs each trial on one machine (several hosts run their own drivers of "
                   "one study: docs/how-to/several-hosts.md); set num_machines: 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml", "team.yaml"]


def test_a_config_file_with_launcher_python_is_refused(tmp_path):
    shutil.copy(TEAM, tmp_path / "team.yaml")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"accelerate": {
        "config_file": "team.yaml"}})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.accelerate.config_file: launcher: python runs "
                            "no accelerate; use launcher: accelerate (or direct, warm), or "
                            "remove the config file")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_config_file_that_is_no_regular_file_is_refused_in_one_line_without_reading_it(
        tmp_path, kind):
    """A FIFO would block the read forever, /dev/zero would fill memory: both are refused as
    the study file itself is (one bounded, non-blocking read)."""
    study = team_study(tmp_path)
    team = tmp_path / "team.yaml"
    team.unlink()
    if kind == "fifo":
        os.mkfifo(team)
    else:
        team.symlink_to("/dev/zero")
    with pytest.raises(ConfigError) as e:
        config.load(study)
    assert str(e.value) == (f"{study}: trainer.accelerate.config_file: {team.resolve()} is "
                            "not a "
                            "regular file (a folder? a FIFO?): give the file `accelerate "
                            "config` writes")


def test_a_config_file_too_large_is_refused(tmp_path):
    study = team_study(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text("# " + "x" * config.MAX_FILE + "\n")
    with pytest.raises(ConfigError) as e:
        config.load(study)
    assert str(e.value) == (f"{study}: trainer.accelerate.config_file: {team} is larger than "
                            f"{config.MAX_FILE} bytes: give the file `accelerate config` "
                            "writes")


def make_venv(where: Path, with_accelerate: bool) -> Path:
    """A second venv of this Python (fast: no pip) with a module the driver's venv lacks;
    `with_accelerate`: it sees the driver's site-packages too (accelerate, torch)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", "--system-site-packages", str(where)],
                   check=True)
    site = where / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "only_in_the_trainer_venv.py").write_text("WHERE = 'the trainer venv'\n")
    if with_accelerate:
        import site as driver_site

        (site / "driver_packages.pth").write_text("\n".join(driver_site.getsitepackages()))
    return where / "bin" / "python"


@pytest.mark.parametrize(("python", "expected"), [
    ("nowhere/python", "no such file: {base}/nowhere/python: give a working Python (e.g. your "
     "project's .venv/bin/python)"),
    ("study.yaml", "not executable: {base}/study.yaml: give a working Python (e.g. your "
     "project's .venv/bin/python)"),
])
def test_a_missing_interpreter_is_one_line_before_anything_is_written(tmp_path, python,
                                                                      expected):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": python})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == f"{path}: trainer.python: " + expected.format(base=tmp_path)


def test_a_broken_interpreter_and_one_without_accelerate_are_refused(tmp_path):
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": "broken"})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.python: {broken} is not a working Python (exit "
                            "3: cannot start): give a working Python (e.g. your project's "
                            ".venv/bin/python)")
    bare = make_venv(tmp_path / "bare", with_accelerate=False)
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": str(bare),
                                                       "launcher": "accelerate"})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.python: {bare} has no accelerate, which "
                            "launcher: accelerate runs: install it there (pip install "
                            "accelerate), or use launcher: python")
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": str(bare)})))
    assert config.load(path).trainer.python == str(bare)  # launcher: python needs none


def test_an_interpreter_that_hangs_is_one_short_line_and_its_whole_group_is_killed(
        tmp_path, monkeypatch):
    """A `trainer.python` that never answers: refused after PROBE_TIMEOUT in one line naming
    the file (not the probe's source), and what it started is killed with it."""
    pid_file = tmp_path / "child.pid"
    hang = tmp_path / "hang"
    hang.write_text(f"#!/bin/bash\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    hang.chmod(0o755)
    assert interpreter.PROBE_TIMEOUT == 30.0
    monkeypatch.setattr(interpreter, "PROBE_TIMEOUT", 1.0)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": "hang"})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.python: {hang} did not answer in 1 s (a program "
                            "that hangs, not a Python?): give a working Python (e.g. your "
                            "project's .venv/bin/python)")
    assert_gone(int(pid_file.read_text()), "the probe's child still runs")


def test_a_driver_stopped_while_probing_kills_the_probes_whole_group(tmp_path):
    """SIGTERM to `sweep run --dry-run` while it waits for a `trainer.python` that hangs: the
    driver ends, and the probe's child (`sleep 300`) does not outlive it."""
    pid_file = tmp_path / "child.pid"
    hang = tmp_path / "hang"
    hang.write_text(f"#!/bin/bash\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    hang.chmod(0o755)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": "hang"})))
    proc = spawn_cli("run", "--dry-run", str(path))
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.02)
    child = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert_gone(child, "the probe's child outlived the driver")


def test_a_daemon_the_interpreter_starts_in_its_own_session_does_not_outlive_the_probe(
        tmp_path):
    """Item 16 (issue 38): a `trainer.python` (a wrapper) that starts a daemon which calls
    setsid, then answers: the daemon left the probe's process group and outlived the run.
    Every process that carries the probe's token in its environment is killed with it."""
    pid_file = tmp_path / "daemon.pid"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/bash\nsetsid sleep 300 < /dev/null > /dev/null 2>&1 &\n"
                       f"echo $! > {pid_file}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    interpreter.probe(str(wrapper))
    assert_gone(int(pid_file.read_text()), "the probe's daemon outlived it")


def test_a_folder_as_interpreter_says_it_is_a_folder(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": "/tmp"})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.python: /tmp is a folder, not an interpreter: "
                            "give a working Python (e.g. your project's .venv/bin/python)")


def test_an_accelerate_that_has_metadata_but_cannot_be_imported_is_none(tmp_path):
    """A venv with an accelerate-*.dist-info folder but no accelerate package: the probe asks
    `importlib.util.find_spec` (nothing is imported), and the launcher is refused."""
    bare = make_venv(tmp_path / "bare", with_accelerate=False)
    site = bare.parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / (
        "site-packages")
    info = site / "accelerate-1.15.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 1.15.0\n")
    assert not interpreter.probe(str(bare)).has("accelerate")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"python": str(bare),
                                                       "launcher": "accelerate"})))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.python: {bare} has no accelerate, which "
                            "launcher: accelerate runs: install it there (pip install "
                            "accelerate), or use launcher: python")


# ---- the plan --------------------------------------------------------------------------


def test_the_plan_runs_the_trainers_python_in_its_workdir_with_tracker_names(tmp_path):
    trainer = schema.TrainerSection(
        script=Path("/w/train.py"), python="/venv/bin/python", workdir="{trial_dir}/run",
        env={"WANDB_NAME": "mine"}, result=schema.ResultSection(file="out/metrics.json"))
    paths = TrialPaths(tmp_path / "trials" / "3")
    plan = launch_plan.build_launch(trainer, 3, {}, 0, paths, Path("c.yaml"),
                                    python="/venv/bin/python",
                               places={"study_dir": "/s"}, study="team")
    assert plan.argv[:3] == ["/venv/bin/python", "-m", "accelerate.commands.launch"]
    assert plan.cwd == paths.dir / "run"
    assert plan.result == paths.dir / "run" / "out" / "metrics.json"  # the trainer's cwd
    assert plan.env["WANDB_RUN_GROUP"] == "team" and plan.env["WANDB_NAME"] == "mine"
    relative = schema.TrainerSection(script=Path("/w/train.py"), workdir="runs/{trial_number}")
    assert launch_plan.build_launch(relative, 3, {}, 0, paths, Path("c.yaml"),
                               places={"study_dir": "/s"}).cwd == Path("/s/runs/3")
    assert launch_plan.tracker_env("team", 3, {}) == {"WANDB_RUN_GROUP": "team",
                                                  "WANDB_NAME": "trial-3"}


# ---- the record ------------------------------------------------------------------------


def test_the_code_version_is_the_commit_plus_a_hash_of_the_diff(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print(1)\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "first")
    commit = git(repo, "rev-parse", "HEAD").strip()
    clean = provenance.git_code(repo)
    assert clean == provenance.Code(str(repo), commit, "main", False, b"",
                                    digest=provenance.hashlib.sha256(b"").hexdigest())
    assert clean.version == commit[:12]
    (repo / "train.py").write_text("print(2)\n")
    (repo / "notes.txt").write_text("x")
    dirty = provenance.git_code(repo)
    assert dirty is not None and dirty.dirty and dirty.untracked == ("notes.txt",)
    assert dirty.version.startswith(commit[:12] + "+") and len(dirty.version) == 21
    digest = provenance.hashlib.sha256(dirty.patch).hexdigest()
    assert dirty.version == f"{commit[:12]}+{digest[:8]}"
    (repo / "train.py").write_bytes(b"print('\xff')\n")  # not UTF-8: kept as bytes
    binary = provenance.git_code(repo)
    assert binary is not None and b"\xff" in binary.patch
    assert provenance.git_code(tmp_path) is None  # no repository


def test_differences_say_what_changed_in_one_phrase():
    then = {names.CODE_VERSION: "abc", "env_version": "e1"}
    assert provenance.differences(then, then) is None
    assert provenance.differences({}, then) is None  # a trial of an older sweep
    assert provenance.differences(then, {names.CODE_VERSION: "abd", "env_version": "e1"}) == (
        "the code differs (it ran abc, now abd)")
    assert provenance.differences({**then, "env_version": None}, {"env_version": "e2"}) == (
        "the code differs (it ran abc, now no git repository)")  # no env.json to compare
    assert provenance.differences(then, {"env_version": "e2"}) == (
        "the code differs (it ran abc, now no git repository) and the environment differs "
        "(interpreter, package versions or accelerate config)")


def test_the_imports_of_the_scripts_folder_less_the_standard_library_and_its_own(tmp_path):
    (tmp_path / "train.py").write_text("import os, numpy as np\nfrom torch.nn import Linear\n"
                                       "from . import x\nimport helpers\n")
    (tmp_path / "helpers.py").write_text("import yaml\nfrom __future__ import annotations\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert provenance.script_imports(tmp_path) == ["numpy", "torch", "yaml"]


# ---- end to end --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("rendezvous")
def test_two_process_trials_get_the_teams_config_and_devices_and_ports_of_their_own(
        tmp_path, monkeypatch, capsys):
    """Acceptance: trials of two processes (gloo on CPU) launched through a real `accelerate
    launch` with the committed config of studies/team_config.yaml (FSDP, bf16, debug mode):
    each one's Accelerator sees all three, and the devices and processes sweep gave it. Two
    such trials at once on four simulated devices, each on its own devices and port."""
    for folder in ("studies", "tests"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    study = tmp_path / "studies" / "team_config.yaml"
    data = yaml.safe_load(study.read_text())
    assert data["study"]["n_trials"] == 2
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "4")
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    trials = load_trials(study, "team-config")
    assert sorted(t.user_attrs[names.GPUS] for t in trials) == ["0,1", "2,3"], [
        (t.state.name, t.user_attrs.get(names.FAIL_REASON)) for t in trials]
    ports = set()
    for t in trials:
        trial = tmp_path / "studies" / "team-config" / "trials" / str(t.number)
        seen = json.loads((trial / "accelerator.json").read_text())
        assert seen == {
            "num_processes": 2, "rank_sum": 1.0, "mixed_precision": "bf16", "debug": True,
            "fsdp": {"sharding_strategy": "ShardingStrategy.SHARD_GRAD_OP",
                     "state_dict_type": "StateDictType.SHARDED_STATE_DICT"},
            "cuda_visible_devices": t.user_attrs[names.GPUS], "port": seen["port"]}
        assert t.value == 1.0  # ranks 0 + 1
        ports.add(seen["port"])
        record = json.loads((trial / "env.json").read_text())
        assert record["accelerate"]["file"] == str(study.parent / "accelerate" / "fsdp.yaml")
        assert record["accelerate"]["config"]["distributed_type"] == "FSDP"
        assert [str(g["index"]) for g in record["gpus"]] == t.user_attrs[names.GPUS].split(",")
    assert len(ports) == 2 and None not in ports


@pytest.mark.slow
def test_a_trial_runs_with_the_trainers_own_venv(tmp_path, write_study, monkeypatch, capsys):
    """Acceptance: `trainer.python` is a second venv with a module the driver's venv lacks;
    the trial (through that venv's `accelerate launch`) imports it and completes."""
    python = make_venv(tmp_path / "trainer-venv", with_accelerate=True)
    with pytest.raises(ImportError):
        __import__("only_in_the_trainer_venv")
    script = tmp_path / "uses_venv.py"
    script.write_text(
        "import json, os, sys\nimport only_in_the_trainer_venv as m\n"
        "json.dump({'score': 1.0, 'where': m.WHERE, 'prefix': sys.prefix},"
        " open(os.environ['SWEEP_RESULT_FILE'], 'w'))\n")
    study = write_study(study={"n_trials": 1},
                        trainer={"script": str(script), "launcher": "accelerate",
                                 "python": str(python)}, params={})
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    [trial] = load_trials(study)
    assert trial.state.name == "COMPLETE", trial.user_attrs
    result = json.loads((tmp_path / "probe" / "trials" / "0" / "result.json").read_text())
    assert result["where"] == "the trainer venv"
    assert result["prefix"] == str(tmp_path / "trainer-venv")
    record = json.loads((tmp_path / "probe" / "trials" / "0" / "env.json").read_text())
    assert record["python"]["prefix"] == str(tmp_path / "trainer-venv")


@pytest.mark.slow
def test_hydra_in_its_trial_folder_and_a_record_of_dirty_code(tmp_path, capsys, monkeypatch):
    """Acceptance: the Hydra pattern of studies/hydra_style.yaml with workdir "{trial_dir}"
    leaves one output folder per trial, its data found through {study_dir}; the script sits
    in a git repository with an uncommitted change: env.json holds the commit and dirty, its
    code.patch applies to the commit, and the summary has code_version. A rerun says the
    code has changed since."""
    repo = tmp_path / "repo"
    for folder in ("studies", "tests"):
        shutil.copytree(ROOT / folder, repo / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first")
    commit = git(repo, "rev-parse", "HEAD").strip()
    app = repo / "tests" / "examples" / "hydra_style.py"
    app.write_text(app.read_text() + "# an uncommitted change\n")
    study = repo / "studies" / "hydra_style.yaml"
    data = yaml.safe_load(study.read_text())
    data["study"]["n_trials"] = 2
    study.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)  # the driver's folder
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()  # nothing in the driver's folder
    trials = repo / "studies" / "hydra-style" / "trials"
    for n in range(2):
        runs = list((trials / str(n) / "outputs").glob("*/*"))
        assert len(runs) == 1 and (runs[0] / ".hydra" / "overrides.yaml").is_file()
        record = json.loads((trials / str(n) / "env.json").read_text())
        assert record["code"]["commit"] == commit and record["code"]["dirty"] is True
        assert record["code"]["branch"] == "main" and record["cwd"] == str(trials / str(n))
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    git(clone, "apply", "--check", str(trials / "0" / "code.patch"))
    version = json.loads((trials / "0" / "env.json").read_text())[names.CODE_VERSION]
    assert version.startswith(commit[:12] + "+")
    assert run_cli("summary", str(study)) == 0
    capsys.readouterr()
    frame = __import__("pandas").read_csv(repo / "studies" / "hydra-style" / "summary.csv")
    assert list(frame[names.CODE_VERSION]) == [version] * 2
    git(repo, "commit", "-qam", "second")
    assert run_cli("rerun", str(study), "0") == 0
    out = capsys.readouterr().out
    assert f"the code differs (it ran {version}, now " in out


def test_warm_starts_trials_as_direct_for_another_interpreter(tmp_path):
    from sweep.launch._warm import WarmLauncher, other_interpreter
    from sweep.launch.make import make

    python = make_venv(tmp_path / "venv", with_accelerate=True)
    assert not other_interpreter(None)
    assert not other_interpreter(sys.executable)
    assert other_interpreter(str(python))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"launcher": "warm",
                                                       "python": str(python)})))
    said: list[str] = []
    warm = make(config.load(path), "host", tmp_path / "own", said.append)
    assert isinstance(warm, WarmLauncher) and warm.server is None
    assert said == [f"launcher: warm: trainer.python is another interpreter ({python}) than the "
                    "driver's, whose fork server it cannot be; starting trials as launcher: "
                    "direct"]
    warm.close()



def test_a_trial_with_a_workdir_is_pasted_and_rerun_by_hand_in_it(tmp_path):
    from sweep.commands._dry_run import runnable
    from sweep.trial import command_script, folders

    trainer = schema.TrainerSection(script=Path("/w/app.py"), launcher="python",
                                    workdir="{trial_dir}/run dir")
    paths = TrialPaths(tmp_path / "trials" / "1")
    plan = launch_plan.build_launch(trainer, 1, {}, 0, paths, Path("c.yaml"),
                               places={"study_dir": str(tmp_path)})
    where = paths.dir / "run dir"
    assert f"&& mkdir -p '{where}' && cd '{where}' && " in runnable(plan, {})
    assert command_script.command_script(plan, {}).splitlines()[-2] == f"cd '{where}' || exit 1"
    folders.prepare_trial_dir(plan, {})
    assert where.is_dir()  # made with the trial's folder


def test_the_gpu_driver_and_cuda_versions_come_from_nvml(monkeypatch):
    from sweep.gpus.nvml import Nvml
    from sweep.testing import fake_pynvml
    from sweep.testing.fake_pynvml import FakeGpu

    fake_pynvml.install(monkeypatch, [FakeGpu(name="NVIDIA H100", uuid="GPU-1")])
    nvml = Nvml()
    assert nvml.system() == ("550.54.15", "12.4")  # 12040 as NVML gives it
    monkeypatch.setattr(fake_pynvml, "nvmlSystemGetCudaDriverVersion",
                        lambda: (_ for _ in ()).throw(fake_pynvml.NVMLError(
                            fake_pynvml.NVML_ERROR_NOT_SUPPORTED)))
    assert nvml.system() == ("550.54.15", None)
    nvml.close()


def test_git_is_called_with_argv_lists_and_a_timeout_and_a_hung_git_records_nothing(tmp_path):
    calls = []

    def hung(argv, **kw):
        calls.append((argv, kw["timeout"]))
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    assert provenance.git_code(tmp_path, run=hung) is None
    assert calls == [(["git", "-C", str(tmp_path), "rev-parse", "--show-toplevel"],
                      provenance.GIT_TIMEOUT)]


@pytest.mark.slow
def test_a_missing_or_unreadable_config_file_is_one_line(tmp_path):
    path = team_study(tmp_path)
    (tmp_path / "team.yaml").unlink()
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.accelerate.config_file: cannot read "
                            f"{tmp_path / 'team.yaml'} (No such file or directory): give "
                            "the file `accelerate config` writes")
    (tmp_path / "team.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert str(e.value) == (f"{path}: trainer.accelerate.config_file: {tmp_path / 'team.yaml'} "
                            "is not a mapping of accelerate config keys (write it with "
                            "`accelerate config`)")


def test_what_a_trial_ran_with_is_its_attribute_and_its_env_json(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"env_version": "e1", names.CODE_VERSION: "x"}))
    assert provenance.recorded({names.CODE_VERSION: "abc"}, str(tmp_path)) == {
        names.CODE_VERSION: "abc", "env_version": "e1"}
    assert provenance.recorded({}, str(tmp_path / "gone")) == {
        names.CODE_VERSION: None, "env_version": None}
    assert provenance.recorded({}, None) == {names.CODE_VERSION: None, "env_version": None}


@ASKS_ACCELERATES_KEYS
@pytest.mark.slow
def test_a_run_of_one_device_trials_says_it_runs_without_the_files_fsdp(tmp_path):
    from sweep.launch.make import make

    said: list[str] = []
    launcher = make(config.load(team_study(tmp_path)), "h", tmp_path, said.append)
    assert said == ["trainer.accelerate.config_file: distributed_type FSDP needs several "
                    "processes, and trials have one device (gpus_per_trial: 1): they run "
                    "without FSDP"]
    launcher.prepare()  # writes the merged config the plans name
    plan = launcher.plan(0, {"x": 0.5}, 0)
    used = Path(plan.argv[plan.argv.index("--config_file") + 1])
    assert yaml.safe_load(used.read_text())["distributed_type"] == "NO"
    assert used.parent == tmp_path / "probe" / "cache" and "--multi_gpu" not in plan.argv
    said.clear()
    make(config.load(team_study(tmp_path)), "h", tmp_path, said.append, dry=True)
    assert said == []  # a dry run prints its header instead


def test_the_code_of_a_repository_without_commits_or_of_an_untracked_script_is_recorded(
        tmp_path):
    """Hostile pass: in a repository without commits every trial had an empty code.patch and
    the same code_version (the hash of nothing), whatever the staged script said; an
    untracked script could change between trials with code_version unchanged."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    script = repo / "t.py"
    script.write_text("print(1)\n")
    git(repo, "add", "t.py")
    first = provenance.git_code(repo, script=script)
    assert first is not None and first.commit is None and first.dirty
    assert b"print(1)" in first.patch
    script.write_text("print(2)\n")  # changed after it was staged: the diff says so too
    second = provenance.git_code(repo, script=script)
    assert second is not None and b"print(2)" in second.patch
    assert second.version != first.version
    empty = provenance.hashlib.sha256(b"").hexdigest()[:8]
    assert not first.version.endswith(empty) and not second.version.endswith(empty)

    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "README").write_text("x")
    git(other, "add", "README")
    git(other, "commit", "-qm", "first")
    (other / "new").mkdir()
    loose = other / "new" / "train.py"  # in an untracked folder: git lists only the folder
    loose.write_text("print('a')\n")
    a = provenance.git_code(other, script=loose)
    loose.write_text("print('b')\n")
    b = provenance.git_code(other, script=loose)
    assert a is not None and b is not None and a.dirty and b.dirty
    assert a.version != b.version and b"print('b')" in b.patch
    target = tmp_path / "applied"
    subprocess.run(["git", "init", "-q", str(target)], check=True)
    (target / "README").write_text("x")
    patch = tmp_path / "code.patch"
    patch.write_bytes(b.patch)
    subprocess.run(["git", "-C", str(target), "apply", str(patch)], check=True)
    assert (target / "new" / "train.py").read_text() == "print('b')\n"


def test_a_workdir_that_is_a_file_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                       fake_gpus):
    """Hostile pass: a workdir that is a file cost a trial (FAIL "could not prepare") and
    exit 1; it is a study file mistake: exit 2, one line, nothing written."""
    (tmp_path / "afile").write_text("x")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(trainer={"workdir": "afile"})))
    assert run_cli("run", str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"sweep: error: {path}: trainer.workdir: {tmp_path / 'afile'} is a file, "
                   "not a folder: name a folder (made if missing) or a placeholder path such "
                   "as \"{trial_dir}\"")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "study.yaml"]
    path.write_text(yaml.safe_dump(study_dict(trainer={"workdir": "{trial_dir}/afile"})))
    assert config.load(path).trainer.workdir == "{trial_dir}/afile"  # per trial: made then


def committed_repo(path: Path) -> str:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "train.py").write_text("print(1)\n")
    git(path, "add", "train.py")
    git(path, "commit", "-qm", "first")
    return git(path, "rev-parse", "HEAD").strip()


def test_a_git_that_times_out_or_fails_records_the_code_as_unknown(tmp_path, monkeypatch):
    """Issue 32: a hanging core.fsmonitor (or a 200 MiB modified binary whose diff takes
    longer than the timeout) was recorded as `dirty: false` with the plain commit as
    code_version. What git could not say is unknown: `dirty: null` (or true where the status
    said so), code_version `<commit>+unknown`, and env.json says why. The hooks git was
    running die with it (they outlived it)."""
    repo = tmp_path / "repo"
    commit = committed_repo(repo)
    hook, pids = tmp_path / "hook", tmp_path / "hook.pids"
    hook.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 30\n")
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))
    monkeypatch.setattr(provenance, "GIT_TIMEOUT", 1.0)
    hung = provenance.git_code(repo)
    for pid in map(int, pids.read_text().split()):  # git's hung hooks died with it
        assert_gone(pid, "a hook of a git that timed out outlived it")
    assert hung is not None and hung.dirty is None and hung.patch == b""
    assert hung.unknown == "git status took longer than 1 s"
    assert hung.version == commit[:12] + "+unknown"
    run = provenance.RunRecord("h", hung, None, "no probe")
    record = provenance.trial_record(run, 0, [], "cmd", "/")
    assert record["code"]["dirty"] is None and record["code"]["patch"] is None
    assert record["code"]["unknown"] == ("git status took longer than 1 s: what differs from "
                                         "the commit is unknown")
    assert record[names.CODE_VERSION] == commit[:12] + "+unknown"
    assert provenance.differences({names.CODE_VERSION: hung.version},
                                  {names.CODE_VERSION: hung.version}) == (
        f"the code cannot be compared (it ran {hung.version}, now {hung.version}: git could "
        "not say what differed from the commit)")

    def slow_diff(argv, **kw):  # the status answers, the diff of a huge binary does not
        if "diff" in argv:
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        return subprocess.run(argv, **kw)

    git(repo, "config", "--unset", "core.fsmonitor")
    (repo / "train.py").write_text("print(2)\n")
    big = provenance.git_code(repo, run=slow_diff)
    assert big is not None and big.dirty is True and big.digest == ""
    assert big.version == commit[:12] + "+unknown"
    assert big.unknown == "git diff took longer than 1 s"

    def failing(argv, **kw):
        if "status" in argv:
            return subprocess.CompletedProcess(argv, 128, b"", b"fatal: index file corrupt\n")
        return subprocess.run(argv, **kw)

    broken = provenance.git_code(repo, run=failing)
    assert broken is not None and broken.dirty is None
    assert broken.unknown == "git status failed (exit 128: fatal: index file corrupt)"


def test_an_edit_inside_a_submodule_changes_the_code_version(tmp_path):
    """Issue 32: `git diff HEAD` shows a modified submodule as `<commit>-dirty` whatever the
    edit, so two different edits had one code_version."""
    sub = tmp_path / "sub"
    committed_repo(sub)
    top = tmp_path / "top"
    committed_repo(top)
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "lib")
    git(top, "commit", "-qm", "with lib")
    (top / "lib" / "train.py").write_text("print('a')\n")
    a = provenance.git_code(top)
    (top / "lib" / "train.py").write_text("print('b')\n")
    b = provenance.git_code(top)
    assert a is not None and b is not None and a.dirty and b.dirty
    assert a.version != b.version and b"print('b')" in b.patch


def test_an_interpreter_that_prints_without_end_or_leaves_a_daemon_is_bounded(tmp_path):
    """Issue 32: the probe's output was read without a bound (300 MB of it: 1.27 GB RSS), and
    a daemon it started outlived the run (and, holding its stdout, made it wait for the
    timeout). The probe keeps the last MAX_OUTPUT bytes of each stream, and kills its process
    group once it has answered."""
    pid_file = tmp_path / "daemon.pid"
    noisy = tmp_path / "python"
    noisy.write_text("#!/bin/bash\n"
                     f"sleep 300 &\necho $! > {pid_file}\n"  # holds the probe's stdout
                     "head -c 200000000 /dev/zero | tr '\\0' x\necho\n"
                     f"exec {sys.executable} \"$@\"\n")
    noisy.chmod(0o755)
    measured = subprocess.run(
        [sys.executable, "-c",
         "import re, sys, time; from sweep.spec import interpreter\n"
         "t = time.monotonic(); found = interpreter.probe(sys.argv[1])\n"
         "peak = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]\n"
         "print(found.version, time.monotonic() - t, int(peak) // 1024)", str(noisy)],
        capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    version, seconds, rss_mb = measured.stdout.split()
    assert version == sys.version.split()[0]
    assert int(rss_mb) < 100, measured.stdout  # 200 MB of output, 4 MiB of it kept (the
    # peak of this process's own memory: ru_maxrss would count the forking pytest's)
    assert float(seconds) < interpreter.PROBE_TIMEOUT / 2  # the daemon's pipe not waited for
    assert_gone(int(pid_file.read_text()), "the probe's daemon outlived it")
