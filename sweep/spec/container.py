"""`trainer.container`: the image trials run in, as a section of the study file and as the
argv that runs a command in it.

A study with `trainer.container` runs each trial's command (`accelerate launch`, or the
trainer's `python`) inside a container of `image`, started by `engine` (podman, docker or
apptainer: the first found on PATH when not given). Here are the section and what is read from
it (its mounts, its size, its image's tag), the engine found on PATH, the argv that runs the
interpreter probe of `trainer.python` inside the image (`probe_prefix`: whether the engine can
run a container here at all is asked that way, as the study file loads) and what its failure
says. What is checked as the file loads is `_container_checks.resolve`.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from sweep._core import clip, short
from sweep.spec.searchspace import Section

Engine = Literal["podman", "docker", "apptainer"]
ENGINES: tuple[Engine, ...] = ("podman", "docker", "apptainer")  # the order PATH is searched
DEFAULT_PYTHON = "python3"  # the interpreter inside the image unless trainer.python names one
KEY = "trainer.container"
DOCS = "docs/how-to/containers.md"

Which = Callable[[str], "str | None"]

# --shm-size as podman and docker read it (go-units' RAMInBytes): a number, then an optional
# binary unit, `i` and `b` (16g, 1.5g, 16GiB, 512 m, 100b); anything else they refuse
SIZE = re.compile(r"(\d+(?:\.\d+)?) ?([kmgtp])?i?b?", re.IGNORECASE | re.ASCII)
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def size_bytes(text: str) -> int:
    """`text` in bytes, read as podman and docker read `--shm-size`; ValueError saying what
    is wrong where they would refuse it."""
    match = SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{short(text, 40)!r} is not a size podman or docker take: give a "
                         "number and a unit k, m, g or t, e.g. 16g or 1.5g")
    return int(float(match[1]) * UNITS[(match[2] or "").lower()])


def _size(text: str) -> str:
    size_bytes(text)
    return text




class ContainerSection(Section, BaseModel):  # BaseModel named: ruff knows a pydantic model
    """`trainer.container` of the study file."""

    image: Annotated[str, Field(min_length=1)]
    engine: Engine | None = None  # None: the first of ENGINES on PATH (filled by `resolve`)
    run_args: list[str] = []  # more options of `ENGINE run` (before the image)
    # extra folders, `HOST[:TARGET][:ro]`, HOST relative to the study file's folder
    mounts: list[Annotated[str, Field(min_length=1)]] = []
    shm_size: Annotated[str, AfterValidator(_size)] | None = None  # as the engine takes it
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
    runs there, with the study's mounts, `shm_size` and `run_args` but no device (the
    interpreter probe: `trainer.python` and env.json's packages are read inside the image);
    `files` are mounted read-only at their paths (an accelerate config the command names)."""
    engine = section.engine or find_engine(None)[0]
    binds = [*(f"{f}:{f}:ro" for f in files), *(m.option() for m in mounts(section, base))]
    if engine == "apptainer":
        image = section.image
        if is_path_image(engine, image):
            image = str(image_path(image, base))
        return ["apptainer", "exec", "--cleanenv", *(["--bind", ",".join(binds)] if binds else []),
                *section.run_args, image]
    volumes = [a for b in binds for a in ("-v", b)]
    shm = ["--shm-size", section.shm_size] if section.shm_size is not None else []
    return [engine, "run", "--rm", *volumes, *shm, *section.run_args, section.image]


def engine_line(stderr: str) -> str:
    """The engine's last line of `stderr`, whole (its `time=... level=error msg="..."` log
    form read to its message), or "no answer"."""
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else "no answer"
    logged = re.search(r'level=\w+ msg="((?:[^"\\]|\\.)*)"', last)
    if logged:
        last = re.sub(r"\\(.)", r"\1", logged[1])
    return clip(last)


# what podman says when its configuration does not fit this host (what CONTAINERS_CONF fixes:
# its containers.conf, the default runtime's cgroups, the default ulimits)
CONFIGURED = re.compile(r"CONTAINERS_CONF|containers\.conf|rlimit|cgroups? in hybrid mode",
                        re.IGNORECASE)


def probe_failure(section: ContainerSection, python: str, code: int | None, said: str,
                  why: str) -> str:
    """Why the interpreter probe inside the image failed, in one line that says what to do:
    `code` the engine's exit code (None: it did not exit, `why` says what happened), `said`
    its last line (podman's configuration is named only where `said` is about it:
    CONFIGURED)."""
    engine, image = section.engine or "the engine", short(section.image, 80)
    if engine in ("podman", "docker") and code == 127:
        return (f"no {python} in the image {image} ({engine} exit 127: {said}): set "
                "trainer.python to the image's Python")
    if engine in ("podman", "docker") and code in (125, 126):
        how = " (CONTAINERS_CONF, a runtime and ulimits that work here)" \
            if engine == "podman" and CONFIGURED.search(said) else ""
        return (f"{engine} could not start {python} in a container of the image {image} "
                f"(exit {code}: {said}): where {engine} cannot run containers with its "
                f"defaults, see {DOCS}{how}")
    return (f"cannot run {python} in the image {image} with {engine}: {why} (does {engine} run "
            f"containers here, and the image have that Python: trainer.python?); see {DOCS}")


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
