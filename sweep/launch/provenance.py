"""What ran: a record per trial (`<trial_dir>/env.json`, and `code.patch` when the script's
git tree has uncommitted changes), with two short versions a rerun compares: `code_version`
(also a user attribute of the trial, one storage write) and `env_version` (in env.json).

What is the same for every trial of a run (the script's git state, the trainer's interpreter
and its package versions, the accelerate config, the GPU driver) is found once, when the run
starts (`RunRecord.find`: a few git calls with a timeout, one interpreter probe; the pool's
NVML session gives the GPUs and the driver); each
trial adds its devices and its exact command (`trial_record`, pure) and writes two files.
Package versions come from package metadata in the trainer's interpreter
(`sweep.spec.interpreter`), never by importing anything into the driver.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweep._core import CODE_VERSION, IMAGE, open_for_writing, write_file
from sweep.launch import _engine
from sweep.spec import ConfigFileError, Interpreter, InterpreterError, Spec, interpreter
from sweep.spec import container as containerspec
from sweep.trial import command_script, folders, launch_plan

ENV_NAME, PATCH_NAME = "env.json", "code.patch"
ENV_VERSION = "env_version"  # a key of env.json
GIT_TIMEOUT = 10.0  # seconds for each git call
UNKNOWN = "+unknown"  # a code_version's end when git could not say what differs
MAX_PATCH = 16 << 20  # bytes: a larger diff is not copied into every trial's folder
MAX_SOURCES = 200  # .py files of the script's folder read for their imports
MAX_SOURCE = 1 << 20  # bytes of each

Run = Callable[..., "subprocess.CompletedProcess[bytes]"]


@dataclass(frozen=True)
class Code:
    """The git state of the folder a script is in (`repo` its top level)."""

    repo: str
    commit: str | None  # None: a repository without commits
    branch: str | None  # None: a detached HEAD
    dirty: bool | None  # tracked files differ from the commit (staged or not); None: unknown
    patch: bytes  # `git diff HEAD --binary`: empty when clean (or over MAX_PATCH: `cut`)
    untracked: tuple[str, ...] = ()
    cut: bool = False  # the diff was larger than MAX_PATCH and is not kept
    digest: str = ""  # the whole diff's SHA-256 (also when it is not kept); "" when unknown
    unknown: str | None = None  # why git could not say what differs from the commit

    @property
    def version(self) -> str:
        """The commit's first 12 digits, `+` 8 of the diff's hash when dirty:
        `3f2a9c1b0d4e+1a2b3c4d`; `+unknown` when git could not say what differs."""
        head = (self.commit or "uncommitted")[:12]
        if self.unknown is not None:
            return f"{head}{UNKNOWN}"
        return f"{head}+{self.digest[:8]}" if self.dirty else head


def run_in_session(argv: Sequence[str], *, timeout: float,
                   env: Mapping[str, str] | None = None, stdin: int | None = None,
                   capture_output: bool = True, check: bool = False,
                   ) -> subprocess.CompletedProcess[bytes]:
    """`subprocess.run(argv, capture_output=True)` in a session of its own: on a timeout its
    whole process group is killed, so what it started (a hook git runs: a hanging
    `core.fsmonitor`) does not outlive it. `capture_output` and `check` are as `git` calls
    pass them (always captured; never checked)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=stdin, env=None if env is None else dict(env),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):  # gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _git_or_why(folder: Path, args: Sequence[str], run: Run) -> tuple[bytes | None, str]:
    """(`git -C folder ARGS`' output, or None when it fails; what failed, or "")."""
    what = f"git {args[0]}"
    try:
        done = run(["git", "-C", str(folder), *args], capture_output=True,
                   timeout=GIT_TIMEOUT, check=False, stdin=subprocess.DEVNULL,
                   env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        return None, f"{what} took longer than {GIT_TIMEOUT:g} s"
    except OSError as e:
        return None, f"{what} could not run ({e.strerror})"
    if done.returncode != 0:
        last = bytes(done.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        said = f": {last[-1][:120]}" if last else ""
        return None, f"{what} failed (exit {done.returncode}{said})"
    return bytes(done.stdout), ""


def _git(folder: Path, args: Sequence[str], run: Run) -> bytes | None:
    """`git -C folder ARGS`' output, or None when it fails (no git, not a repository)."""
    return _git_or_why(folder, args, run)[0]


def _inside(path: Path | None, repo: Path) -> str | None:
    """`path` relative to `repo`, as git names it; None when it is not in it."""
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        return None


def _new_file(repo: Path, name: str, run: Run) -> bytes:
    """An untracked file's content as a diff that `git apply` creates it from (b"" if git
    fails; `diff --no-index` exits 1 when there is a difference)."""
    try:
        done = run(["git", "-C", str(repo), "diff", "--no-index", "--binary", "--",
                    os.devnull, name], capture_output=True, timeout=GIT_TIMEOUT, check=False,
                   stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return b""
    return bytes(done.stdout) if done.returncode in (0, 1) else b""


def _text(out: bytes | None) -> str | None:
    return None if out is None else out.decode("utf-8", "replace").strip()


def git_code(folder: Path, run: Run = run_in_session, script: Path | None = None) -> Code | None:
    """The git state of `folder`; None if it is in no repository (or git is missing).

    The diff is against the commit; in a repository without commits, the staged files as new
    files, then their unstaged changes; a submodule's changes are in it as its files' diffs.
    An untracked `script` (the trainer itself) is code too: its content is in the diff, as a
    new file's. When git fails or times out on the status or the diff, what differs is
    unknown: `dirty` is None unless the status said, and `unknown` says why."""
    top = _text(_git(folder, ["rev-parse", "--show-toplevel"], run))
    if top is None:
        return None
    repo = Path(top)
    commit = _text(_git(repo, ["rev-parse", "--verify", "-q", "HEAD"], run))
    branch = _text(_git(repo, ["symbolic-ref", "-q", "--short", "HEAD"], run))
    listed, why = _git_or_why(repo, ["status", "--porcelain", "--untracked-files=normal"], run)
    status = (listed or b"").decode("utf-8", "replace").splitlines()
    untracked = tuple(line[3:] for line in status if line.startswith("??"))
    diffs = ([["diff", "HEAD", "--binary", "--submodule=diff"]] if commit else
             [["diff", "--cached", "--binary", "--submodule=diff"],
              ["diff", "--binary", "--submodule=diff"]])
    patch = b""
    for args in diffs:
        out, failed = _git_or_why(repo, args, run)
        patch += out or b""
        why = why or failed
    own = _inside(script, repo)
    if own is not None and any(own == u or (u.endswith("/") and own.startswith(u))
                               for u in untracked):  # an untracked folder is one line
        patch += _new_file(repo, own, run)
    changed = any(not line.startswith("??") for line in status)
    dirty: bool | None = bool(patch) or (not commit and changed)
    if why:
        dirty, patch = (True if changed else None), b""
    cut = len(patch) > MAX_PATCH
    return Code(str(repo), commit or None, branch or None, dirty, b"" if cut else patch,
                untracked[:100], cut, "" if why else hashlib.sha256(patch).hexdigest(),
                why or None)


def script_imports(folder: Path) -> list[str]:
    """The top-level modules the .py files of `folder` import (not recursive, at most
    `MAX_SOURCES` files), less the standard library and the folder's own modules."""
    names: set[str] = set()
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".py")[:MAX_SOURCES]
        own = {p.stem for p in folder.iterdir()}
    except OSError:
        return []
    for path in files:
        try:
            if path.stat().st_size > MAX_SOURCE:
                continue
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(names - set(sys.stdlib_module_names) - own - {"__future__"})


@dataclass(frozen=True)
class RunRecord:
    """What every trial of one run shares (see the module's docstring)."""

    host: str
    code: Code | None
    python: Interpreter | None
    python_error: str | None = None  # why the interpreter could not be asked
    accelerate: dict[str, Any] | None = None  # the config file used, and its merged content
    gpus: dict[int, dict[str, str | None]] = field(default_factory=dict)  # index -> name, uuid
    driver: str | None = None  # the GPU driver's version (NVML)
    cuda: str | None = None  # the CUDA version it supports (NVML)
    # trainer.container's image as pinned for the run (ref, id, digest; or an error)
    image: dict[str, str | None] | None = None

    @classmethod
    def find(cls, spec: Spec, accelerate: dict[str, Any] | None,
             gpus: Mapping[int, Mapping[str, str | None]] | None = None,
             host: str | None = None, system: tuple[str | None, str | None] = (None, None),
             run: Run = run_in_session) -> RunRecord:
        """The record of a run of `spec` starting now: git (`run` runs it), the interpreter
        probe; `accelerate` the config it launches with (`make.accelerate_record`);
        `gpus` (index -> name, uuid) and `system` (the GPU driver's and CUDA's versions:
        `Nvml.system`) as the pool's NVML session knows them."""
        folder = _code_folder(spec)
        python = launch_plan.trial_python(spec)
        inside = spec.trainer.container  # then the interpreter is the image's, asked there
        prefix = () if inside is None else containerspec.probe_prefix(inside,
                                                                         spec.source.parent)
        try:
            found: Interpreter | None = interpreter.probe(python, modules=script_imports(folder),
                                                          prefix=prefix)
            error = None
        except InterpreterError as e:
            found, error = None, str(e)
        image: dict[str, str | None] | None = None
        if inside is not None:
            try:
                image = _engine.pin(inside, spec.source.parent).record()
            except _engine.ImageError as e:
                image = {"ref": inside.image, "id": None, "error": str(e)}
        devices = {int(k): dict(v) for k, v in (gpus or {}).items()}
        return cls(host or socket.gethostname(), git_code(folder, run, spec.trainer.script),
                   found, error,
                   accelerate, devices, *system, image=image)

    def software(self) -> dict[str, Any]:
        """What `env_version` hashes: the interpreter, its packages, the accelerate config."""
        py = self.python
        return {"python": None if py is None else [py.executable, py.version],
                "packages": None if py is None else {**py.packages, **py.modules},
                "accelerate": None if self.accelerate is None else self.accelerate["config"],
                **({} if self.image is None else {"image": self.image.get("id")})}

    @functools.cached_property
    def env_version(self) -> str:
        """12 digits of the hash of `software` (found once: each trial's env.json has it)."""
        text = json.dumps(self.software(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def attrs(self) -> dict[str, str]:
        """The user attributes of each trial of the run: `code_version`, when the script is
        in a git repository, and `image`, the ID of `trainer.container`'s image (each
        attribute is a storage write: `env_version` stays in env.json)."""
        attrs = {} if self.code is None else {CODE_VERSION: self.code.version}
        if self.image is not None and self.image.get("id"):
            attrs[IMAGE] = str(self.image["id"])
        return attrs

    def versions(self) -> dict[str, str | None]:
        """What a new trial would run with, as `differences` compares it."""
        return {CODE_VERSION: None if self.code is None else self.code.version,
                ENV_VERSION: self.env_version}


def _code_folder(spec: Spec) -> Path:
    """The folder whose git state is the trainer's code: the script's, else (a module) the
    driver's working folder, from which `python -m` imports it."""
    script = spec.trainer.script
    return Path(script).parent if script is not None else Path.cwd()


def accelerate_record(spec: Spec) -> dict[str, Any]:
    """The accelerate config trials of `spec` launch with: the study's file and the merged
    config, or sweep's own (for launchers that run accelerate: `make.accelerate_record`
    says which)."""
    try:
        config, merged = launch_plan.launch_config(spec)
    except ConfigFileError as e:  # gone since the trial ran (a rerun's comparison)
        return {"file": str(spec.trainer.accelerate.config_file), "error": str(e),
                "config": None}
    source = spec.trainer.accelerate.config_file
    return {"file": None if source is None else str(source), "used": str(config.path),
            "config": merged.config if merged is not None else yaml.safe_load(
                launch_plan.ACCELERATE_CONFIG)}


def trial_record(run: RunRecord, number: int, devices: Sequence[int], command: str,
                 cwd: str) -> dict[str, Any]:
    """A trial's env.json (pure): the run's record, the trial's devices and command."""
    code = run.code
    py = run.python
    return {
        "trial": number,
        "code": None if code is None else {
            "repo": code.repo, "commit": code.commit, "branch": code.branch,
            "dirty": code.dirty, "untracked": list(code.untracked),
            "patch": PATCH_NAME if code.dirty and code.patch else None,
            "patch_too_large": code.cut, CODE_VERSION: code.version,
            **({"unknown": f"{code.unknown}: what differs from the commit is unknown"}
               if code.unknown else {})},
        "python": {"executable": py.executable, "prefix": py.prefix,
                   "version": py.version} if py is not None else {"error": run.python_error},
        "packages": {**py.packages, **py.modules} if py is not None else {},
        "accelerate": run.accelerate,
        "gpus": [{"index": d, **run.gpus.get(d, {"name": None, "uuid": None})}
                 for d in devices],
        "gpu_driver": run.driver, "cuda": run.cuda,
        "host": run.host, "cwd": cwd, "command": command,
        **({} if run.image is None else {"image": run.image}),
        CODE_VERSION: None if code is None else code.version, ENV_VERSION: run.env_version,
    }


def write_trial(run: RunRecord, plan: launch_plan.LaunchPlan, number: int, devices: Sequence[int],
                secrets: Mapping[str, str]) -> None:
    """Write the trial's env.json (and code.patch when the code is dirty) into its folder;
    TrialFileError (naming the path) if it cannot."""
    paths = plan.paths
    command = command_script.command_script(plan, secrets).rstrip("\n").splitlines()[-1]
    record = trial_record(run, number, devices, command, str(plan.cwd or Path.cwd()))
    try:
        write_file(paths.dir / ENV_NAME, json.dumps(record, indent=1) + "\n",
                   folders.FILE_MODE)
        if run.code is not None and run.code.dirty and run.code.patch:
            fd = open_for_writing(paths.dir / PATCH_NAME, folders.FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(run.code.patch)
    except OSError as e:
        raise folders.TrialFileError(folders.cannot(e, paths.dir), e) from e


def recorded(user_attrs: Mapping[str, Any], trial_dir: str | None) -> dict[str, Any]:
    """The versions a trial ran with: its `code_version` attribute, and the `env_version` of
    its env.json in `trial_dir` when that can be read (else None: not compared)."""
    env = None
    if trial_dir:
        try:
            env = json.loads((Path(trial_dir) / ENV_NAME).read_text()).get(ENV_VERSION)
        except (OSError, ValueError, AttributeError):
            env = None
    return {CODE_VERSION: user_attrs.get(CODE_VERSION), ENV_VERSION: env}


def differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """What differs between the versions a trial ran with (`recorded`) and those a new
    trial would run with (`RunRecord.versions`), as one phrase; None if nothing (or `then`
    recorded nothing: a trial of an older sweep)."""
    said = []
    old, new = then.get(CODE_VERSION), now.get(CODE_VERSION)
    if old is not None and UNKNOWN in (str(old)[-len(UNKNOWN):], str(new)[-len(UNKNOWN):]):
        said.append(f"the code cannot be compared (it ran {old}, now {new}: git could not "
                    "say what differed from the commit)")
    elif old is not None and old != new:
        said.append(f"the code differs (it ran {old}, now {new or 'no git repository'})")
    if then.get(ENV_VERSION) is not None and then.get(ENV_VERSION) != now.get(ENV_VERSION):
        said.append("the environment differs (interpreter, package versions or accelerate "
                    "config)")
    return " and ".join(said) or None
