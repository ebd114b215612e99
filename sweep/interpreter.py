"""The trainer's interpreter (`trainer.python`, else the driver's own), asked about itself.

One run of `python -c PROBE` answers what sweep needs to know of the interpreter trials run
with, without importing any of it into the driver: its real executable and version, the
versions of torch, accelerate, optuna and deepspeed (from package metadata), which
distributions provide given top-level modules, and, when asked (`keys=True`: accelerate is
imported there, a few seconds), the keys accelerate's own `ClusterConfig` takes in a config
file. Answers are kept per (interpreter, question) for the life of the process.
"""

from __future__ import annotations

import json
import os
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
out = {"executable": sys.executable, "prefix": sys.prefix,
       "version": ".".join(map(str, sys.version_info[:3])),
       "packages": {n: version(n) for n in ("torch", "accelerate", "optuna", "deepspeed")},
       "modules": {}, "keys": None}
if ask["modules"]:
    owners = metadata.packages_distributions()
    for module in ask["modules"]:
        for dist in owners.get(module, []):
            out["modules"][dist] = version(dist)
if ask["keys"] and out["packages"]["accelerate"]:
    import dataclasses
    from accelerate.commands.config.config_args import ClusterConfig
    out["keys"] = sorted(f.name for f in dataclasses.fields(ClusterConfig))
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

    def has(self, package: str) -> bool:
        return self.packages.get(package) is not None


_known: dict[tuple[str, bool, tuple[str, ...]], Interpreter] = {}


def probe(python: str, keys: bool = False, modules: Sequence[str] = (),
          timeout: float = 120.0) -> Interpreter:
    """Ask `python` about itself (see the module's docstring); InterpreterError if it cannot
    be run or does not answer."""
    key = (python, keys, tuple(sorted(modules)))
    if key in _known:
        return _known[key]
    if not os.path.isfile(python):
        raise InterpreterError(f"no such file: {python}")
    if not os.access(python, os.X_OK):
        raise InterpreterError(f"not executable: {python}")
    question = json.dumps({"keys": keys, "modules": sorted(modules)})
    try:
        done = subprocess.run([python, "-c", PROBE, question], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InterpreterError(f"cannot run {python}: {e}") from None
    try:
        if done.returncode != 0:
            raise ValueError
        data = json.loads(done.stdout.strip().splitlines()[-1])
        found = Interpreter(str(data["executable"]), str(data["prefix"]), str(data["version"]),
                            dict(data["packages"]), dict(data["modules"]),
                            None if data["keys"] is None else tuple(data["keys"]))
    except (ValueError, IndexError, KeyError, TypeError):
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise InterpreterError(f"{python} is not a working Python (exit {done.returncode}: "
                               f"{last[:160]})") from None
    _known[key] = found
    return found


def driver_python() -> str:
    """The driver's own interpreter: what trials run with unless `trainer.python` is set."""
    return sys.executable
