"""The trainer's interpreter (`trainer.python`, else the driver's own), asked about itself.

One run of `python -c PROBE` answers what sweep needs to know of the interpreter trials run
with, without importing any of it into the driver: its real executable and version, the
versions of torch, accelerate, optuna and deepspeed (from package metadata, and None for one
that `importlib.util.find_spec` does not find: nothing is imported), which
distributions provide given top-level modules (the distribution of the module's own name when
its files hold the module; otherwise every distribution that installs it, from a scan of all
of them), and, when asked (`keys=True`: accelerate is
imported there, a few seconds), the keys accelerate's own `ClusterConfig` takes in a config
file and the values of its public enums (`accelerate.utils.DistributedType`, `PrecisionType`,
`DynamoBackend`). Answers are kept per (interpreter, question) for the life of the process.
The probe runs in its own session, for at most PROBE_TIMEOUT seconds, and at most the last
MAX_OUTPUT bytes of each of its streams are kept; once it has answered, and on a timeout or an
interruption, its whole process group is killed, and so is every process whose environment
carries the probe's own token (`PROBE_TOKEN_ENV`): a daemon it started in a session of its own
(`setsid`) does not outlive it either.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from sweep._core import clip, stops

# Run as `python -c PROBE QUESTION_JSON`: prints one JSON line.
PROBE = r"""
import json, sys, importlib.util
from importlib import metadata
ask = json.loads(sys.argv[1])
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def importable(name):  # found, not imported: metadata left by a broken install is not enough
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
out = {"executable": sys.executable, "prefix": sys.prefix,
       "version": ".".join(map(str, sys.version_info[:3])),
       "packages": {n: version(n) if importable(n) else None
                    for n in ("torch", "accelerate", "optuna", "deepspeed")},
       "modules": {}, "keys": None, "choices": None}
def owner(module):  # the distribution of the module's name, if it holds the module's files
    try:
        spec = importlib.util.find_spec(module)
        dist = metadata.distribution(module)
    except (ImportError, ValueError, metadata.PackageNotFoundError):
        return None
    if spec is None or spec.origin is None:  # not found, or a namespace package: shared
        return None
    listed = dist.read_text("top_level.txt") or dist.read_text("RECORD") or ""
    top = {line.split(",")[0].split("/")[0] for line in listed.splitlines()}
    return dist.metadata["Name"] if module in top or module + ".py" in top else None
owners = None  # every distribution's top-level modules: a scan of all, only when needed
for module in ask["modules"]:
    found = owner(module)
    if found is None:
        owners = metadata.packages_distributions() if owners is None else owners
    for dist in [found] if found is not None else owners.get(module, []):
        out["modules"][dist] = version(dist)
if ask["keys"] and out["packages"]["accelerate"]:
    import dataclasses
    from accelerate.commands.config.config_args import ClusterConfig
    out["keys"] = sorted(f.name for f in dataclasses.fields(ClusterConfig))
    from accelerate.utils import DistributedType, DynamoBackend, PrecisionType
    out["choices"] = {"distributed_type": [e.value for e in DistributedType],
                      "mixed_precision": [e.value for e in PrecisionType],
                      "dynamo_backend": [e.value for e in DynamoBackend]}
