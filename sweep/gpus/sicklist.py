"""The host's record of devices a sweep took out of its pool as sick, for `sweep gpus`.

One small JSON file per device, `sick.<device key>.json`, in the host's lock folder (see
`sweep.gpus.hostlock`): which GPU, why, when, and which driver. It is what a user sees later; no
run reads it to decide anything (each run judges its devices itself, from NVML and its trials).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from sweep.gpus.hostlock import file_key

PREFIX = "sick."


def mark(folder: Path, key: str, index: int, why: str) -> None:
    """Record that device `key` (pool index `index`) was taken out, and why. A file another
    user left under that name stays (the folder is sticky): nothing is recorded then."""
    record = {"gpu": index, "why": why, "time": time.time(), "pid": os.getpid(),
              "uid": os.getuid()}
    final = folder / f"{PREFIX}{file_key(key)}.json"
    tmp = folder / f".{PREFIX}{file_key(key)}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, final)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def marks(folder: Path) -> dict[str, dict[str, Any]]:
    """Device key (as in file names) -> its record, for each regular file that parses."""
    out: dict[str, dict[str, Any]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(".json")):
            continue
        try:
            fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            record = json.loads(os.read(fd, 4096) or b"null")
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if isinstance(record, dict) and isinstance(record.get("why"), str):
            out[name[len(PREFIX):-len(".json")]] = record
    return out


def shown(record: dict[str, Any]) -> str:
    """One record as `sweep gpus` shows it."""
    when = record.get("time")
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if isinstance(
        when, (int, float)) else "?"
    return f"taken out by sweep pid {record.get('pid')} at {at}: {str(record['why'])[:200]}"
