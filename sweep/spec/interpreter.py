"""The trainer's interpreter (`trainer.python`, else the driver's own), asked about itself.

One run of `python -c PROBE` answers what sweep needs to know of the interpreter trials run
with, without importing any of it into the driver: its real executable and version, the
versions of torch, accelerate, optuna and deepspeed (from package metadata, and None for one
that `importlib.util.find_spec` does not find: nothing is imported), which
distributions provide given top-level modules, and, when asked (`keys=True`: accelerate is
imported there, a few seconds), the keys accelerate's own `ClusterConfig` takes in a config
file and the values of its public enums (`accelerate.utils.DistributedType`, `PrecisionType`,
`DynamoBackend`). Answers are kept per (interpreter, question) for the life of the process.
The probe runs in its own session, for at most PROBE_TIMEOUT seconds; on a timeout or an
interruption its whole process group is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

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
if ask["modules"]:
    owners = metadata.packages_distributions()
    for module in ask["modules"]:
        for dist in owners.get(module, []):
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
    """The interpreter cannot be run, or does not answer: the message says why."""


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
    try:  # its own session: what it starts is killed with it, and no terminal signal reaches it
        proc = subprocess.Popen([*prefix, python, "-c", PROBE, question], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    except OSError as e:
        raise InterpreterError(f"cannot run {python}: {e.strerror or e}") from None
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise InterpreterError(f"{python} did not answer in {limit:g} s (a program that "
                               "hangs, not a Python?)") from None
    except BaseException:  # Ctrl-C, SIGTERM: the probe does not outlive the driver
        _kill_group(proc)
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
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
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise InterpreterError(f"{python} is not a working Python (exit {done.returncode}: "
                               f"{last[:160]})") from None
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


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill `proc`'s whole process group (its session: `probe` started it so) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        pass
    proc.communicate()


def driver_python() -> str:
    """The driver's own interpreter: what trials run with unless `trainer.python` is set."""
    return sys.executable
