"""A trial's command inside a container of the study's image (`trainer.container`), pure.

`wrap` turns a trial's plan (`launch_plan.LaunchPlan`: the argv and environment it would run
with on the host) into the engine's command that runs the same argv in the image:

    podman run --rm --name sweep-<study>-<trial> --init --label ... -v STUDY_DIR:STUDY_DIR
        -v TRIAL_DIR:TRIAL_DIR -v CHECKPOINT_DIR:CHECKPOINT_DIR [-v FILE:FILE:ro ...]
        [mounts] -w WORKDIR [--shm-size S] --env NAME=VALUE ... --env SECRET_NAME ...
        [--device nvidia.com/gpu=UUID ...] [run_args] IMAGE ARGV...

The folders are mounted at the same paths, so every path in the argv and the environment means
the same inside. A variable that holds a secret (`_core.secrets.secret_variable`) is passed by name
only: the engine takes its value from its own environment (the plan's), never from its command
line. Devices are passed by UUID: CDI `--device nvidia.com/gpu=UUID` for podman, `--gpus
device=UUID` for docker, `--nv` for apptainer; `CUDA_VISIBLE_DEVICES` stays as the plan set it
(the device's UUID: inside, the one device visible is `cuda:0`). On a simulated pool there are no
devices to pass: the same command without a device option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sweep._core import secret_variable
from sweep.spec import ContainerSection, Engine, Mount
from sweep.trial import LaunchPlan

NAME_PREFIX = "sweep-"
LABEL_OUTPUT_DIR = "sweep.output_dir"  # names the study's output folder (the reclaim's filter)
LABEL_TRIAL_DIR = "sweep.trial_dir"
APPTAINER_ENV = "APPTAINERENV_"  # apptainer passes NAME from APPTAINERENV_NAME into the image


@dataclass(frozen=True)
class Image:
    """The study's image as the engine resolved it, once per run."""

    ref: str  # as the study file names it (a tag, a digest, a SIF path)
    id: str  # `sha256:<hex>`: the engine's image ID (a SIF file's SHA-256): what runs
    digest: str | None = None  # the manifest or repository digest, when the engine has one

    def run_ref(self, engine: Engine) -> str:
        """What `run` is given: the ID (a tag that moves during the run changes no trial),
        the file for apptainer."""
        return self.ref if engine == "apptainer" else self.id

    def record(self) -> dict[str, str | None]:
        """As env.json keeps it."""
        return {"ref": self.ref, "id": self.id, "digest": self.digest}


def container_name(study: str, number: int) -> str:
    """`sweep-<study>-<trial>` (a study name is letters, digits, `.`, `_` and `-`: a name
    every engine takes)."""
    return f"{NAME_PREFIX}{study}-{number}"


def trial_of(name: str, study: str) -> int | None:
    """The trial number of a container named by `container_name` for `study`; None if the
    name is not one."""
    head = f"{NAME_PREFIX}{study}-"
    rest = name[len(head):] if name.startswith(head) else ""
    return int(rest) if rest.isdigit() else None


def _bind(host: Path | str, target: Path | str | None = None, read_only: bool = False) -> str:
    return f"{host}:{target or host}{':ro' if read_only else ''}"


def wrap(
    plan: LaunchPlan, container: ContainerSection, image: Image, name: str,
    study_dir: Path, checkpoint_dir: Path, workdir: Path, output_dir: Path,
    devices: Sequence[str] | None, files: Sequence[Path] = (), mounts: Sequence[Mount] = (),
) -> LaunchPlan:
    """`plan` run inside `image` (see the module's docstring): `devices` the UUIDs to pass
    through (None: a simulated pool, no device option); `files` read-only mounts of files the
    argv names outside the mounted folders (sweep's accelerate config, a script elsewhere);
    `mounts` the study's extra ones. The result is the plan of the engine's command: the same
    files and result, the environment the engine needs (the values of names passed alone),
    and no trainer to watch among its children (the trainer runs under the engine's monitor,
    not under the command)."""
    engine = container.engine or "podman"
    folders = [study_dir, plan.paths.dir, checkpoint_dir]
    binds = list(dict.fromkeys(
        [*(_bind(f) for f in folders), *(_bind(f, read_only=True) for f in files),
         *(m.option() for m in mounts)]))
    if engine == "apptainer":
        env = {**plan.env, **{APPTAINER_ENV + k: v for k, v in plan.env.items()}}
        argv = ["apptainer", "exec", "--cleanenv", "--bind", ",".join(binds),
                "--pwd", str(workdir), *(["--nv"] if devices else []),
                *container.run_args, image.run_ref(engine), *plan.argv]
        return replace(plan, argv=argv, env=env, trainer=None)
    argv = [engine, "run", "--rm", "--name", name, "--init",
            "--label", f"{LABEL_OUTPUT_DIR}={output_dir}",
            "--label", f"{LABEL_TRIAL_DIR}={plan.paths.dir}"]
    for bind in binds:
        argv += ["-v", bind]
    argv += ["-w", str(workdir)]
    if container.shm_size is not None:
        argv += ["--shm-size", container.shm_size]
    argv += env_options(plan.env)
    argv += device_options(engine, devices)
    argv += [*container.run_args, image.run_ref(engine), *plan.argv]
    return replace(plan, argv=argv, env=dict(plan.env), trainer=None)


def env_options(env: Mapping[str, str]) -> list[str]:
    """`--env NAME=VALUE` for each variable, `--env NAME` (the value from the engine's own
    environment) for one whose name looks secret; sorted by name."""
    out: list[str] = []
    for key in sorted(env):
        out += ["--env", key if secret_variable(key, env[key]) else f"{key}={env[key]}"]
    return out


def device_options(engine: Engine, devices: Sequence[str] | None) -> list[str]:
    """The options that pass `devices` (UUIDs) into a podman or docker container."""
    if not devices:
        return []
    if engine == "docker":  # one --gpus takes several devices, quoted, comma-separated
        ids = ",".join(devices)
        return ["--gpus", f"device={ids}" if len(devices) == 1 else f'"device={ids}"']
    out: list[str] = []
    for uuid in devices:
        out += ["--device", f"nvidia.com/gpu={uuid}"]
    return out


def outside(paths: Sequence[Path], folders: Sequence[Path]) -> list[Path]:
    """The `paths` under none of `folders` (files the argv names that need a mount)."""
    return [p for p in paths
            if not any(p == f or f in p.parents for f in folders)]


def workdir_for(cwd: Path | None, driver_cwd: Path, study_dir: Path) -> Path:
    """Where the command runs inside: `trainer.workdir` (the plan's cwd) when set; else the
    driver's working folder when it lies in the study's folder (mounted); else the study's
    folder."""
    if cwd is not None:
        return cwd
    if driver_cwd == study_dir or study_dir in driver_cwd.parents:
        return driver_cwd
    return study_dir
