"""`trainer.container`: the study file's checks, the engine's command (exact argv lists), the
image's pinning and the lineage's image, the reclaim of leftover containers; and, marked slow,
real sweeps in a real podman container (`container_image` builds the image once, from local
parts)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import TRAINERS

from sweep._core import names
from sweep._core.errors import ConfigError
from sweep.launch import _container, _engine
from sweep.spec import _container_checks
from sweep.spec import container as containerspec
from sweep.spec.container import ContainerSection
from sweep.testing import container_image as test_image
from sweep.trial import lineage
from sweep.trial.folders import TrialPaths
from sweep.trial.launch_plan import LaunchPlan

# podman's image store and container names are the machine's: one worker runs these in turn
pytestmark = pytest.mark.xdist_group("podman")

OUT = Path("/s/out")
IMAGE = _container.Image("reg/train:1.2", "sha256:" + "a" * 64, "sha256:" + "b" * 64)


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
    return _container.wrap(plan(), c, IMAGE, "sweep-st-3", Path("/s"), OUT / "checkpoints/3",
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
    out = _container.wrap(plan(), c, _container.Image("/s/train.sif", "sha256:" + "c" * 64),
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
    out = _container.wrap(plan(env), section(), IMAGE, "n", Path("/s"), OUT / "checkpoints/3",
                         Path("/s"), OUT, None)
    assert out.argv[out.argv.index("HF_TOKEN") - 1:][:2] == ["--env", "HF_TOKEN"]
    assert not any("hf_abc" in a for a in out.argv)
    assert out.env["HF_TOKEN"] == "hf_abc"  # the engine's environment carries the value
    assert "LR_DECAY=0.5" in out.argv
    assert out.trainer is None  # the trainer runs under the engine's monitor, not the command


def test_files_outside_the_mounted_folders_and_the_study_mounts_are_added() -> None:
    files = _container.outside([Path("/venv/sweep/accelerate_config.yaml"),
                               Path("/s/train.py")], [Path("/s")])
    assert files == [Path("/venv/sweep/accelerate_config.yaml")]
    mounts = [containerspec.parse_mount("data:/data:ro", Path("/s"))]
    argv = _container.wrap(plan(), section(), IMAGE, "n", Path("/s"), OUT / "checkpoints/3",
                          Path("/s"), OUT, None, files, mounts).argv
    assert argv[argv.index("-w") - 4:argv.index("-w")] == [
        "-v", "/venv/sweep/accelerate_config.yaml:/venv/sweep/accelerate_config.yaml:ro",
        "-v", "/s/data:/data:ro"]


def test_the_workdir_is_the_trials_or_the_drivers_inside_the_study_or_the_study() -> None:
    study = Path("/s")
    assert _container.workdir_for(Path("/w"), Path("/s/x"), study) == Path("/w")
    assert _container.workdir_for(None, Path("/s/x"), study) == Path("/s/x")
    assert _container.workdir_for(None, Path("/home/u"), study) == Path("/s")


def test_names_and_tags() -> None:
    assert _container.container_name("my.study", 12) == "sweep-my.study-12"
    assert _container.trial_of("sweep-my.study-12", "my.study") == 12
    assert _container.trial_of("sweep-my.study-x", "my.study") is None
    assert _container.trial_of("sweep-other-1", "my.study") is None
    assert [containerspec.floats(i, "podman") for i in (
        "x:latest", "x", "reg:5000/x", "reg:5000/x:2", "x@sha256:ab")] == [
        True, True, True, False, False]
    assert not containerspec.floats("images/x.sif", "apptainer")


# -- the study file's checks (the engine faked) -------------------------------------------

def resolve(c: ContainerSection, tmp_path: Path | _container_checks.Mounted,
            launcher: str = "python", run: Any = None, which: Any = None, memory: Any = None,
            runnable: bool = True) -> ContainerSection:
    def answers(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "sha256:x\n", "")

    mounted = tmp_path if isinstance(tmp_path, _container_checks.Mounted) else \
        _container_checks.Mounted(tmp_path, tmp_path / "out")
    return _container_checks.resolve("s.yaml", mounted, c, launcher, runnable, run or answers,
                                 which or (lambda n: f"/usr/bin/{n}"), memory or (lambda: 8 << 30))


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
        "s.yaml: trainer.container: launcher: warm forks trials from a server in the driver's "
        "own interpreter, which is not in the image: use launcher: accelerate, direct or "
        "python with trainer.container",
        "s.yaml: trainer.container.run_args.0: --name=x: sweep sets --name for each trial "
        "(each trial's container is named sweep-<study>-<trial>): remove it",
        f"s.yaml: trainer.container.mounts.0: /etc is outside what the study owns (its folder "
        f"{tmp_path}, its output folder): move the data under the study's folder",
        f"s.yaml: trainer.container.mounts.1: {tmp_path}/link is outside what the study owns "
        f"(its folder {tmp_path}, its output folder): move the data under the study's folder",
        "s.yaml: trainer.container.mounts.2: 'data:rel': the path in the container must be "
        "absolute",
        "s.yaml: trainer.container.mounts.3: 'data:/d:rx': the mode is ro or rw, not 'rx'",
        f"s.yaml: trainer.container.mounts.4: no such file or folder: {tmp_path}/gone"]


def test_run_args_that_set_what_sweep_sets_are_refused_flag_by_flag(tmp_path: Path) -> None:
    """Combined short flags are read as the engine reads them (`-itd` is -i -t -d), and a
    value is never taken for a flag (`-e -d` sets a variable named -d)."""
    with pytest.raises(ConfigError) as e:
        resolve(section(run_args=["-itd", "--ipc", "host", "-e", "-d", "--tty", "--rm=false",
                                  "-w/x", "--gpus", "all", "--device", "nvidia.com/gpu=all",
                                  "--device", "/dev/fuse", "--restart", "always", "-i"]),
                tmp_path)
    assert problems(e.value) == [
        "s.yaml: trainer.container.run_args.0: -itd: sweep sets -i (--interactive), -t (--tty) "
        "and -d (--detach) for each trial (a trial reads no input; a trial has no terminal, its "
        "output and errors read apart; a trial's container runs in the foreground, its exit "
        "the trial's): remove it",
        "s.yaml: trainer.container.run_args.5: --tty: sweep sets --tty for each trial (a trial "
        "has no terminal, its output and errors read apart): remove it",
        "s.yaml: trainer.container.run_args.6: --rm=false: sweep sets --rm for each trial (each "
        "trial's container is removed when it ends): remove it",
        "s.yaml: trainer.container.run_args.7: -w/x: sweep sets -w (--workdir) for each trial "
        "(the working folder is trainer.workdir's to set): remove it",
        "s.yaml: trainer.container.run_args.8: --gpus all: sweep sets --gpus for each trial "
        "(each trial gets the devices it leased): remove it",
        "s.yaml: trainer.container.run_args.10: --device nvidia.com/gpu=all: sweep sets "
        "--device for each trial (each trial gets the devices it leased): remove it",
        "s.yaml: trainer.container.run_args.14: --restart always: sweep sets --restart for each "
        "trial (a trial runs again only as trainer.max_retries says): remove it",
        "s.yaml: trainer.container.run_args.16: -i: sweep sets -i (--interactive) for each "
        "trial (a trial reads no input): remove it"]
    (tmp_path / "t.sif").write_text("")
    with pytest.raises(ConfigError) as e:
        resolve(section(engine="apptainer", image="t.sif", run_args=["-w", "--pwd=/x"]),
                tmp_path)
    assert problems(e.value) == [  # apptainer's -w is --writable: the study's to give
        "s.yaml: trainer.container.run_args.1: --pwd=/x: sweep sets --pwd for each trial (the "
        "working folder is trainer.workdir's to set): remove it"]


def test_mounts_over_what_sweep_mounts_from_the_host_are_refused(tmp_path: Path) -> None:
    """Over the study's folder, in the output folder, above the script or the working folder
    (and below the mount that shows them); not above sweep's mounts (the engine mounts the
    deeper ones over it), elsewhere, or a host folder at its own path."""
    script, work = tmp_path / "code" / "train.py", tmp_path / "work"
    mounted = _container_checks.Mounted(tmp_path, tmp_path / "out",
                                    (("trainer.script", "the script", script),), work)
    (tmp_path / "data").mkdir()
    run_args = ["-v", f"/data:{tmp_path}", f"--volume=/d:{tmp_path}/out/trials",
                "--mount", f"type=bind,src=/d,dst={tmp_path}/code", f"--tmpfs={work}:size=1g",
                "-v", f"{tmp_path}/data:{tmp_path}/data", "-v", "/data:/data", "-v", "/x:/",
                f"-vcache:{tmp_path}/out", "--mount", "type=tmpfs,target=/scratch",
                "-v", f"{tmp_path}/out/x"]
    with pytest.raises(ConfigError) as e:
        resolve(section(run_args=run_args, mounts=["data", f"data:{tmp_path}/code/train.py"]),
                mounted)
    over = "which sweep mounts from the host for each trial"
    assert problems(e.value) == [
        f"s.yaml: trainer.container.run_args.0: -v /data:{tmp_path} mounts over the study's "
        f"folder {tmp_path}, {over}: mount it at another path",
        f"s.yaml: trainer.container.run_args.2: --volume=/d:{tmp_path}/out/trials mounts over "
        f"the study's output folder {tmp_path}/out (each trial's folder and checkpoints), "
        f"{over}: mount it at another path",
        f"s.yaml: trainer.container.run_args.3: --mount type=bind,src=/d,dst={tmp_path}/code "
        f"mounts over the script {script}, {over}: mount it at another path",
        f"s.yaml: trainer.container.run_args.5: --tmpfs={work}:size=1g mounts over the working "
        f"folder {work}, {over}: mount it at another path",
        f"s.yaml: trainer.container.run_args.12: -vcache:{tmp_path}/out mounts over the study's "
        f"output folder {tmp_path}/out (each trial's folder and checkpoints), {over}: mount it "
        "at another path",
        f"s.yaml: trainer.container.run_args.15: -v {tmp_path}/out/x mounts over the study's "
        f"output folder {tmp_path}/out (each trial's folder and checkpoints), {over}: mount it "
        "at another path",
        f"s.yaml: trainer.container.mounts.1: data:{tmp_path}/code/train.py mounts over the "
        f"script {script}, {over}: give another TARGET"]


@pytest.mark.parametrize("folder", ["a:b", "a,b"])
def test_a_path_sweep_mounts_with_a_colon_or_a_comma_is_refused(tmp_path: Path,
                                                                 folder: str) -> None:
    """podman's -v splits on ':' (every trial would fail with its volume error), its
    filters on ',' (the reclaim's `--filter label=sweep.output_dir=...`)."""
    char = folder[1]
    odd = tmp_path / folder
    elsewhere = tmp_path / "s"
    for study, out, script in ((odd, odd / "out", odd / "t.py"),
                               (elsewhere, odd, elsewhere / "t.py"),
                               (elsewhere, elsewhere / "out", odd / "t.py")):
        mounted = _container_checks.Mounted(study, out, (("trainer.script", "the script", script),))
        with pytest.raises(ConfigError) as e:
            resolve(section(engine="podman"), mounted)
        what = ("trainer.container: the study's folder" if study == odd else
                "study.output_dir: the study's output folder" if out == odd else
                "trainer.script: the script")
        path = study if study == odd else out if out == odd else script
        assert problems(e.value) == [  # once, for the folder that has it
            f"s.yaml: {what} {path} has a {char!r}, which podman cannot mount (its mount and "
            "filter options split on ':' and ','): use a path without ':' or ','"]


def test_a_comma_in_a_mount_is_refused_only_for_apptainer_and_only_to_run(
        tmp_path: Path) -> None:
    """Item 2 (review): podman's and docker's `-v HOST:TARGET[:OPTIONS]` split only their
    OPTIONS on ',' (their docs), apptainer's `--bind` splits its list of mounts on it; a ','
    was refused as the file was parsed, so `sweep summary`, `status`, `report` of a study that
    ran with one failed."""
    from sweep.spec import config

    (tmp_path / "a,b").mkdir()
    (tmp_path / "t.sif").write_text("")
    for name in ("podman", "docker"):
        ok = resolve(section(engine=name, mounts=["a,b:/data"]), tmp_path)
        assert [m.option() for m in containerspec.mounts(ok, tmp_path)] == [
            f"{tmp_path}/a,b:/data"]
    apptainer = section(engine="apptainer", image="t.sif", mounts=["a,b:/data"])
    with pytest.raises(ConfigError) as e:
        resolve(apptainer, tmp_path)
    assert problems(e.value) == [
        "s.yaml: trainer.container.mounts.0: 'a,b:/data' has a ',', which apptainer's --bind "
        "splits its mounts on: name a path without one"]
    assert resolve(apptainer, tmp_path, runnable=False) == apptainer
    study = tmp_path / "study.yaml"
    study.write_text("study: {name: s, n_trials: 1, metric: m}\ntrainer: {script: t.py, "
                     "container: {image: t.sif, engine: apptainer, mounts: ['a,b:/data']}}\n"
                     "params: {x: {type: float, low: 0, high: 1}}\n")
    assert config.load(study, runnable=False).trainer.container is not None


def test_run_args_that_pick_the_devices_are_refused(tmp_path: Path) -> None:
    """Item 3 (review): a variable that picks the devices (CUDA_VISIBLE_DEVICES,
    NVIDIA_VISIBLE_DEVICES: set, passed from the host, by a pattern, or in an --env-file)
    or a GPU's device file would re-pin each trial's devices; refused as the file loads."""
    (tmp_path / "gpu.env").write_text("# the lab's\nHF_HOME=/h\nCUDA_VISIBLE_DEVICES=0\n")
    (tmp_path / "ok.env").write_text("HF_HOME=/h\n")
    run_args = ["-e", "CUDA_VISIBLE_DEVICES=1", "--env=NVIDIA_VISIBLE_DEVICES=all",
                "--env", "CUDA_VISIBLE_DEVICES", "-eCUDA*", "--device", "/dev/nvidia0",
                "--env-file", "gpu.env", "-e", "X=1", "--env-file=ok.env", "--env-file", "gone"]
    with pytest.raises(ConfigError) as e:
        resolve(section(run_args=run_args), tmp_path)
    why = "for each trial (each trial gets the devices it leased): remove it"
    assert problems(e.value) == [
        f"s.yaml: trainer.container.run_args.0: -e CUDA_VISIBLE_DEVICES=1: sweep sets "
        f"CUDA_VISIBLE_DEVICES {why}",
        f"s.yaml: trainer.container.run_args.2: --env=NVIDIA_VISIBLE_DEVICES=all: sweep sets "
        f"NVIDIA_VISIBLE_DEVICES {why}",
        f"s.yaml: trainer.container.run_args.3: --env CUDA_VISIBLE_DEVICES: sweep sets "
        f"CUDA_VISIBLE_DEVICES {why}",
        f"s.yaml: trainer.container.run_args.5: -eCUDA*: sweep sets CUDA* {why}",
        f"s.yaml: trainer.container.run_args.6: --device /dev/nvidia0: sweep sets --device "
        f"{why}",
        "s.yaml: trainer.container.run_args.8: --env-file gpu.env: the file sets "
        "CUDA_VISIBLE_DEVICES, which sweep sets for each trial (each trial gets the devices "
        "it leased): remove it from the file"]


def test_a_study_that_could_not_run_in_its_container_is_still_read(tmp_path: Path) -> None:
    """`sweep summary`, `status`, `report` load the file not to run it: a study that ran
    before these checks (an output folder with ',' ran its trials) is still read."""
    odd = tmp_path / "a,b"
    mounted = _container_checks.Mounted(odd, odd / "out")
    c = section(engine="podman", run_args=["-itd", "-v", f"/x:{odd}"], shm_size="64p")
    assert resolve(c, mounted, runnable=False) == c
    with pytest.raises(ConfigError) as e:
        resolve(c, mounted)
    assert len(e.value.problems) == 4


def test_shm_size_is_read_as_the_engine_reads_it_and_no_larger_than_the_hosts_memory(
        tmp_path: Path) -> None:
    from sweep.spec import config

    assert [containerspec.size_bytes(s) for s in ("16g", "1.5g", "16GiB", "512 m", "100b",
                                                  "64", "2t", "0")] == [
        16 << 30, 3 << 29, 16 << 30, 512 << 20, 100, 64, 2 << 40, 0]
    for bad in ("1e3", "-1", "1.2.3m", "16x", "16 gb b", ""):
        with pytest.raises(ValueError, match="is not a size podman or docker take"):
            containerspec.size_bytes(bad)
    assert resolve(section(shm_size="8g"), tmp_path, memory=lambda: 8 << 30).shm_size == "8g"
    with pytest.raises(ConfigError) as e:
        resolve(section(shm_size="8.5g"), tmp_path, memory=lambda: 8 << 30)
    assert problems(e.value) == [
        "s.yaml: trainer.container.shm_size: 8.5g is 8.5 GiB, more than this host's memory "
        "(8 GiB), where /dev/shm lives: give at most 8 GiB"]
    study = tmp_path / "study.yaml"
    study.write_text("study: {name: s, n_trials: 1, metric: m}\ntrainer: {script: t.py, "
                     "container: {image: x, shm_size: 1e3}}\n"
                     "params: {x: {type: float, low: 0, high: 1}}\n")
    with pytest.raises(ConfigError) as e:
        config.load(study, runnable=False)
    assert problems(e.value) == [
        f"{study}: trainer.container.shm_size: '1e3' is not a size podman or docker take: give "
        "a number and a unit k, m, g or t, e.g. 16g or 1.5g"]


def test_engine_input_is_read_as_the_engine_reads_it_and_said_on_one_line(
        tmp_path: Path) -> None:
    """Item 8 (review): `-d=true` is -d given true (not -d -= -t -r -u e); a size in other
    digits than 0-9 is no size podman takes; a line break in a path sweep or the study mounts
    is refused, written as \\n, never breaking the one-line error."""
    with pytest.raises(ConfigError) as e:
        resolve(section(run_args=["-d=true", "-i=false"]), tmp_path)
    assert problems(e.value) == [
        "s.yaml: trainer.container.run_args.0: -d=true: sweep sets -d (--detach) for each "
        "trial (a trial's container runs in the foreground, its exit the trial's): remove it",
        "s.yaml: trainer.container.run_args.1: -i=false: sweep sets -i (--interactive) for "
        "each trial (a trial reads no input): remove it"]
    with pytest.raises(ValueError, match="is not a size podman or docker take"):
        containerspec.size_bytes("\u0661\u0666g")  # Arabic-Indic 16
    odd = tmp_path / "a\nb"
    (tmp_path / "da\nta").mkdir()
    with pytest.raises(ConfigError) as e:
        resolve(section(mounts=["da\nta:/data"]), _container_checks.Mounted(odd, odd / "out"))
    assert [line for p in problems(e.value) for line in p.splitlines()] == [
        f"s.yaml: trainer.container: the study's folder {tmp_path}/a\\nb has a '\\n', which "
        "no line of a log or an error can show: use a path without one",
        "s.yaml: trainer.container.mounts.0: 'da\\nta:/data' has a '\\n', which no line of a "
        "log or an error can show: name a path without one"]


def test_podmans_configuration_is_blamed_only_where_its_error_is_about_it() -> None:
    """Item 8 (review): exit 125 is also an image podman cannot find, a bad option...:
    CONTAINERS_CONF is named only where podman's line is about what it fixes."""
    c = section(engine="podman")
    assert containerspec.probe_failure(c, "python3", 125, "Error: x: image not known",
                                       "...") == (
        "podman could not start python3 in a container of the image reg/train:1.2 (exit 125: "
        "Error: x: image not known): where podman cannot run containers with its defaults, "
        "see docs/how-to/containers.md")
    conf = "Error: reading CONTAINERS_CONF /x: no such file"
    assert containerspec.probe_failure(c, "python3", 125, conf, "...").endswith(
        "see docs/how-to/containers.md (CONTAINERS_CONF, a runtime and ulimits that work here)")


# podman 4.3's last line when it cannot raise the ulimits its defaults ask (no CONTAINERS_CONF)
RLIMIT = ("Error: runc: runc create failed: unable to start container process: error during "
          "container init: error setting rlimits for ready process: error setting rlimit type "
          "7: operation not permitted: OCI permission denied")


def test_an_engine_that_cannot_start_the_probe_is_said_whole_with_the_docs() -> None:
    c = section(engine="podman")
    assert containerspec.engine_line(f"some line\n{RLIMIT}\n") == RLIMIT
    assert containerspec.engine_line(
        'time="2026-12-01T10:00:00Z" level=error msg="finding config on system: '
        'CONTAINERS_CONF file: stat /x: no such \\"file\\""\n') == (
        'finding config on system: CONTAINERS_CONF file: stat /x: no such "file"')
    assert containerspec.probe_failure(c, "python3", 126, RLIMIT, "...") == (
        f"podman could not start python3 in a container of the image reg/train:1.2 (exit 126: "
        f"{RLIMIT}): where podman cannot run containers with its defaults, see "
        "docs/how-to/containers.md (CONTAINERS_CONF, a runtime and ulimits that work here)")
    assert containerspec.probe_failure(section(engine="docker"), "python3", 125, "Error: x",
                                       "...") == (
        "docker could not start python3 in a container of the image reg/train:1.2 (exit 125: "
        "Error: x): where docker cannot run containers with its defaults, see "
        "docs/how-to/containers.md")
    assert _container_checks.gib(64 << 50) == "67,108,864 GiB"
    assert containerspec.probe_failure(c, "/opt/py", 127, "Error: not found", "...") == (
        "no /opt/py in the image reg/train:1.2 (podman exit 127: Error: not found): set "
        "trainer.python to the image's Python")
    long = "Error: " + "word " * 200
    said = containerspec.engine_line(long)
    assert len(said) <= 400 and said.endswith("word …")


# -- the image pinned, the lineage's image, the reclaim ---------------------------------

def test_the_image_is_pinned_once_per_process_and_a_moved_tag_is_said(tmp_path: Path) -> None:
    asked: list[list[str]] = []

    def inspect(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "1234abcd\tsha256:feed\n", "")

    c = section(engine="podman", image="reg/pin-test:1")
    first = _engine.pin(c, tmp_path, inspect)
    assert _engine.pin(c, tmp_path, inspect) is first
    assert asked == [["podman", "image", "inspect", "--format", "{{.Id}}\t{{.Digest}}",
                      "reg/pin-test:1"]]
    assert first == _container.Image("reg/pin-test:1", "sha256:1234abcd", "sha256:feed")
    out = tmp_path / "out"
    out.mkdir()
    assert _engine.moved_since(out, first) is None  # no run before
    assert _engine.moved_since(out, first) is None  # the same image
    moved = _container.Image("reg/pin-test:1", "sha256:9999")
    assert _engine.moved_since(out, moved) == "sha256:1234abcd"
    assert _engine.moved_since(out, moved) is None


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
        out = "sweep-st-1\nsweep-st-2\nsweep-st-x\nsweep-other-3\n" if argv[1] == "ps" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    running = {OUT / "trials" / "1"}
    removed = _engine.reclaim(section(engine="podman"), "st", OUT, lambda d: d in running,
                             engine_run)
    assert removed == ["sweep-st-2"]
    assert asked == [
        ["podman", "ps", "--all", "--filter", "label=sweep.output_dir=/s/out", "--format",
         "{{.Names}}"],
        ["podman", "rm", "--force", "--time", "0", "sweep-st-2"]]


# -- real sweeps in a real podman container (slow) --------------------------------------

CONTAINER_PROBE = TRAINERS / "container_probe.py"


@pytest.fixture(scope="session")
def container_image(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """TEST_IMAGE in podman's store (built if missing), with CONTAINERS_CONF set for the
    session."""
    import shutil

    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman runc debootstrap)")
    folder = tmp_path_factory.mktemp("image")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTAINERS_CONF", str(test_image.containers_conf(folder)))
        if not test_image.exists():  # `.ci/run` builds it while it installs
            test_image.build(folder)
        yield test_image.TEST_IMAGE


def image_id(ref: str) -> str:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", ref],
                         check=True, capture_output=True, text=True).stdout.strip()
    return f"sha256:{out}"