print(json.dumps(out))
"""


class InterpreterError(Exception):
    """The interpreter cannot be run, or does not answer: the message says why; `code` its
    exit code and `stderr` the end of its errors, where it ran and exited."""

    def __init__(self, message: str, code: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.code, self.stderr = code, stderr


@dataclass(frozen=True)
class Interpreter:
    """What an interpreter said of itself (see the module's docstring)."""

    executable: str
    prefix: str
    version: str
    packages: dict[str, str | None] = field(default_factory=dict)  # torch, accelerate, ...
    modules: dict[str, str | None] = field(default_factory=dict)  # distributions asked for
    keys: tuple[str, ...] | None = None  # accelerate's ClusterConfig fields, if asked
    # with `keys`: the values accelerate's enums take (distributed_type, mixed_precision,
    # dynamo_backend)
    choices: dict[str, tuple[str, ...]] | None = None

    def has(self, package: str) -> bool:
        return self.packages.get(package) is not None


# Seconds the probe may take (importing accelerate for `keys` takes a few); past them its
# whole process group is killed: a `trainer.python` that hangs is refused, not waited for.
PROBE_TIMEOUT = 30.0
PROBE_TOKEN_ENV = "SWEEP_PROBE_TOKEN"  # set for the probe only: what it started carries it
MAX_OUTPUT = 4 << 20  # bytes of each of the probe's streams kept (the last ones: its answer)

_known: dict[tuple[str, bool, tuple[str, ...], tuple[str, ...]], Interpreter] = {}


def probe(python: str, keys: bool = False, modules: Sequence[str] = (),
          timeout: float | None = None, prefix: Sequence[str] = ()) -> Interpreter:
    """Ask `python` about itself (see the module's docstring); InterpreterError if it cannot
    be run or does not answer within `timeout` seconds (PROBE_TIMEOUT if None). `prefix`:
    the argv that runs it elsewhere (inside a container image: `python` is the image's)."""
    key = (python, keys, tuple(sorted(modules)), tuple(prefix))
    if key in _known:
        return _known[key]
    if not prefix:  # with one, the interpreter is not on this filesystem: running it tells
        _check_file(python)
    limit = PROBE_TIMEOUT if timeout is None else timeout
    question = json.dumps({"keys": keys, "modules": sorted(modules)})
    token = uuid.uuid4().hex
    proc: subprocess.Popen[bytes] | None = None
    try:
        # its own session: what it starts is killed with it, and no terminal signal reaches
        # it; a stop signal while it starts comes once `proc` is bound, to be killed below
        with stops.deferred():
            try:
                proc = subprocess.Popen(
                    [*prefix, python, "-c", PROBE, question], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                    env={**os.environ, PROBE_TOKEN_ENV: token})
            except OSError as e:
                raise InterpreterError(f"cannot run {python}: {e.strerror or e}") from None
        out, err = _read_bounded(proc, limit)
    except subprocess.TimeoutExpired:
        raise InterpreterError(f"{python} did not answer in {limit:g} s (a program that "
                               "hangs, not a Python?)") from None
    finally:  # also on Ctrl-C, SIGTERM, and when it answered: nothing it started outlives it
        if proc is not None:
            with stops.deferred():  # a second stop signal comes once the group is killed
                _kill_group(proc, token)
    done = subprocess.CompletedProcess(proc.args, proc.returncode,
                                       out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))
    try:
        if done.returncode != 0:
            raise ValueError
        data = json.loads(done.stdout.strip().splitlines()[-1])
        found = Interpreter(str(data["executable"]), str(data["prefix"]), str(data["version"]),
                            dict(data["packages"]), dict(data["modules"]),
                            None if data["keys"] is None else tuple(data["keys"]),
                            None if data["choices"] is None else {
                                str(k): tuple(map(str, v)) for k, v in data["choices"].items()})
    except (ValueError, IndexError, KeyError, TypeError):
        last = clip((done.stderr.strip().splitlines() or ["no answer"])[-1])
        raise InterpreterError(f"{python} is not a working Python (exit {done.returncode}: "
                               f"{last})", done.returncode, done.stderr[-4096:]) from None
    _known[key] = found
    return found


def _check_file(python: str) -> None:
    """InterpreterError unless `python` is an executable file."""
    if os.path.isdir(python):
        raise InterpreterError(f"{python} is a folder, not an interpreter")
    if not os.path.isfile(python):
        raise InterpreterError(f"no such file: {python}")
    if not os.access(python, os.X_OK):
        raise InterpreterError(f"not executable: {python}")


def _read_bounded(proc: subprocess.Popen[bytes], limit: float) -> tuple[bytes, bytes]:
    """The last MAX_OUTPUT bytes of `proc`'s stdout and stderr, read until it has exited (what
    it left behind may hold the pipes open: they are not waited for) or `limit` seconds have
    passed (TimeoutExpired). `proc` is left unreaped, so that its group id stays its own
    until `_kill_group`."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        for pipe in kept:
            sel.register(pipe, selectors.EVENT_READ)
        while True:
            exited = _exited(proc)
            left = deadline - time.monotonic()
            if left <= 0 and not exited:
                raise subprocess.TimeoutExpired(proc.args, limit)
            if not sel.get_map():  # both streams closed: it is about to exit
                if exited:
                    break
                time.sleep(0.01)
                continue
            ready = sel.select(timeout=0 if exited else min(left, 0.2))
            if exited and (not ready or left <= 0):
                break  # exited, and nothing more to read now (or a child of it writes on)
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buffer = kept[key.fileobj]  # type: ignore[index]
                buffer += chunk
                del buffer[:-MAX_OUTPUT]
    return bytes(kept[proc.stdout]), bytes(kept[proc.stderr])


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether `proc` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def _kill_group(proc: subprocess.Popen[bytes], token: str) -> None:
    """Kill `proc`'s whole process group (its session: `probe` started it so) and every
    process of this user whose environment carries `token` (one that left the group), reap
    it and close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        pass
    for other in psutil.process_iter():
        try:
            if other.pid != os.getpid() and other.environ().get(PROBE_TOKEN_ENV) == token:
                other.kill()
        except psutil.Error:  # gone, or another user's
            continue
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def driver_python() -> str:
    """The driver's own interpreter: what trials run with unless `trainer.python` is set."""
    return sys.executable
