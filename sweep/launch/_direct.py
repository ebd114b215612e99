"""Launcher `direct`: the script in one interpreter, with the variables `accelerate launch`
would put in a one-process trial's environment, computed by accelerate's own code
(`_validate_launch_command`, then `prepare_simple_launcher_cmd_env`) in a helper process, once
per set of launch options, and cached (`AccelerateEnv`): each trial starts one interpreter
instead of two. The driver never imports accelerate (nor torch).

The cache is a JSON file per host and options in `<output_dir>/cache/`; the key holds the
accelerate version, the interpreter, the options and the variables accelerate reads. What the
helper computed is also kept for the life of the process under the same key: a process that
runs several studies (the Python API, a notebook) runs it once per key, not once per study.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from sweep._core import SweepError
from sweep.launch import _engine
from sweep.launch._accelerate import BaseLauncher
from sweep.spec import Spec, interpreter
from sweep.spec import container as containerspec
from sweep.trial import LaunchPlan, Spawn, Start, launch_plan, process

# Run as `python -c HELPER OPTIONS_JSON`: prints the variables accelerate sets or changes.
HELPER = """
import json, os, sys
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_simple_launcher_cmd_env
args = launch_command_parser().parse_args(json.loads(sys.argv[1]) + ["sweep_trial.py"])
args, _, _ = _validate_launch_command(args)
_, env = prepare_simple_launcher_cmd_env(args)
print(json.dumps({k: v for k, v in env.items() if os.environ.get(k) != v}))
"""
# what accelerate looks at, and PYTHONPATH, which can decide which accelerate the helper imports
READS = re.compile(r"^(ACCELERATE_|OMP_|KMP_|HF_|CUDA_|MASTER_|PYTHONPATH$)")
OURS = ("CUDA_VISIBLE_DEVICES",)  # sweep sets it per trial
# what the helper computed in this process, by the key of its cache file (the options, the
# accelerate version, interpreter, host and the variables it reads: `AccelerateEnv._context`)
_COMPUTED: dict[str, dict[str, str]] = {}


class AccelerateEnv:
    """The variables `accelerate launch` sets for given options, computed once each."""

    def __init__(self, cache_dir: Path, host: str, python: str = sys.executable,
                 timeout: float = 300.0, version: str | None = None,
                 prefix: Sequence[str] = ()) -> None:
        """`python`: the trainer's interpreter, whose accelerate computes the variables;
        `version`: its accelerate's (None: the driver's own, for its own interpreter);
        `prefix`: the argv that runs `python` elsewhere (inside the study's image)."""
        self.cache_dir, self.host, self.python, self.timeout = cache_dir, host, python, timeout
        self.prefix = list(prefix)
        self._known: dict[tuple[str, ...], dict[str, str]] = {}
        try:
            version = version or metadata.version("accelerate")
        except metadata.PackageNotFoundError:
            version = "?"
        reads = sorted((k, v) for k, v in os.environ.items() if READS.match(k))
        # what the driver runs with: fixed (an image's ID is in the prefix's place of it)
        self._context = [version, python, host, reads, *([self.prefix] if prefix else [])]

    def key(self, options: list[str]) -> str:
        text = json.dumps([*self._context, options])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def cached(self, options: list[str]) -> dict[str, str] | None:
        """The variables for `options` if a run has computed them on this host (reads only:
        memory, then the cache file)."""
        if tuple(options) in self._known:
            return self._known[tuple(options)]
        try:
            return dict(json.loads(self._file(options).read_text()))
        except (OSError, ValueError):
            return None

    def _file(self, options: list[str]) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.host)
        return self.cache_dir / f"accelerate_env.{safe}.{self.key(options)}.json"

    def get(self, options: list[str]) -> dict[str, str]:
        """The variables for `options` (`launch_plan.direct_settings`): from memory, the cache, or
        one run of the helper (a few seconds). SweepError if accelerate refuses them."""
        env = self.cached(options)  # each trial start asks: from memory, no hashing, no files
        if env is None:
            key = self.key(options)
            if key not in _COMPUTED:
                _COMPUTED[key] = self._compute(options)
            env = _COMPUTED[key]
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            cached = self._file(options)
            tmp = cached.with_suffix(f".{uuid.uuid4().hex}.tmp")  # drivers may share the folder
            tmp.write_text(json.dumps(env, indent=1, sort_keys=True))
            tmp.replace(cached)
        self._known[tuple(options)] = env
        return env

    def _compute(self, options: list[str]) -> dict[str, str]:
        try:
            done = subprocess.run([*self.prefix, self.python, "-c", HELPER, json.dumps(options)],
                                  capture_output=True, text=True, timeout=self.timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SweepError(f"launcher: direct: cannot ask accelerate for its environment: "
                             f"{e}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SweepError(f"launcher: direct: accelerate refused the options "
                             f"{' '.join(options)}: {last[:200]}")
        env = json.loads(done.stdout.strip().splitlines()[-1])
        return {k: str(v) for k, v in env.items() if k not in OURS}


class DirectLauncher(BaseLauncher):
    """The script in one interpreter, with the variables `accelerate launch` would set."""

    def __init__(self, spec: Spec, host: str, spawn: Spawn = process.TrialProcess,
                 dry: bool = False) -> None:
        """`dry`: for a dry run, which computes nothing: the variables come from the cache
        alone."""
        super().__init__(spec, spawn)
        python, inside = spec.trainer.python, spec.trainer.container
        # in a container: accelerate's variables are asked of the image's accelerate, by
        # image ID (the tag may move), with the config file the options name mounted
        prefix: list[str] = []
        if inside is not None:
            pinned = inside if inside.engine == "apptainer" else inside.model_copy(
                update={"image": _engine.pin(inside, spec.source.parent).id})
            prefix = containerspec.probe_prefix(pinned, spec.source.parent, [self.config.path])
            python = launch_plan.trial_python(spec)
        version = None if python is None else interpreter.probe(
            python, prefix=prefix).packages.get("accelerate")
        self.accelerate_env = AccelerateEnv(spec.output_dir / "cache", host,
                                            python or sys.executable, version=version,
                                            prefix=prefix)
        self._dry = dry

    def prepare(self) -> None:
        super().prepare()
        if all(p.where == "script" for p in self.spec.params.values()):
            self.accelerate_env.get(launch_plan.direct_settings(self.spec, {}, self.config))

    def _variables(self, params: Mapping[str, Any]) -> dict[str, str] | None:
        options = launch_plan.direct_settings(self.spec, params, self.config)
        return self.accelerate_env.cached(options) if self._dry else \
            self.accelerate_env.get(options)

    def plan(self, number: int, params: Mapping[str, Any], device: int,
             pin: str | None = None, port: int | None = None,
             start: Start | None = None) -> LaunchPlan:
        """As the base's, with accelerate's variables beneath sweep's: for launch options not
        seen before (a searched `where: accelerate` param) they are asked of accelerate once
        (a few seconds) and cached; then the plan is pure again."""
        return launch_plan.plan_trial(self.spec, number, params, device, pin, port,
                                      self._variables(params), through_accelerate=False,
                                      config=self.config, start=start)

    def note(self, params: Mapping[str, Any]) -> str | None:
        if self._variables(params) is None:
            return ("# plus the variables `accelerate launch` would set: computed and cached "
                    "at the first run")
        return None
