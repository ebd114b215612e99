"""`trainer.container` checked as the study file loads (`resolve`), before anything is written.

What can be checked without running a trial: the engine is there, the image is in its store
(asked of the engine), every extra mount lies inside what the study owns (the study file's
folder, `study.output_dir`), no path sweep mounts has a `:` or `,` (the engine's mount and
filter options split on them), `run_args` set nothing sweep sets for each trial and mount
nothing over what sweep mounts (`_runargs`), `shm_size` is a size the engine takes and the host
has. Whether the engine can run a container here at all is asked by the interpreter probe of
`trainer.python` inside the image (`container.probe_prefix`), which the study file's load runs
too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sweep._core import ConfigError, Problem, short
from sweep.spec import _runargs
from sweep.spec.container import (
    DOCS,
    KEY,
    ContainerSection,
    Engine,
    Which,
    engine_line,
    find_engine,
    image_path,
    is_path_image,
    parse_mount,
    size_bytes,
)

ENGINE_TIMEOUT = 30.0  # seconds for one question to the engine (image inspect)
Run = Callable[..., "subprocess.CompletedProcess[str]"]
SEPARATORS = (":", ",")  # split a mount option (HOST:TARGET:OPTIONS, apptainer's A,B), a filter


def host_memory() -> int | None:
    """This host's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def gib(size: int) -> str:
    """`size` bytes in GiB, as `free -g` and the engines' units count them."""
    value = size / (1 << 30)
    return f"{value:.3g} GiB" if value < 1000 else f"{value:,.0f} GiB"


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
    last = engine_line(done.stderr)
    if any(s in last.lower() for s in ("no such image", "image not known", "failed to find")):
        return (f"no image {short(image, 80)} in {engine}'s store: build or pull it first "
                f"({engine} pull {short(image, 80)}); sweep pulls nothing")
    where = f" (see {DOCS})" if engine == "podman" else ""  # which says podman's settings
    return f"{engine} cannot be asked about images here: {last}{where}"


@dataclass(frozen=True)
class Mounted:
    """What sweep mounts from the host into each trial's container, at the same paths: the
    study's folder, each trial's folder and checkpoints in `output_dir` (and the merged
    accelerate config there), the `files` the command names (mounted on their own where
    they lie outside those folders); and the working folder the command runs in. Each file
    as (key of the study file, what it is, its path)."""

    study_dir: Path
    output_dir: Path
    files: tuple[tuple[str, str, Path], ...] = ()
    workdir: Path | None = None  # trainer.workdir, when it names one folder for every trial

    def folders(self) -> list[tuple[str, str, Path]]:
        """The folders sweep mounts whole (key, what, path): the study's folder and the
        output folder (trials and checkpoints)."""
        return [("trainer.container", "the study's folder", _norm(self.study_dir)),
                ("study.output_dir", "the study's output folder", _norm(self.output_dir))]

    def mounted(self) -> list[tuple[str, str, Path]]:
        """The host paths sweep mounts (key, what, path): `folders`, then the files outside
        both."""
        folders = self.folders()
        return folders + [(k, w, _norm(p)) for k, w, p in self.files
                          if not any(_within(_norm(p), f) for _, _, f in folders)]

    def needed(self) -> list[tuple[str, Path]]:
        """What a trial needs to see from the host (what, path)."""
        workdir = [("the working folder", _norm(self.workdir))] if self.workdir else []
        return [*((w, p) for _, w, p in self.folders()),
                *((w, _norm(p)) for _, w, p in self.files), *workdir]


def _norm(path: Path | str) -> Path:
    return Path(os.path.normpath(os.path.abspath(path)))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def separator_in(path: Path) -> str | None:
    """The first of SEPARATORS in `path` (None: it can be mounted)."""
    return next((c for c in SEPARATORS if c in str(path)), None)


CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a line break, a tab...: no one-line error shows it


def control_in(text: str) -> str | None:
    """The first control character in `text` (a line break...), None if none."""
    found = CONTROL.search(text)
    return found[0] if found else None


def escaped(text: str | Path) -> str:
    """`text` with its control characters written as Python writes them (`\\n`): on one
    line."""
    return CONTROL.sub(lambda m: repr(m[0])[1:-1], str(text))


def shadowed(target: str, host: str | None, mounted: Mounted) -> str | None:
    """What a mount at `target` in the container (showing `host`, a host path; None: a
    volume or a tmpfs) hides of what sweep mounts, as "what PATH"; None if nothing: it
    lands outside sweep's mounts, above them (the engine mounts the deeper ones over it),
    or shows a host folder at its own path (`mounts: [data]`)."""
    if not target.startswith("/"):
        return None
    at = _norm(target)
    if host is not None and os.path.realpath(host) == os.path.realpath(at):
        return None
    output_dir = _norm(mounted.output_dir)
    if _within(at, output_dir):
        return f"the study's output folder {output_dir} (each trial's folder and checkpoints)"
    sources = [p for _, _, p in mounted.mounted()]
    for what, path in mounted.needed():
        through = [f for f in sources if _within(path, f)]  # the mounts that show it
        if _within(path, at) and any(_within(at, f) for f in through):
            return f"{what} {path}"
    return None


