"""What sweep asks of the container engine (`trainer.container`): the image's digest, once
per run; the study's containers, and the removal of those whose trial is gone (the reclaim).

Every call is an argv list with a timeout; the engine is the one the study file's load found
(`spec._container_checks.resolve`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil

from sweep._core import SweepError, make_own_folder, short, write_file
from sweep.launch._container import LABEL_OUTPUT_DIR, Image, trial_of
from sweep.protocol import TRIAL_DIR_ENV
from sweep.spec import ContainerSection, Engine, image_path, is_path_image
from sweep.trial import folders

ENGINE_TIMEOUT = 60.0  # seconds for one question to the engine
Run = Callable[..., "subprocess.CompletedProcess[str]"]

_pinned: dict[tuple[str, str], Image] = {}  # (engine, ref) -> its image, for this process


class ImageError(SweepError):
    """The image cannot be resolved to a digest (gone since the study file loaded, an engine
    that does not answer): one line."""


class ImageRefused(folders.TrialFileError):
    """An attempt that would carry its lineage on in another image than the one it started
    in (`trainer.container.continue_in_other_image: false`)."""

    def __init__(self, why: str) -> None:
        super().__init__(why, OSError(errno.EPERM, why))


def _engine(container: ContainerSection) -> Engine:
    return container.engine or "podman"


def _ask(argv: list[str], run: Run) -> str:
    """The engine's answer to `argv`; ImageError with its last line of stderr if it fails."""
    try:
        done = run(argv, capture_output=True, text=True, timeout=ENGINE_TIMEOUT,
                   stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{argv[0]} did not answer in {ENGINE_TIMEOUT:g} s: "
                         f"{' '.join(argv[1:3])}") from None
    except OSError as e:
        raise ImageError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ImageError(f"{' '.join(argv[:3])} failed: {short(last, 160)}")
    return str(done.stdout)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def pin(container: ContainerSection, base: Path, run: Run = subprocess.run) -> Image:
    """The image `container.image` names now, as an ID (asked of the engine once per process
    and engine; `base`: the study file's folder, for a SIF path); ImageError if it cannot be."""
    engine = _engine(container)
    key = (engine, container.image)
    if key in _pinned:
        return _pinned[key]
    if is_path_image(engine, container.image):
        path = image_path(container.image, base)
        try:
            image = Image(container.image, _sha256(path)) if path.is_file() else Image(
                container.image, "sandbox:" + str(path))
        except OSError as e:
            raise ImageError(f"cannot read the image {path}: {e.strerror or e}") from None
    elif engine == "apptainer":
        raise ImageError(f"trainer.container.image {short(container.image, 80)}: apptainer "
                         "would fetch it anew for each trial; `apptainer pull` it into a SIF "
                         "file and name that file, which sweep pins by its SHA-256")
    else:
        fmt = "{{.Id}}\t{{.Digest}}" if engine == "podman" else \
            "{{.Id}}\t{{join .RepoDigests \",\"}}"
        out = _ask([engine, "image", "inspect", "--format", fmt, container.image], run)
        first = (out.strip().splitlines() or [""])[0]
        ident, _, digest = first.partition("\t")
        if not ident:
            raise ImageError(f"{engine} gave no ID for {short(container.image, 80)}")
        image = Image(container.image, ident if ident.startswith("sha256:") else
                      f"sha256:{ident}", digest.split(",")[0].split("@")[-1] or None)
    _pinned[key] = image
    return image


LAST_IMAGE = "image.json"  # in <output_dir>/cache/: the image the study's last run pinned


def moved_since(output_dir: Path, image: Image) -> str | None:
    """The ID the study's last run in `output_dir` pinned for the same reference, when it
    differs from `image`'s (the tag moved); None if it is the same or none is known. Records
    `image` for the next run."""
    path = output_dir / "cache" / LAST_IMAGE
    try:
        then = json.loads(path.read_text())
        before = str(then["id"]) if then.get("ref") == image.ref else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        before = None
    if before != image.id:
        try:
            make_own_folder(path.parent, folders.FOLDER_MODE)
            write_file(path, json.dumps(image.record()) + "\n", folders.FILE_MODE)
        except OSError:
            pass  # only the next run's note is lost
    return before if before is not None and before != image.id else None


def containers(container: ContainerSection, output_dir: Path,
               run: Run = subprocess.run) -> list[str]:
    """The names of every container the engine has of the study in `output_dir` (by its
    label), running or not; none for apptainer (its trials are plain processes)."""
    engine = _engine(container)
    if engine == "apptainer":
        return []
    out = _ask([engine, "ps", "--all", "--filter", f"label={LABEL_OUTPUT_DIR}={output_dir}",
                "--format", "{{.Names}}"], run)
    return [line.strip() for line in out.splitlines() if line.strip()]


def remove(container: ContainerSection, name: str, run: Run = subprocess.run) -> bool:
    """Kill and remove the container `name` (gone already counts); whether it is gone."""
    engine = _engine(container)
    argv = [engine, "rm", "--force", *(["--time", "0"] if engine == "podman" else []), name]
    try:
        done = run(argv, capture_output=True, text=True, timeout=ENGINE_TIMEOUT,
                   stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 or "no such container" in done.stderr.lower()


def trial_running(trial_dir: Path) -> bool:
    """Whether a process of this host's PID namespace (not one inside a container) runs for
    the trial in `trial_dir`: its guard, or the engine's command under it (their environment,
    as the driver set it, names the folder)."""
    try:
        mine = os.readlink("/proc/self/ns/pid")
    except OSError:
        mine = None
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TRIAL_DIR_ENV) != str(trial_dir):
                continue
            if mine is None or os.readlink(f"/proc/{proc.pid}/ns/pid") == mine:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def reclaim(container: ContainerSection, study: str, output_dir: Path,
            running: Callable[[Path], bool] = trial_running,
            run: Run = subprocess.run) -> list[str]:
    """Remove the study's containers whose trial no longer runs on this host (left by a
    driver killed with -9 together with its guards, or a kill that outran the engine's
    clean-up); the names removed. A container of a trial that still runs (another driver's,
    this one's) is left alone."""
    removed = []
    for name in containers(container, output_dir, run):
        number = trial_of(name, study)
        if number is None:
            continue
        if running(folders.trial_dir(output_dir, number)):
            continue
        if remove(container, name, run):
            removed.append(name)
    return removed
