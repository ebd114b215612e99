"""Through the real `accelerate launch` (several seconds each): the handful that prove the seam."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT, TRAINERS, processes_mentioning, run_cli, spawn_cli, wait_until

from sweep._core import names
from sweep.spec import interpreter

pytestmark = pytest.mark.slow

MULTI_GPU_DEFAULT = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_processes: 4
num_machines: 1
gpu_ids: all
mixed_precision: fp16
"""


@pytest.fixture
def repo_copy(tmp_path):
    """studies/ and trainers/ copied, and a user whose accelerate default is MULTI_GPU."""
    for folder in ("studies", "trainers"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    hf_home = tmp_path / "hf"
    (hf_home / "accelerate").mkdir(parents=True)
    (hf_home / "accelerate" / "default_config.yaml").write_text(MULTI_GPU_DEFAULT)
    return tmp_path, {"SWEEP_FAKE_GPUS": "2", "HF_HOME": str(hf_home)}


def test_quickstart_finishes_resumes_without_new_trials_and_is_an_optuna_study(
        repo_copy, monkeypatch, capsys):
    root, env = repo_copy
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    study = root / "studies" / "quickstart.yaml"
    data = yaml.safe_load(study.read_text())
    # the README's full quickstart runs 8 trials of 3 epochs; the same path in less time: the
    # enqueued baseline and one the sampler chose
    data["study"]["n_trials"] = 2
    data["trainer"]["args"] = ["--epochs", "1"]
    study.write_text(yaml.safe_dump(data, sort_keys=False))

    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    db = root / "studies" / "quickstart.db"
    storage = f"sqlite:///{db}"
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    assert trials[0].params == {"lr": 0.01, "layers": 2, "act": "relu"}  # the enqueued baseline
    for t in trials:
        assert 0 < t.value < 5 and 0 <= t.user_attrs["metric_val_acc"] <= 1
        out_log = root / "studies" / "quickstart" / "trials" / str(t.number) / "stdout.log"
        assert "epoch 0: val_loss=" in out_log.read_text()
    assert (root / "studies" / "quickstart" / "trials" / "0" / "tb").is_dir()

    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    assert len(optuna.load_study(study_name="quickstart", storage=storage).trials) == 2

    cli = subprocess.run(
        [str(Path(sys.executable).parent / "optuna"), "trials", "--storage", storage,
         "--study-name", "quickstart", "-f", "json"],
        capture_output=True, text=True, check=True,
    )
    rows = json.loads(cli.stdout)
    assert [r["state"] for r in rows] == ["COMPLETE"] * 2


def test_accelerate_pins_the_device_and_the_trainers_failure_is_reported(
        write_study, tmp_path, monkeypatch, capsys):
    hf_home = tmp_path / "hf"
    (hf_home / "accelerate").mkdir(parents=True)
    (hf_home / "accelerate" / "default_config.yaml").write_text(MULTI_GPU_DEFAULT)
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    marker = tmp_path / "failed-once"
    study = write_study(
        study={"n_trials": 1},
        trainer={"launcher": "accelerate", "args": ["--sleep", "0", "--fail_first", str(marker)],
                 "accelerate": {"mixed_precision": "bf16"}},
        gpus={"ids": [1]},
    )
    assert run_cli("run", str(study)) == 0, capsys.readouterr().err
    first, second = optuna.load_study(
        study_name="probe", storage=f"sqlite:///{tmp_path / 'probe.db'}").trials
    # accelerate turns the trainer's exit 3 into its own exit 1 plus a traceback: both undone
    assert first.user_attrs[names.FAIL_REASON] == "exit code 3: ValueError: boom"
    assert first.user_attrs[names.EXIT_CODE] == 3
    assert second.state.name == "COMPLETE"
    record = json.loads((tmp_path / "probe" / "trials" / "1" / "probe.json").read_text())
    assert record["cvd"] == "1"


def test_sigint_through_accelerate_leaves_no_orphan_trainer(write_study, tmp_path):
    study = write_study(study={"n_trials": 2},
                        trainer={"launcher": "accelerate", "args": ["--sleep", "60"]})
    run = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    trials = tmp_path / "probe" / "trials"
    assert wait_until(lambda: len(list(trials.glob("*/probe_start.json"))) == 2, 120)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert processes_mentioning(str(tmp_path)) == []
    trials = optuna.load_study(study_name="probe",
                               storage=f"sqlite:///{tmp_path / 'probe.db'}").trials
    told = [t for t in trials if t.state.name != "WAITING"]
    assert {t.user_attrs[names.FAIL_REASON] for t in told} == {"interrupted"}
    # each interrupted trial's continuation is queued for the next run
    assert sorted(t.user_attrs[names.CONTINUES] for t in trials if t.state.name == "WAITING") == [
        t.number for t in told]




def test_every_launcher_gives_a_trainer_the_state_accelerate_launch_gives(
        write_study, tmp_path, monkeypatch, capsys):
    """The same study through `accelerate launch` in a new interpreter (the default),
    `launcher: direct` and `launcher: warm`: the trainer's Accelerator sees the same device,
    mixed precision, processes, threads and ACCELERATE_* variables, for a setting of
    `trainer.accelerate` and a searched one. The default's tree is guard -> `accelerate
    launch` -> the script, new interpreters all (no fork server anywhere in it).
    Issue 25: all three launch with the study's own accelerate config file (a team's
    MULTI_GPU file with debug mode and fp16: a one-device trial runs without MULTI_GPU, in
    debug mode, its searched mixed precision over the file's).
    A param `where: accelerate` reaches accelerate and not the script (not in its argv).
    Issue 26 item 12 (the same runs, and `launcher: python`): a trainer whose `setsid` child
    writes the result after the trainer exited was COMPLETE under one launcher and FAIL under
    the others: `accelerate launch` exits a second or so after its script, and a result
    written in between counted. What counts is what the trainer wrote before it ended (its
    guard says when; under accelerate, when the script ended): the late result never counts,
    and the same reason is given, under every launcher. A result the trainer itself writes
    before it exits counts under every launcher alike."""
    trainer = TRAINERS / "state_probe.py"
    (tmp_path / "team.yaml").write_text(MULTI_GPU_DEFAULT + "debug: true\n")
    seen: dict[str, list[dict]] = {}
    parents: dict[str, list[list[list[str]]]] = {}
    verdicts = {}
    runs = {}
    searched = {"mixed_precision": {"type": "categorical", "choices": ["no", "bf16"],
                                    "where": "accelerate"}}
    # the drivers below are forks of this process, each to check the team's config file with
    # accelerate's own keys: asked here once (a few CPU-s), the answer is theirs, as
    # `probed_interpreter` does for what every run asks
    interpreter.probe(interpreter.driver_python(), keys=True)
    for launcher in ("accelerate", "direct", "warm", "python"):  # at once, a device each
        accelerate = launcher != "python"  # which runs no accelerate: no accelerate keys
        enqueue = [{"now": False, "mixed_precision": "no"},
                   {"now": True, "mixed_precision": "bf16"}]
        study = write_study(
            study={"name": launcher, "n_trials": 1, "max_consecutive_failures": 3,
                   "enqueue": enqueue if accelerate else [{"now": q["now"]} for q in enqueue]},
            trainer={"script": str(trainer), "launcher": launcher, "grace_period": 5.0,
                     **({"accelerate": {"dynamo_backend": "no", "config_file": "team.yaml"}}
                        if accelerate else {})},
            params={"now": {"type": "bool"}, **(searched if accelerate else {})},
            name=f"{launcher}.yaml")
        if accelerate:
            runs[launcher] = spawn_cli("run", str(study), env={
                "SWEEP_FAKE_GPUS": "1", "SWEEP_LOCK_DIR": str(tmp_path / f"locks-{launcher}")})
    # meanwhile `launcher: python` in this process (no interpreter of its own to start)
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    monkeypatch.setenv("SWEEP_LOCK_DIR", str(tmp_path / "locks-python"))
    assert run_cli("run", str(tmp_path / "python.yaml")) == 0, capsys.readouterr().err
    for launcher in ("accelerate", "direct", "warm", "python"):
        if launcher in runs:
            _, err = runs[launcher].communicate(timeout=240)
            assert runs[launcher].returncode == 0, err  # the second trial spends the budget of 1
        trials = sorted((tmp_path / launcher / "trials").glob("[0-9]*"), key=lambda p: int(p.name))
        if launcher != "python":  # which the trainer sees without accelerate's variables
            seen[launcher] = [json.loads((t / "state.json").read_text()) for t in trials]
            parents[launcher] = [json.loads((t / "ancestors.json").read_text()) for t in trials]
        stored = optuna.load_study(study_name=launcher,
                                   storage=f"sqlite:///{tmp_path / (launcher + '.db')}").trials
        verdicts[launcher] = [(t.state.name, t.value, t.user_attrs.get(names.FAIL_REASON, "")
                               .split(":")[0]) for t in stored]
    assert verdicts["accelerate"] == [("FAIL", None, "no result"), ("COMPLETE", 2.0, "")]
    for launcher in ("direct", "warm", "python"):
        assert verdicts[launcher] == verdicts["accelerate"], launcher
    for chain in parents["accelerate"]:
        assert chain[0][1:3] == ["-m", "accelerate.commands.launch"]
        assert chain[1][1:3] == ["-I", "-S"] and chain[1][3].endswith("guard.py")
        assert not any("sweep.launch.warm_server" in word
                       for ancestor in chain for word in ancestor)
    for chain in parents["direct"]:
        assert chain[0][3].endswith("guard.py")
    for chain in parents["warm"]:  # the guard, a fork of the server
        assert chain[0][1:3] == ["-m", "sweep.launch.warm_server"]
    new = "accelerate"
    assert seen["direct"] == seen[new]
    assert seen["warm"] == seen[new]
    assert [s["mixed_precision"] for s in seen["direct"]] == ["no", "bf16"]
    assert [s["argv"] for s in seen["direct"]] == [["--now", "false"], ["--now", "true"]]
    assert all(s["env"]["ACCELERATE_MIXED_PRECISION"] == s["mixed_precision"]
               for s in seen["direct"])
    assert all(s["env"]["ACCELERATE_DYNAMO_BACKEND"] == "NO" for s in seen["direct"])
    assert all(s["env"]["ACCELERATE_DEBUG_MODE"] == "true" and "MASTER_PORT" not in s["env"]
               and s["num_processes"] == 1 for s in seen["direct"])
    command = (tmp_path / "direct" / "trials" / "0" / "command.sh").read_text()
    assert "accelerate.commands.launch" not in command  # one interpreter, not two


def test_what_a_dry_run_prints_runs_when_pasted(write_study, tmp_path, capsys, monkeypatch):
    """Issue 21 part 5: a dry run named an accelerate config it never wrote. Each printed
    line runs the trial as the run would: `accelerate launch` with sweep's config (which
    exists wherever sweep is installed), pinned despite a user's MULTI_GPU default."""
    hf_home = tmp_path / "hf"
    (hf_home / "accelerate").mkdir(parents=True)
    (hf_home / "accelerate" / "default_config.yaml").write_text(MULTI_GPU_DEFAULT)
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    study = write_study(study={"n_trials": 2}, trainer={"launcher": "accelerate"})
    assert run_cli("run", str(study), "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "study.yaml"]  # wrote nothing
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == 2 and all("accelerate.commands.launch" in c for c in commands)
    done = subprocess.run(["sh", "-c", commands[1]], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    trial = tmp_path / "probe" / "trials" / "1"
    x = json.loads((trial / "params.json").read_text())["x"]
    assert f"--x {x!r}" in commands[1]
    assert json.loads((trial / "result.json").read_text())["score"] == pytest.approx(
        (x - 0.3) ** 2)