def _before_a_trial(file: str, mounted: Mounted, section: ContainerSection,
                    found: Engine | None, read: Callable[[Path], str]) -> list[Problem]:
    """What would fail each trial or the run's end in the container (`found`: the engine,
    None if not found: read as podman): a path sweep mounts with one of SEPARATORS or a
    control character (said once, for the outermost), `run_args` that set what sweep sets
    (an `--env-file`, `read` from the study's folder, that sets a variable picking the
    devices too) or mount over what it mounts."""
    problems: list[Problem] = []
    said: list[Path] = []
    engine: Engine = found or "podman"
    for key, what, path in mounted.mounted():
        c = separator_in(path)
        odd = control_in(str(path))
        if (c or odd) is None or any(_within(path, p) for p in said):
            continue
        said.append(path)
        problems.append(Problem(file, key, f"{what} {escaped(path)} has a {odd!r}, which no "
                                "line of a log or an error can show: use a path without one"
                                if odd else
                                f"{what} {path} has a {c!r}, which {found or 'the engine'} "
                                "cannot mount (its mount and filter options split on ':' and "
                                "','): use a path without ':' or ','"))
    parsed = _runargs.options(section.run_args, engine)
    for i in range(len(section.run_args)):
        own = [(o, why) for o in parsed if o.index == i
               and (why := _runargs.own(o, engine)) is not None]
        if own:
            flags = [_runargs.shown(o) for o, _ in own]
            shown = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"
            problems.append(Problem(
                file, f"{KEY}.run_args.{i}", f"{escaped(short(own[0][0].text, 60))}: sweep sets "
                f"{escaped(shown)} for each trial ({'; '.join(why for _, why in own)}): "
                "remove it"))
    for option in parsed:
        if option.name != "--env-file" or not option.value:
            continue
        try:
            sets = _runargs.env_file_pins(read(mounted.study_dir / option.value))
        except (OSError, UnicodeDecodeError):
            continue  # the engine says what is wrong with it
        if sets is not None:
            problems.append(Problem(
                file, f"{KEY}.run_args.{option.index}", f"{escaped(short(option.text, 200))}: "
                f"the file sets {sets}, which sweep sets for each trial "
                f"({_runargs.OWN['--gpus']}): remove it from the file"))
    for option in parsed:
        for target in _runargs.mounts(option, engine):
            hidden = shadowed(target.path, target.host, mounted)
            if hidden is not None:
                problems.append(Problem(
                    file, f"{KEY}.run_args.{option.index}", f"{escaped(short(option.text, 200))} "
                    f"mounts over {hidden}, which sweep mounts from the host for each trial: "
                    "mount it at another path"))
    return problems


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def resolve(file: str, mounted: Mounted, section: ContainerSection, launcher: str,
            runnable: bool = True, run: Run = subprocess.run, which: Which = shutil.which,
            memory: Callable[[], int | None] = host_memory,
            read: Callable[[Path], str] = _read_text) -> ContainerSection:
    """The section with its engine found; ConfigError with every problem (one line each):
    a launcher that cannot run in a container, a malformed mount or one outside the study's
    folder and output folder; and, when `runnable`, an engine that is missing, an image that
    is not there (asked of the engine), a mount that does not exist or that lands over what
    sweep mounts, a `shm_size` larger than the host's `memory`, and what `_before_a_trial`
    finds."""
    problems: list[Problem] = []
    base = mounted.study_dir

    def bad(key: str, message: str) -> None:
        problems.append(Problem(file, f"{KEY}.{key}" if key else KEY, message))

    if launcher == "warm":
        bad("", "launcher: warm forks trials from a server in the driver's own interpreter, "
            "which is not in the image: use launcher: accelerate, direct or python with "
            "trainer.container")
    engine, executable = section.engine, None
    if runnable:
        try:
            engine, executable = find_engine(section.engine, which)
        except ValueError as e:
            bad("engine", str(e))
    if runnable:  # what would fail each trial (a study that ran before is still read)
        problems += _before_a_trial(file, mounted, section, engine, read)
    roots = [_norm(mounted.study_dir), _norm(mounted.output_dir)]
    for i, text in enumerate(section.mounts):
        try:
            mount = parse_mount(text, base)
        except ValueError as e:
            bad(f"mounts.{i}", str(e))
            continue
        odd = control_in(text) or ("," if engine == "apptainer" and "," in text else None)
        if runnable and odd is not None:
            bad(f"mounts.{i}", f"{short(text, 60)!r} has a {odd!r}, which " + (
                "apptainer's --bind splits its mounts on" if odd == "," else
                "no line of a log or an error can show") + ": name a path without one")
            continue
        real = Path(os.path.realpath(mount.host))
        hidden = shadowed(mount.target, str(mount.host), mounted) if runnable else None
        if not any(real == r or r in real.parents for r in roots):
            bad(f"mounts.{i}", f"{mount.host} is outside what the study owns (its folder "
                f"{roots[0]}, its output folder): move the data under the study's folder")
        elif hidden is not None:
            bad(f"mounts.{i}", f"{short(text, 200)} mounts over {hidden}, which sweep mounts "
                "from the host for each trial: give another TARGET")
        elif runnable and not mount.host.exists():
            bad(f"mounts.{i}", f"no such file or folder: {mount.host}")
    if section.shm_size is not None and engine == "apptainer":
        bad("shm_size", "apptainer shares the host's /dev/shm: remove shm_size")
    elif section.shm_size is not None and runnable:
        size, have = size_bytes(section.shm_size), memory()
        if have is not None and size > have:
            bad("shm_size", f"{section.shm_size} is {gib(size)}, more than this host's memory "
                f"({gib(have)}), where /dev/shm lives: give at most {gib(have)}")
    if engine is not None and executable is not None:
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
