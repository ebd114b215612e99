"""`trainer.container`: the study file's checks, the engine's command (exact argv lists), the
image's pinning and the lineage's image, the reclaim of leftover containers; and, marked slow,
real sweeps in a real podman container (`container_image` builds the image once, from local
parts)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sweep._core.errors import ConfigError
from sweep.spec import container as containerspec
from sweep.spec.container import ContainerSection
from sweep.trial import container, engine, lineage
from sweep.trial.folders import TrialPaths
from sweep.trial.launch_plan import LaunchPlan

OUT = Path("/s/out")
IMAGE = container.Image("reg/train:1.2", "sha256:" + "a" * 64, "sha256:" + "b" * 64)


def plan(env: dict[str, str] | None = None) -> LaunchPlan:
    paths = TrialPaths.of(OUT, 3)
    return LaunchPlan(["python3", "/s/train.py", "--x", "0.5"],
                      env if env is not None else {"CUDA_VISIBLE_DEVICES": "GPU-1",
                                                   "SWEEP_TRIAL_DIR": str(paths.dir)},
                      paths, paths.result, trainer="/s/train.py")


def section(**kw: Any) -> ContainerSection:
    return ContainerSection.model_validate({"image": "reg/train:1.2", **kw})


def wrapped(devices: list[str] | None, **kw: Any) -> list[str]:
    c = section(**kw)
    return container.wrap(plan(), c, IMAGE, "sweep-st-3", Path("/s"), OUT / "checkpoints/3",
                          Path("/s"), OUT, devices).argv


COMMON = ["--rm", "--name", "sweep-st-3", "--init",
          "--label", "sweep.output_dir=/s/out", "--label", "sweep.trial_dir=/s/out/trials/3",
          "-v", "/s:/s", "-v", "/s/out/trials/3:/s/out/trials/3",
          "-v", "/s/out/checkpoints/3:/s/out/checkpoints/3", "-w", "/s"]
ENV = ["--env", "CUDA_VISIBLE_DEVICES=GPU-1", "--env", "SWEEP_TRIAL_DIR=/s/out/trials/3"]
ARGV = ["sha256:" + "a" * 64, "python3", "/s/train.py", "--x", "0.5"]


def test_podman_passes_each_device_by_cdi_and_runs_the_pinned_id() -> None:
    assert wrapped(["GPU-1", "GPU-2"], engine="podman", shm_size="8g") == [
        "podman", "run", *COMMON, "--shm-size", "8g", *ENV,
        "--device", "nvidia.com/gpu=GPU-1", "--device", "nvidia.com/gpu=GPU-2", *ARGV]


def test_a_simulated_pool_gets_the_same_command_without_a_device_option() -> None:
    assert wrapped(None, engine="podman") == ["podman", "run", *COMMON, *ENV, *ARGV]


def test_docker_passes_the_devices_with_gpus_and_run_args_go_before_the_image() -> None:
    assert wrapped(["GPU-1"], engine="docker", run_args=["--ipc", "host"]) == [
        "docker", "run", *COMMON, *ENV, "--gpus", "device=GPU-1", "--ipc", "host", *ARGV]
    assert wrapped(["GPU-1", "GPU-2"], engine="docker")[-7:-5] == [
        "--gpus", '"device=GPU-1,GPU-2"']


def test_apptainer_binds_the_folders_and_passes_the_env_through_its_own_variables() -> None:
    c = section(engine="apptainer", image="train.sif")
    out = container.wrap(plan(), c, container.Image("/s/train.sif", "sha256:" + "c" * 64),
                         "sweep-st-3", Path("/s"), OUT / "checkpoints/3", Path("/s/work"),
                         OUT, ["GPU-1"])
    assert out.argv == [
        "apptainer", "exec", "--cleanenv", "--bind",
        "/s:/s,/s/out/trials/3:/s/out/trials/3,/s/out/checkpoints/3:/s/out/checkpoints/3",
        "--pwd", "/s/work", "--nv", "/s/train.sif", "python3", "/s/train.py", "--x", "0.5"]
    assert out.env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert out.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"


def test_a_secret_looking_variable_is_passed_by_name_and_its_value_only_in_the_env() -> None:
    env = {"HF_TOKEN": "hf_abc", "LR_DECAY": "0.5", "SWEEP_TRIAL_DIR": "/s/out/trials/3"}
    out = container.wrap(plan(env), section(), IMAGE, "n", Path("/s"), OUT / "checkpoints/3",
                         Path("/s"), OUT, None)
    assert out.argv[out.argv.index("HF_TOKEN") - 1:][:2] == ["--env", "HF_TOKEN"]
    assert not any("hf_abc" in a for a in out.argv)
    assert out.env["HF_TOKEN"] == "hf_abc"  # the engine's environment carries the value
    assert "LR_DECAY=0.5" in out.argv
    assert out.trainer is None  # the trainer runs under the engine's monitor, not the command


def test_files_outside_the_mounted_folders_and_the_study_mounts_are_added() -> None:
    files = container.outside([Path("/venv/sweep/accelerate_config.yaml"),
                               Path("/s/train.py")], [Path("/s")])
    assert files == [Path("/venv/sweep/accelerate_config.yaml")]
    mounts = [containerspec.parse_mount("data:/data:ro", Path("/s"))]
    argv = container.wrap(plan(), section(), IMAGE, "n", Path("/s"), OUT / "checkpoints/3",
                          Path("/s"), OUT, None, files, mounts).argv
    assert argv[argv.index("-w") - 4:argv.index("-w")] == [
        "-v", "/venv/sweep/accelerate_config.yaml:/venv/sweep/accelerate_config.yaml:ro",
        "-v", "/s/data:/data:ro"]


def test_the_workdir_is_the_trials_or_the_drivers_inside_the_study_or_the_study() -> None:
    study = Path("/s")
    assert container.workdir_for(Path("/w"), Path("/s/x"), study) == Path("/w")
    assert container.workdir_for(None, Path("/s/x"), study) == Path("/s/x")
    assert container.workdir_for(None, Path("/home/u"), study) == Path("/s")


def test_names_and_tags() -> None:
    assert container.container_name("my.study", 12) == "sweep-my.study-12"
    assert container.trial_of("sweep-my.study-12", "my.study") == 12
    assert container.trial_of("sweep-my.study-x", "my.study") is None
    assert container.trial_of("sweep-other-1", "my.study") is None
    assert [containerspec.floats(i, "podman") for i in (
        "x:latest", "x", "reg:5000/x", "reg:5000/x:2", "x@sha256:ab")] == [
        True, True, True, False, False]
    assert not containerspec.floats("images/x.sif", "apptainer")


# -- the study file's checks (the engine faked) -------------------------------------------

def resolve(c: ContainerSection, tmp_path: Path, launcher: str = "python",
            run: Any = None, which: Any = None) -> ContainerSection:
    def answers(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "sha256:x\n", "")

    return containerspec.resolve("s.yaml", tmp_path, (tmp_path, tmp_path / "out"), c,
                                 launcher, True, run or answers,
                                 which or (lambda n: f"/usr/bin/{n}"))


def problems(error: ConfigError) -> list[str]:
    return [str(p) for p in error.problems]


def test_the_first_engine_on_path_is_taken_and_a_missing_one_is_one_line(
        tmp_path: Path) -> None:
    found = resolve(section(), tmp_path, which=lambda n: "/bin/docker" if n == "docker" else None)
    assert found.engine == "docker"
    with pytest.raises(ConfigError) as e:
        resolve(section(), tmp_path, which=lambda n: None)
    assert problems(e.value) == [
        "s.yaml: trainer.container.engine: no container engine on PATH (looked for podman, "
        "docker, apptainer): install podman (apt-get install podman runc), or remove "
        "trainer.container"]
    with pytest.raises(ConfigError) as e:
        resolve(section(engine="apptainer", image="x.sif"), tmp_path, which=lambda n: None)
    assert problems(e.value)[0].startswith(
        "s.yaml: trainer.container.engine: engine apptainer is not on PATH")


def test_an_image_the_engine_does_not_have_and_an_engine_that_cannot_answer(
        tmp_path: Path) -> None:
    def missing(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 125, "", "Error: reg/train:1.2: image not known")

    with pytest.raises(ConfigError) as e:
        resolve(section(), tmp_path, run=missing)
    assert problems(e.value) == [
        "s.yaml: trainer.container.image: no image reg/train:1.2 in podman's store: build or "
        "pull it first (podman pull reg/train:1.2); sweep pulls nothing"]

    def no_daemon(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "Cannot connect to the Docker daemon "
                                           "at unix:///var/run/docker.sock")

    with pytest.raises(ConfigError) as e:
        resolve(section(engine="docker"), tmp_path, run=no_daemon)
    assert problems(e.value) == [
        "s.yaml: trainer.container.image: docker cannot be asked about images here: Cannot "
        "connect to the Docker daemon at unix:///var/run/docker.sock"]


def test_mounts_outside_the_study_options_sweep_sets_and_the_warm_launcher(
        tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    ok = resolve(section(mounts=["data:/data:ro", "out"]), tmp_path)
    assert [m.option() for m in containerspec.mounts(ok, tmp_path)] == [
        f"{tmp_path}/data:/data:ro", f"{tmp_path}/out:{tmp_path}/out"]
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(ConfigError) as e:
        resolve(section(mounts=["/etc:/etc", "link", "data:rel", "data:/d:rx", "gone"],
                        run_args=["--name=x", "--ipc=host"]), tmp_path, launcher="warm")
    assert problems(e.value) == [
        "s.yaml: trainer.container: launcher: warm starts trials from the driver's own "
        "interpreter, which is not in the image: use launcher: accelerate or python with "
        "trainer.container",
        "s.yaml: trainer.container.run_args.0: --name=x is set by sweep for each trial (--rm, "
        "--name sweep-<study>-<trial>, in the foreground): remove it",
        f"s.yaml: trainer.container.mounts.0: /etc is outside what the study owns (its folder "
        f"{tmp_path}, its output folder): move the data under the study's folder",
        f"s.yaml: trainer.container.mounts.1: {tmp_path}/link is outside what the study owns "
        f"(its folder {tmp_path}, its output folder): move the data under the study's folder",
        "s.yaml: trainer.container.mounts.2: 'data:rel': the path in the container must be "
        "absolute",
        "s.yaml: trainer.container.mounts.3: 'data:/d:rx': the mode is ro or rw, not 'rx'",
        f"s.yaml: trainer.container.mounts.4: no such file or folder: {tmp_path}/gone"]


# -- the image pinned, the lineage's image, the reclaim ---------------------------------

def test_the_image_is_pinned_once_per_process_and_a_moved_tag_is_said(tmp_path: Path) -> None:
    asked: list[list[str]] = []

    def inspect(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "1234abcd\tsha256:feed\n", "")

    c = section(engine="podman", image="reg/pin-test:1")
    first = engine.pin(c, tmp_path, inspect)
    assert engine.pin(c, tmp_path, inspect) is first
    assert asked == [["podman", "image", "inspect", "--format", "{{.Id}}\t{{.Digest}}",
                      "reg/pin-test:1"]]
    assert first == container.Image("reg/pin-test:1", "sha256:1234abcd", "sha256:feed")
    out = tmp_path / "out"
    out.mkdir()
    assert engine.moved_since(out, first) is None  # no run before
    assert engine.moved_since(out, first) is None  # the same image
    moved = container.Image("reg/pin-test:1", "sha256:9999")
    assert engine.moved_since(out, moved) == "sha256:1234abcd"
    assert engine.moved_since(out, moved) is None


def test_a_lineage_carries_on_only_in_the_image_it_started_in(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "4"
    folder.mkdir(parents=True)
    first = lineage.Start(folder)
    assert lineage.started_in(first) is None
    lineage.record_image(first, "sha256:aaa")
    assert (tmp_path / "checkpoints" / ".4.image").read_text() == "sha256:aaa\n"
    resumes = lineage.Start(folder, resume=True)
    assert lineage.image_refusal(resumes, "sha256:aaa", "sha256:aaa", False) is None
    assert lineage.image_refusal(resumes, "sha256:aaa", "sha256:bbb", True) is None
    assert lineage.image_refusal(first, "sha256:aaa", "sha256:bbb", False) is None  # empty
    assert lineage.image_refusal(resumes, "sha256:aaa", "sha256:bbb", False) == (
        f"its lineage (checkpoints in {folder}) started in the image sha256:aaa, and this "
        "run's image is sha256:bbb: it carries on only in the image it started in (rebuild "
        "or retag that image, or set trainer.container.continue_in_other_image: true)")


def test_the_reclaim_removes_the_studys_containers_whose_trial_no_longer_runs() -> None:
    asked: list[list[str]] = []

    def engine_run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        out = ("sweep-st-1\trunning\nsweep-st-2\texited\nsweep-st-x\texited\n"
               "sweep-other-3\texited\n") if argv[1] == "ps" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    running = {OUT / "trials" / "1"}
    removed = engine.reclaim(section(engine="podman"), "st", OUT, lambda d: d in running,
                             engine_run)
    assert removed == ["sweep-st-2"]
    assert asked == [
        ["podman", "ps", "--all", "--filter", "label=sweep.output_dir=/s/out", "--format",
         "{{.Names}}\t{{.State}}"],
        ["podman", "rm", "--force", "--time", "0", "sweep-st-2"]]