def study_containers(output_dir: Path, every: bool = True) -> list[str]:
    """The names of the containers of the study in `output_dir`: all of them, or (`every`
    false) those running."""
    out = subprocess.run(["podman", "ps", *(["--all"] if every else []), "--filter",
                          f"label=sweep.output_dir={output_dir}", "--format", "{{.Names}}"],
                         check=True, capture_output=True, text=True).stdout
    return out.split("\n")[:-1]


def container_study(write_study: Any, image: str, name: str, n_trials: int,
                    args: list[str], study: dict[str, Any] | None = None,
                    **trainer: Any) -> Path:
    from conftest import study_dict

    return write_study(study_dict(
        study={"name": name, "n_trials": n_trials, "heartbeat_interval": 1, "reclaim_after": 2,
               **(study or {})},
        trainer={"script": str(CONTAINER_PROBE), "grace_period": 2.0, "args": args,
                 "env": {"MY_API_TOKEN": "t0ps3cret"}, "container": {"image": image},
                 **trainer}))


def read_json(path: Path) -> Any:
    import json

    return json.loads(path.read_text())


@pytest.mark.slow
def test_four_trials_on_two_simulated_devices_complete_in_the_container(
        container_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    import csv
    import sys

    from conftest import load_trials, run_cli

    study = container_study(write_study, container_image, "box", 4, [])
    assert run_cli("run", str(study)) == 0
    trials = load_trials(study, "box")
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    pinned = image_id(container_image)
    out = tmp_path / "box"
    for t in trials:
        result = read_json(out / "trials" / str(t.number) / "result.json")
        assert result["marker"] is True  # the image's root, not the host's
        assert result["executable"] == "/usr/bin/python3" != sys.executable
        assert result["secret"] == "t0ps3cret"
        assert result["cuda_visible"] == str(t.user_attrs[names.GPU])
        assert t.value == pytest.approx((t.params["x"] - 0.3) ** 2)
        assert read_json(out / "checkpoints" / str(t.number) / "state.json") == {"next": 3}
        env = read_json(out / "trials" / str(t.number) / "env.json")
        assert env["image"]["id"] == pinned and env["image"]["ref"] == container_image
        assert env["python"]["executable"] == "/usr/bin/python3"
        assert env["packages"]["torch"] is None  # read inside the image, which has none
        assert t.user_attrs[names.IMAGE] == pinned
        command = (out / "trials" / str(t.number) / "command.sh").read_text()
        assert "--env MY_API_TOKEN " in command and "t0ps3cret" not in command
        assert f" {pinned} python3 {CONTAINER_PROBE} " in command
    assert study_containers(out) == []
    assert run_cli("summary", str(study)) == 0
    with open(out / "summary.csv") as f:
        assert {row["image"] for row in csv.DictReader(f)} == {pinned}


def wait_for(predicate: Any, timeout: float) -> None:
    from conftest import wait_until

    assert wait_until(predicate, timeout)


@pytest.mark.slow
def test_sigterm_continues_the_lineage_in_a_new_container_from_its_checkpoint(
        container_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    """The driver signalled is a real process; the rerun runs in this one (what it proves is
    in the storage and the folders, not in its process)."""
    import signal

    from conftest import load_trials, run_cli, spawn_cli

    study = container_study(write_study, container_image, "term", 1,
                            ["--steps", "30", "--sleep", "0.1"])
    out = tmp_path / "term"
    state = out / "checkpoints" / "0" / "state.json"
    driver = spawn_cli("run", str(study))
    wait_for(lambda: state.exists() and read_json(state)["next"] >= 3, 60)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 130, err
    wait_for(lambda: study_containers(out) == [], 10)
    stopped_at = read_json(state)["next"]
    assert 3 <= stopped_at < 30

    assert run_cli("run", str(study)) == 0
    trials = load_trials(study, "term")
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    starts = (out / "checkpoints" / "0" / "starts.log").read_text().split("\n")[:-1]
    (n0, step0, host0), (n1, step1, host1) = (line.split() for line in starts)
    assert (n0, step0, n1, int(step1)) == ("0", "0", "1", stopped_at)
    assert host0 != host1  # two containers (each its own hostname)
    assert read_json(out / "trials" / "1" / "result.json")["steps"] == [stopped_at, 30]
    assert study_containers(out) == []


def host_namespace_pids_of(trial_dir: Path) -> list[int]:
    """The pids of this PID namespace that run for the trial in `trial_dir` (its guard, the
    engine's command and monitor), not those inside its container."""
    import os

    import psutil

    mine = os.readlink("/proc/self/ns/pid")
    found = []
    for p in psutil.process_iter():
        try:
            text = " ".join(p.cmdline()) + " ".join(p.environ().values())
            if str(trial_dir) in text and os.readlink(f"/proc/{p.pid}/ns/pid") == mine \
                    and p.pid != os.getpid():
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.slow
def test_kill_9_of_the_driver_and_its_guards_leaves_no_container_after_the_next_run(
        container_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    import os
    import signal

    from conftest import spawn_cli

    study = container_study(write_study, container_image, "nine", 1,
                            ["--steps", "600", "--sleep", "0.1"])
    out = tmp_path / "nine"
    driver = spawn_cli("run", str(study))
    wait_for(lambda: study_containers(out, every=False) == ["sweep-nine-0"], 60)
    # the window the reclaim is for: the driver and everything of the trial on this side of
    # the container gone at once (the guard, or the driver seeing its guard die, would stop
    # the container's processes themselves): the driver frozen first, so it sees nothing
    driver.send_signal(signal.SIGSTOP)
    for pid in host_namespace_pids_of(out / "trials" / "0"):
        if pid != driver.pid:
            os.kill(pid, signal.SIGKILL)
    driver.kill()
    driver.communicate(timeout=10)
    wait_for(lambda: not host_namespace_pids_of(out / "trials" / "0"), 10)
    assert study_containers(out, every=False) == ["sweep-nine-0"]  # nothing stops it now

    study.write_text(study.read_text().replace("'600'", "'3'"))
    rerun = spawn_cli("run", str(study))
    stdout, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert "removed 1 container(s) left by trials that no longer run: sweep-nine-0" in (
        stdout + err)
    assert study_containers(out) == []


@pytest.fixture
def other_image(container_image: str) -> Any:
    """A second image (another ID) made from the test image, removed after the test."""
    name = "sweep-test-commit"
    subprocess.run(["podman", "rm", "--force", name], capture_output=True)  # an earlier test's
    subprocess.run(["podman", "run", "--name", name, container_image, "touch", "/other"],
                   check=True, capture_output=True)
    subprocess.run(["podman", "commit", "-q", name, "localhost/sweep-test-other:1"],
                   check=True, capture_output=True)
    subprocess.run(["podman", "rm", name], check=True, capture_output=True)
    yield "localhost/sweep-test-other:1"
    subprocess.run(["podman", "rmi", "-f", "localhost/sweep-test-other:1",
                    "localhost/sweep-test-moving:1"], capture_output=True)


@pytest.mark.slow
def test_a_lineage_asked_to_continue_under_another_image_is_refused(
        container_image: str, other_image: str, write_study: Any, fake_gpus: Any,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The driver signalled is a real process; the rerun that refuses the other image runs in
    this one."""
    import signal

    from conftest import load_trials, run_cli, spawn_cli

    moving = "localhost/sweep-test-moving:1"
    subprocess.run(["podman", "tag", container_image, moving], check=True)
    study = container_study(write_study, moving, "moved", 1,
                            ["--steps", "30", "--sleep", "0.1"])
    out = tmp_path / "moved"
    state = out / "checkpoints" / "0" / "state.json"
    driver = spawn_cli("run", str(study))
    wait_for(lambda: state.exists() and read_json(state)["next"] >= 2, 60)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 130, err

    subprocess.run(["podman", "tag", other_image, moving], check=True)  # the tag moves
    first, then = image_id(container_image), image_id(other_image)
    capsys.readouterr()
    code = run_cli("run", str(study))
    said = "".join(capsys.readouterr())
    assert f"trainer.container.image {moving} is {then} now; the study's last run had " \
           f"{first}: the tag moved" in said, said
    assert "started in the image " + first in said
    assert code != 0
    trials = load_trials(study, "moved")
    # nothing of it ran: its continuation waits for a run in the lineage's image (or one
    # that allows another), the lineage not lost
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING"]
    assert trials[1].user_attrs[names.FAIL_REASON].startswith(
        "could not prepare the trial: its lineage (checkpoints in ")
    assert trials[2].user_attrs[names.CONTINUES] == 1
    starts = (out / "checkpoints" / "0" / "starts.log").read_text().split("\n")[:-1]
    assert len(starts) == 1  # nothing ran in the other image


@pytest.mark.slow
def test_a_hung_trial_in_the_container_has_its_stack_taken_through_the_hosts_pids(
        container_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    """The container's processes are the guard's descendants (the engine's monitor comes back
    to it, a subreaper): py-spy reads them by their pids in this namespace."""
    from conftest import load_trials, run_cli

    study = container_study(write_study, container_image, "hung", 1,
                            ["--steps", "1", "--sleep", "300"],
                            {"max_consecutive_failures": 1}, hang_after=3)
    assert run_cli("run", str(study)) != 0
    trial, = load_trials(study, "hung")
    assert trial.user_attrs[names.FAIL_REASON].startswith("hung: no output")
    stack = (tmp_path / "hung" / "trials" / "0" / "stack.txt").read_text()
    assert f"python3 {CONTAINER_PROBE} --steps 1 --sleep 300" in stack
    assert "main (container_probe.py:" in stack, stack
    assert study_containers(tmp_path / "hung") == []


@pytest.mark.slow
def test_bad_container_input_is_one_line_each_before_anything_is_written(
        container_image: str, write_study: Any, tmp_path: Path) -> None:
    from sweep.spec import config

    def problems_of(launcher: str = "python", **container: Any) -> list[str]:
        study = container_study(write_study, container_image, "bad", 1, [],
                                container={"image": container_image, **container},
                                launcher=launcher)
        with pytest.raises(ConfigError) as e:
            config.load(study)
        assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.db").exists()
        return [str(p).split(": ", 1)[1] for p in e.value.problems]

    assert problems_of(image="localhost/sweep-test-none:1") == [
        "trainer.container.image: no image localhost/sweep-test-none:1 in podman's store: "
        "build or pull it first (podman pull localhost/sweep-test-none:1); sweep pulls nothing"]
    assert problems_of(tag="1") == [
        "trainer.container.tag: unknown key `tag` (trainer.container takes image, engine, "
        "run_args, mounts, shm_size, continue_in_other_image)"]
    assert problems_of(launcher="accelerate") == [
        f"trainer.python: python3 in the image {container_image} has no accelerate, which "
        "launcher: accelerate runs: install it there (pip install accelerate), or use "
        "launcher: python"]
    study = container_study(write_study, container_image, "bad", 1, [],
                            python="/opt/none/python")
    with pytest.raises(ConfigError) as e:
        config.load(study)
    assert str(e.value) == (
        f"{study}: trainer.container: no /opt/none/python in the image {container_image} "
        "(podman exit 127: Error: runc: runc create failed: unable to start container process: "
        'exec: "/opt/none/python": stat /opt/none/python: no such file or directory: OCI '
        "runtime attempted to invoke a command that was not found): set trainer.python to the "
        "image's Python")


@pytest.mark.slow
def test_what_would_fail_every_trial_in_the_container_is_refused_as_the_file_loads(
        container_image: str, write_study: Any, tmp_path: Path) -> None:
    """Each was taken: `-itd` then failed the load blaming python3 and the TTY; an output
    folder with ':' failed every trial with podman's volume error, one with ',' ended the run
    with "b is an invalid filter"; a /dev/shm larger than the host, a mount over the study's
    folder, ran."""
    from sweep.spec import config

    def problems_of(study: dict[str, Any] | None = None, **container: Any) -> list[str]:
        path = container_study(write_study, container_image, "bad", 1, [], study,
                               container={"image": container_image, **container})
        with pytest.raises(ConfigError) as e:
            config.load(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]
        return [str(p).split(": ", 1)[1] for p in e.value.problems]

    assert problems_of(run_args=["-itd"]) == [
        "trainer.container.run_args.0: -itd: sweep sets -i (--interactive), -t (--tty) and -d "
        "(--detach) for each trial (a trial reads no input; a trial has no terminal, its output "
        "and errors read apart; a trial's container runs in the foreground, its exit the "
        "trial's): remove it"]
    for folder, char in (("out:1", ":"), ("a,b", ",")):
        assert problems_of({"output_dir": folder}) == [
            f"study.output_dir: the study's output folder {tmp_path}/{folder} has a "
            f"{char!r}, which podman cannot mount (its mount and filter options split on "
            "':' and ','): use a path without ':' or ','"]
    memory = _container_checks.host_memory()
    assert memory is not None
    assert problems_of(shm_size="64p") == [
        f"trainer.container.shm_size: 64p is {_container_checks.gib(64 << 50)}, more than this "
        f"host's memory ({_container_checks.gib(memory)}), where /dev/shm lives: give at most "
        f"{_container_checks.gib(memory)}"]
    assert problems_of(run_args=["-v", f"/tmp:{tmp_path}"]) == [
        f"trainer.container.run_args.0: -v /tmp:{tmp_path} mounts over the study's folder "
        f"{tmp_path}, which sweep mounts from the host for each trial: mount it at another path"]


@pytest.mark.slow
def test_podman_that_cannot_start_a_container_here_is_one_whole_line_naming_the_docs(
        container_image: str, write_study: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As without a working CONTAINERS_CONF on this kind of machine: ulimits no one may set
    (above the kernel's nr_open, root included)."""
    from sweep.spec import config, interpreter

    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1073741824:1073741824"]\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    monkeypatch.setattr(interpreter, "_known", {})  # asked anew, not answered from before
    study = container_study(write_study, container_image, "bad", 1, [])
    with pytest.raises(ConfigError) as e:
        config.load(study)
    line = str(e.value)
    head = (f"{study}: trainer.container: podman could not start python3 in a container of the "
            f"image {container_image} (exit 126: Error: ")
    tail = ("): where podman cannot run containers with its defaults, see "
            "docs/how-to/containers.md (CONTAINERS_CONF, a runtime and ulimits that work here)")
    assert line.startswith(head) and line.endswith(tail), line
    said = line[len(head):-len(tail)]
    assert "error setting rlimit type 7: operation not permitted" in said  # the whole line
    assert "\n" not in line and "…" not in line


def test_the_interpreter_probe_runs_in_the_image_as_a_trial_would_without_devices() -> None:
    c = section(engine="podman", mounts=["data:/data:ro"], run_args=["--ipc", "host"])
    assert containerspec.probe_prefix(c, Path("/s")) == [
        "podman", "run", "--rm", "-v", "/s/data:/data:ro", "--ipc", "host", "reg/train:1.2"]
    shm = section(engine="podman", shm_size="8g")  # as a trial has it: a size it cannot mount
    assert containerspec.probe_prefix(shm, Path("/s")) == [  # fails the load, not each trial
        "podman", "run", "--rm", "--shm-size", "8g", "reg/train:1.2"]
    a = section(engine="apptainer", image="img/t.sif")
    assert containerspec.probe_prefix(a, Path("/s")) == [
        "apptainer", "exec", "--cleanenv", "/s/img/t.sif"]


def test_the_report_names_the_images_the_trials_ran_in() -> None:
    import pandas as pd

    from sweep.analysis.report import images_line

    frame = pd.DataFrame({"image": ["sha256:b", "sha256:a", "sha256:b", None]})
    assert images_line(frame) == "image sha256:a: 1 trial; sha256:b: 2 trials"
    assert images_line(pd.DataFrame({"image": [None, None]})) is None
    assert images_line(pd.DataFrame({"number": [1]})) is None


def test_the_container_launcher_warns_of_latest_says_a_moved_tag_and_passes_real_devices(
        write_study: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import study_dict

    from sweep.gpus.pool import FAKE_ENV
    from sweep.launch.make import make
    from sweep.spec import config

    study = write_study(study_dict(trainer={"container": {"image": "reg/t:latest",
                                                          "engine": "podman"}}))
    spec = config.load(study, runnable=False)
    spec.output_dir.mkdir()  # as the run makes it before the launcher
    ids = iter(["sha256:1", "sha256:2"])
    monkeypatch.setattr(_engine, "pin", lambda c, base: _container.Image(c.image, next(ids)))
    monkeypatch.setattr(_engine, "reclaim", lambda c, name, out: [])
    said: list[str] = []
    for _ in range(2):
        launcher = make(spec, "host", tmp_path / "own", said.append)
        launcher.prepare()
    latest = ("trainer.container.image reg/t:latest names a tag that moves (latest): a rerun, "
              "or a trial carried on later, may get another image; this run pins {}. Give a "
              "fixed tag (name:1.2) or a digest (name@sha256:...)")
    assert said == [latest.format("sha256:1"), latest.format("sha256:2"),
                    "trainer.container.image reg/t:latest is sha256:2 now; the study's last "
                    "run had sha256:1: the tag moved"]
    monkeypatch.delenv(FAKE_ENV, raising=False)
    argv = launcher.plan(0, {"x": 0.5}, 1, "GPU-abc").argv
    assert argv[argv.index("--device"):argv.index("--device") + 2] == [
        "--device", "nvidia.com/gpu=GPU-abc"]
    assert argv[argv.index("sha256:2") + 1] == "python3"  # the image's interpreter
    monkeypatch.setenv(FAKE_ENV, "2")
    assert "--device" not in launcher.plan(0, {"x": 0.5}, 1, "1").argv


class EndingProcess:
    """A killed trial's tree that ends a moment after the run's end looks (its reader thread
    has not seen the end yet)."""

    def __init__(self, after: float) -> None:
        import threading

        self.exit_code, self.lost = 137, False
        self._ended = threading.Event()
        threading.Timer(after, self._ended.set).start()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._ended.wait(timeout)


def test_the_runs_end_waits_for_a_killed_trials_tree_and_removes_its_container_itself(
        write_study: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not left to the reclaim of containers that outlived their trials (which says so)."""
    from conftest import study_dict

    from sweep.launch._in_container import ContainerLauncher
    from sweep.launch.make import make
    from sweep.spec import config

    spec = config.load(write_study(study_dict(trainer={"container": {
        "image": "reg/t:1", "engine": "podman"}})), runnable=False)
    removed: list[str] = []
    at_reclaim: list[list[str]] = []
    monkeypatch.setattr(_engine, "remove", lambda c, name: removed.append(name) or True)
    monkeypatch.setattr(_engine, "reclaim", lambda c, name, out: at_reclaim.append(removed[:])
                        or [])
    said: list[str] = []
    launcher = make(spec, "host", tmp_path / "own", said.append)
    assert isinstance(launcher, ContainerLauncher)
    launcher._ended["sweep-s-0"] = EndingProcess(0.3)  # type: ignore[assignment]
    launcher.close()
    assert at_reclaim == [["sweep-s-0"]] and said == []


@pytest.fixture(scope="session")
def host_python_image(container_image: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An image of a marker and this root's top-level links only (seconds to make): with this
    machine's /usr and the driver's Python mounted read-only (`host_python_mounts`), a
    container of it runs the driver's own interpreter, torch and accelerate included."""
    import os

    tag = "localhost/sweep-test-hostpython:1"
    if subprocess.run(["podman", "image", "exists", tag]).returncode != 0:
        root = tmp_path_factory.mktemp("hostpython")
        for name in ("etc", "tmp", "proc", "sys", "dev"):
            (root / name).mkdir()
        (root / test_image.MARKER.lstrip("/")).write_text("sweep test image\n")
        for name in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{name}"):
                (root / name).symlink_to(os.readlink(f"/{name}"))
        tar = root.parent / "hostpython.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
        subprocess.run(["podman", "import", str(tar), tag], check=True, capture_output=True)
    yield tag


def host_python_mounts() -> list[str]:
    """`run_args` that mount this machine's /usr, its top-level folders that are not links to
    it, and the driver's Python (its venv and base) read-only."""
    import os
    import sys

    folders = {"/usr", *(f"/{n}" for n in ("bin", "sbin", "lib", "lib64")
                         if os.path.isdir(f"/{n}") and not os.path.islink(f"/{n}")),
               os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    keep = sorted(f for f in folders
                  if not any(o != f and f.startswith(o + "/") for o in folders))
    return [a for f in keep for a in ("-v", f"{f}:{f}:ro")]


def run_in_host_python_image(write_study: Any, image: str, name: str, launcher: str,
                             tmp_path: Path) -> tuple[Path, str]:
    """A one-trial study of `launcher` in `image` with the driver's Python mounted, run to
    COMPLETE in the image: the trial's folder and its command.sh."""
    import sys

    from conftest import load_trials, run_cli

    study = container_study(write_study, image, name, 1, [], launcher=launcher,
                            python=sys.executable,
                            container={"image": image, "run_args": host_python_mounts()})
    assert run_cli("run", str(study)) == 0
    trial, = load_trials(study, name)
    assert trial.state.name == "COMPLETE", trial.user_attrs
    folder = tmp_path / name / "trials" / "0"
    assert read_json(folder / "result.json")["marker"] is True
    return folder, (folder / "command.sh").read_text()


@pytest.mark.slow
def test_accelerate_launch_runs_inside_the_image_with_sweeps_config_mounted(
        host_python_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    import sys
    from importlib import metadata

    from sweep.trial.launch_plan import ACCELERATE_CONFIG_FILE

    folder, command = run_in_host_python_image(write_study, host_python_image, "acc",
                                               "accelerate", tmp_path)
    assert read_json(folder / "result.json")["cuda_visible"] == "0"
    assert f"-v {ACCELERATE_CONFIG_FILE}:{ACCELERATE_CONFIG_FILE}:ro" in command
    assert f" {sys.executable} -m accelerate.commands.launch --config_file " in command
    assert read_json(folder / "env.json")["packages"]["torch"] == metadata.version("torch")


@pytest.mark.slow
def test_a_trial_killed_after_its_grace_has_its_container_removed_when_it_ends(
        container_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer sleeps through SIGTERM: the guard SIGKILLs the engine's command and monitor
    with it, so the engine's own --rm never runs; the container goes as the trial ends, not
    at the run's end."""
    from conftest import load_trials, run_cli

    study = container_study(write_study, container_image, "late", 1,
                            ["--steps", "1", "--sleep", "300"],
                            {"max_consecutive_failures": 1}, timeout=2, grace_period=1.0)
    capsys.readouterr()
    run_cli("run", str(study))
    said = "".join(capsys.readouterr())
    trial, = load_trials(study, "late")
    assert trial.user_attrs[names.FAIL_REASON] == "timeout after 2 s"
    assert "removed" not in said  # nothing was left for the run's end
    assert study_containers(tmp_path / "late") == []


@pytest.mark.slow
def test_launcher_direct_asks_the_images_accelerate_for_its_variables(
        host_python_image: str, write_study: Any, fake_gpus: Any, tmp_path: Path) -> None:
    import sys

    _, command = run_in_host_python_image(write_study, host_python_image, "direct", "direct",
                                          tmp_path)
    assert "--env ACCELERATE_MIXED_PRECISION=no " in command  # accelerate's, from inside
    assert f" {sys.executable} {CONTAINER_PROBE} --x " in command
    assert "accelerate.commands.launch" not in command


def test_a_sif_file_is_pinned_by_its_sha256_and_a_docker_reference_by_its_id(
        tmp_path: Path) -> None:
    import hashlib

    (tmp_path / "t.sif").write_bytes(b"not really an image")
    sif = _engine.pin(section(engine="apptainer", image="t.sif"), tmp_path)
    assert sif == _container.Image(
        "t.sif", "sha256:" + hashlib.sha256(b"not really an image").hexdigest())
    assert sif.run_ref("apptainer") == "t.sif"

    def inspect(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv == ["docker", "image", "inspect", "--format",
                        '{{.Id}}\t{{join .RepoDigests ","}}', "reg/d:1"]
        return subprocess.CompletedProcess(argv, 0, "sha256:abc\treg/d@sha256:def,x@y\n", "")

    image = _engine.pin(section(engine="docker", image="reg/d:1"), tmp_path, inspect)
    assert image == _container.Image("reg/d:1", "sha256:abc", "sha256:def")
    assert image.run_ref("docker") == "sha256:abc"
    with pytest.raises(_engine.ImageError, match="apptainer pull"):
        _engine.pin(section(engine="apptainer", image="docker://reg/d:1"), tmp_path)
