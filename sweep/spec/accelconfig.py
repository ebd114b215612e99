"""`trainer.accelerate.config_file`: a team's `accelerate config` file as the base of every
trial's launch config.

sweep sets on top only what it owns: the number of processes (`trainer.gpus_per_trial`), one
machine of rank 0, the devices and the rendezvous port (given on the command line, so the
file's `gpu_ids`, `main_process_ip` and `main_process_port` are dropped), and the
distributed type a trial's width needs (`NO` for one device; `MULTI_GPU` for several when
the file says `NO`). Everything else (FSDP / DeepSpeed / dynamo sections, mixed precision,
debug, CPU affinity...) is kept as written. What contradicts sweep is refused (`problems`):
several machines, a compute environment other than this machine, a DeepSpeed config without
deepspeed in the trainer's interpreter, a key the trainer's accelerate does not know, a
distributed type, mixed precision or dynamo backend its enums do not have.

`merge` and `problems` are pure; `read` reads the file; the driver writes the merged config
once per run (`write`), named by its content.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sweep._core import UsageError, yamlfile

DROPPED = ("gpu_ids", "main_process_ip", "main_process_port")  # sweep's, given per trial
# the types that need several processes: a trial of one device runs without them
SEVERAL = ("MULTI_GPU", "MULTI_CPU", "FSDP", "DEEPSPEED", "MEGATRON_LM", "MULTI_NPU",
           "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_SDAA", "MULTI_HPU", "MULTI_NEURON")


class ConfigFileError(UsageError):
    """The file cannot be read as an accelerate config (the message says why, in one line)."""


@dataclass(frozen=True)
class Merged:
    """The launch config of every trial of a study: `config` (to write as YAML), and `notes`
    for the user (what of the file a trial of this width runs without)."""

    config: dict[str, Any]
    notes: tuple[str, ...] = ()

    @property
    def distributed_type(self) -> str:
        return str(self.config["distributed_type"])

    @property
    def text(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=True)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


def read(path: Path) -> dict[str, Any]:
    """The file's mapping; ConfigFileError if it is not a readable YAML mapping."""
    try:
        text = yamlfile.read_text(path, str(path))  # never blocks, never reads without end
    except yamlfile.FileTextError as e:
        raise ConfigFileError(f"{e}: give the file `accelerate config` writes") from None
    try:
        data = yamlfile.load(text)
    except yamlfile.YamlError as e:
        raise ConfigFileError(f"{path}: line {e.line}: {e.problem}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path} is not a mapping of accelerate config keys (write it "
                              "with `accelerate config`)")
    return {str(k): v for k, v in data.items()}


def problems(data: Mapping[str, Any], keys: Sequence[str] | None, has_deepspeed: bool,
             mixed_precision: str | None, dynamo_backend: str | None, *,
             choices: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """What in the file contradicts sweep or the trainer's accelerate, one message each.
    `keys`: the keys the trainer's accelerate takes (None: not known, not checked);
    `mixed_precision` / `dynamo_backend`: `trainer.accelerate`'s own settings, if given;
    `choices`: the values the trainer's accelerate takes for distributed_type,
    mixed_precision and dynamo_backend (its enums; None: not known, not checked)."""
    out = []
    if keys is not None:
        unknown = sorted(set(data) - set(keys))
        if unknown:
            out.append(f"keys the trainer's accelerate does not know: {', '.join(unknown)} "
                       "(accelerate refuses them too: remove them, or write the file again "
                       "with `accelerate config`)")
    dynamo_config = data.get("dynamo_config")
    for name, value, case in (
            ("distributed_type", data.get("distributed_type"), str),
            ("mixed_precision", data.get("mixed_precision"), str.lower),  # as accelerate reads
            ("dynamo_backend", dynamo_config.get("dynamo_backend")
             if isinstance(dynamo_config, dict) else None, str.upper)):
        taken = (choices or {}).get(name)
        if value is None or taken is None:
            continue
        if not isinstance(value, str) or case(value) not in taken:
            where = "dynamo_config.dynamo_backend" if name == "dynamo_backend" else name
            out.append(f"{where} is {value!r}: the trainer's accelerate takes "
                       f"{', '.join(taken)} (accelerate refuses it too: give one of them)")
    machines = data.get("num_machines", 1)
    if not isinstance(machines, int) or isinstance(machines, bool) or machines != 1:
        out.append(f"num_machines is {machines!r}: sweep runs each trial on one machine "
                   "(several hosts run their own drivers of one study: "
                   "docs/how-to/several-hosts.md); set num_machines: 1")
    env = data.get("compute_environment", "LOCAL_MACHINE")
    if env != "LOCAL_MACHINE":
        out.append(f"compute_environment is {env!r}: sweep launches trials on this machine; "
                   "set compute_environment: LOCAL_MACHINE")
    if data.get("distributed_type") == "DEEPSPEED" and not has_deepspeed:
        out.append("distributed_type is DEEPSPEED, and deepspeed is not installed in the "
                   "trainer's interpreter: install it there (pip install deepspeed)")
    filed = data.get("mixed_precision")
    if mixed_precision is not None and filed is not None and filed != mixed_precision:
        out.append(f"mixed_precision is {filed!r} here and {mixed_precision!r} in "
                   "trainer.accelerate.mixed_precision: give it in one place")
    dynamo = (data.get("dynamo_config") or {}).get("dynamo_backend") if isinstance(
        data.get("dynamo_config"), dict) else None
    if dynamo_backend is not None and dynamo is not None and str(dynamo).lower() != (
            dynamo_backend.lower()):
        out.append(f"dynamo_config.dynamo_backend is {dynamo!r} here and {dynamo_backend!r} "
                   "in trainer.accelerate.dynamo_backend: give it in one place")
    return out


def merge(data: Mapping[str, Any], width: int) -> Merged:
    """The file's config with sweep's settings on top for trials of `width` devices."""
    config = {k: v for k, v in data.items() if k not in DROPPED}
    config.update({"num_processes": width, "num_machines": 1, "machine_rank": 0})
    config.setdefault("compute_environment", "LOCAL_MACHINE")
    filed = str(data.get("distributed_type") or "NO")
    notes: list[str] = []
    if width == 1:
        kind = "NO"
        if filed in SEVERAL and filed not in ("MULTI_GPU", "MULTI_CPU"):
            notes.append(f"trainer.accelerate.config_file: distributed_type {filed} needs "
                         "several processes, and trials have one device (gpus_per_trial: "
                         f"1): they run without {filed}")
    else:
        kind = "MULTI_GPU" if filed in ("NO", "MULTI_CPU") else filed
    config["distributed_type"] = kind
    return Merged(config, tuple(notes))


def write(merged: Merged, folder: Path) -> Path:
    """Write `merged` (once: the name is its content's digest) into `folder`; its path."""
    path = merged_path(merged, folder)
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # drivers share it
        tmp.write_text(merged.text)
        os.replace(tmp, path)
    return path


def merged_path(merged: Merged, folder: Path) -> Path:
    """Where `write` puts `merged` in `folder` (nothing is written)."""
    return folder / f"accelerate_config.{merged.digest}.yaml"
