"""`trainer.container`: the image trials run in, and its checks when the study file loads.

A study with `trainer.container` runs each trial's command (`accelerate launch`, or the
trainer's `python`) inside a container of `image`, started by `engine` (podman, docker or
apptainer: the first found on PATH when not given). `resolve` checks, before anything is
written, what can be checked without running a trial: the engine is there, the image is in its
store (asked of the engine), every extra mount lies inside what the study owns (the study
file's folder, `study.output_dir`). Whether the engine can run a container here at all is
asked by the interpreter probe of `trainer.python` inside the image (`probe_prefix`), which
the study file's load runs too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from sweep._core.errors import ConfigError, Problem, short
from sweep.spec.searchspace import Section

Engine = Literal["podman", "docker", "apptainer"]
ENGINES: tuple[Engine, ...] = ("podman", "docker", "apptainer")  # the order PATH is searched
DEFAULT_PYTHON = "python3"  # the interpreter inside the image unless trainer.python names one
KEY = "trainer.container"
ENGINE_TIMEOUT = 30.0  # seconds for one question to the engine (image inspect)
# options sweep sets itself for each trial: given in run_args they would clash with its own
OWN_OPTIONS = ("--name", "-d", "--detach", "--rm")

Run = Callable[..., "subprocess.CompletedProcess[str]"]
Which = Callable[[str], "str | None"]


class ContainerSection(Section, BaseModel):  # BaseModel named: ruff knows a pydantic model
    """`trainer.container` of the study file."""

    image: Annotated[str, Field(min_length=1)]
    engine: Engine | None = None  # None: the first of ENGINES on PATH (filled by `resolve`)
    run_args: list[str] = []  # more options of `ENGINE run` (before the image)
    # extra folders, `HOST[:TARGET][:ro]`, HOST relative to the study file's folder
    mounts: list[Annotated[str, Field(min_length=1)]] = []
    shm_size: Annotated[str, Field(pattern=r"^[0-9]+[bkmgBKMG]?$")] | None = None
    # a lineage (attempts sharing a checkpoint folder) carries on in another image than the
    # one it started in; false: such an attempt is refused
    continue_in_other_image: bool = False


@dataclass(frozen=True)
class Mount:
    """One extra folder of `trainer.container.mounts`, resolved."""

    host: Path
    target: str
    read_only: bool = False

    def option(self) -> str:
        """As `-v`/`--bind` takes it: `HOST:TARGET[:ro]`."""
        return f"{self.host}:{self.target}{':ro' if self.read_only else ''}"


def parse_mount(text: str, base: Path) -> Mount:
    """`HOST`, `HOST:TARGET` or `HOST:TARGET:ro|rw` (HOST relative to `base`; TARGET absolute,
    HOST's own path when not given); ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"{short(text, 60)!r}: give HOST, HOST:TARGET or HOST:TARGET:ro")
    host = Path(os.path.abspath(base / parts[0]))
    target = parts[1] if len(parts) > 1 and parts[1] else str(host)
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise ValueError(f"{short(text, 60)!r}: the mode is ro or rw, not {short(mode, 20)!r}")
    if not target.startswith("/"):
        raise ValueError(f"{short(text, 60)!r}: the path in the container must be absolute")
    return Mount(host, target, mode == "ro")


def mounts(section: ContainerSection, base: Path) -> list[Mount]:
    """The section's extra mounts, resolved (after `resolve` they parse)."""
    return [parse_mount(m, base) for m in section.mounts]


def find_engine(engine: Engine | None, which: Which = shutil.which) -> tuple[Engine, str]:
    """The engine to use and its executable: `engine`, or the first of ENGINES on PATH;
    ValueError saying what is missing."""
    for name in (engine,) if engine is not None else ENGINES:
        found = which(name)
        if found:
            return name, found
    if engine is not None:
        raise ValueError(f"engine {engine} is not on PATH: install it, or name another "
                         f"engine ({', '.join(ENGINES)})")
    raise ValueError(f"no container engine on PATH (looked for {', '.join(ENGINES)}): "
                     "install podman (apt-get install podman runc), or remove trainer.container")


def is_path_image(engine: Engine, image: str) -> bool:
    """Whether `image` names a file or folder (apptainer's SIF or sandbox), not a reference in
    the engine's store or a registry."""
    return engine == "apptainer" and "://" not in image


def image_path(image: str, base: Path) -> Path:
    """An apptainer image given as a path, made absolute from the study file's folder."""
    return Path(os.path.abspath(base / image))


def probe_prefix(section: ContainerSection, base: Path,
                 files: Sequence[Path] = ()) -> list[str]:
    """The argv before `python -c PROBE` that runs it inside the image as a trial's command
    runs there, with the study's mounts and `run_args` but no device (the interpreter probe:
    `trainer.python` and env.json's packages are read inside the image); `files` are mounted
    read-only at their paths (an accelerate config the command names)."""
    engine = section.engine or find_engine(None)[0]
    binds = [*(f"{f}:{f}:ro" for f in files), *(m.option() for m in mounts(section, base))]
    if engine == "apptainer":
        image = section.image
        if is_path_image(engine, image):
            image = str(image_path(image, base))
        return ["apptainer", "exec", "--cleanenv", *(["--bind", ",".join(binds)] if binds else []),
                *section.run_args, image]
    volumes = [a for b in binds for a in ("-v", b)]
    return [engine, "run", "--rm", *volumes, *section.run_args, section.image]


def tag_of(image: str) -> str | None:
    """The tag of a reference (`name:tag`); None when it has none (the engine reads `latest`)
    or is pinned by digest (`name@sha256:...`)."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def floats(image: str, engine: Engine) -> bool:
    """Whether `image` names a tag that moves: `latest`, or no tag at all."""
    if is_path_image(engine, image) or "@" in image:
        return False
    return tag_of(image) in (None, "latest")


def _ask_image(engine: Engine, executable: str, image: str, run: Run) -> str | None:
    """None if the engine has `image` in its store; else what is wrong, as a phrase."""
    try:
        done = run([executable, "image", "inspect", "--format", "{{.Id}}", image],
                   capture_output=True, text=True, timeout=ENGINE_TIMEOUT,
                   stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"{engine} did not answer in {ENGINE_TIMEOUT:g} s (image inspect {image})"
    except OSError as e:
        return f"cannot run {executable}: {e.strerror or e}"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
    if any(s in last.lower() for s in ("no such image", "image not known", "failed to find")):
        return (f"no image {short(image, 80)} in {engine}'s store: build or pull it first "
                f"({engine} pull {short(image, 80)}); sweep pulls nothing")
    return f"{engine} cannot be asked about images here: {short(last, 160)}"


def resolve(file: str, base: Path, owned: Sequence[Path], section: ContainerSection,
            launcher: str, runnable: bool = True, run: Run = subprocess.run,
            which: Which = shutil.which) -> ContainerSection:
    """The section with its engine found; ConfigError with every problem (one line each):
    a launcher that cannot run in a container, run_args sweep sets itself, a malformed mount
    or one outside `owned` (the study file's folder, the output folder), and, when
    `runnable`, an engine that is missing, an image that is not there (asked of the engine)
    or a mount that does not exist."""
    problems: list[Problem] = []

    def bad(key: str, message: str) -> None:
        problems.append(Problem(file, f"{KEY}.{key}" if key else KEY, message))

    if launcher == "warm":
        bad("", "launcher: warm forks trials from a server in the driver's own interpreter, "
            "which is not in the image: use launcher: accelerate, direct or python with "
            "trainer.container")
    for i, arg in enumerate(section.run_args):
        if arg.split("=", 1)[0] in OWN_OPTIONS:
            bad(f"run_args.{i}", f"{short(arg, 40)} is set by sweep for each trial "
                "(--rm, --name sweep-<study>-<trial>, in the foreground): remove it")
    roots = [Path(os.path.abspath(p)) for p in owned]
    for i, text in enumerate(section.mounts):
        try:
            mount = parse_mount(text, base)
        except ValueError as e:
            bad(f"mounts.{i}", str(e))
            continue
        real = Path(os.path.realpath(mount.host))
        if not any(real == r or r in real.parents for r in roots):
            bad(f"mounts.{i}", f"{mount.host} is outside what the study owns (its folder "
                f"{roots[0]}, its output folder): move the data under the study's folder")
        elif runnable and not mount.host.exists():
            bad(f"mounts.{i}", f"no such file or folder: {mount.host}")
    engine = section.engine
    if section.shm_size is not None and engine == "apptainer":
        bad("shm_size", "apptainer shares the host's /dev/shm: remove shm_size")
    if runnable:
        try:
            engine, executable = find_engine(section.engine, which)
        except ValueError as e:
            bad("engine", str(e))
        else:
            if is_path_image(engine, section.image):
                path = image_path(section.image, base)
                if not path.exists():
                    bad("image", f"no such image file: {path}")
            else:
                wrong = _ask_image(engine, executable, section.image, run)
                if wrong is not None:
                    bad("image", wrong)
    if problems:
        raise ConfigError.of(problems)
    return section.model_copy(update={"engine": engine})
