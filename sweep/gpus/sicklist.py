"""The host's record of devices a sweep took out of its pool as sick, for `sweep gpus`.

One small JSON file per device, `sick.<device key>.json`, in the host's lock folder (see
`sweep.gpus.hostlock`): which GPU, why, when, and which driver. It is what a user sees later; no
run reads it to decide anything (each run judges its devices itself, from NVML and its trials).
A record is shown for MAX_AGE after it was made; `sweep gpus --clear` gives a device back at
once (its record goes: sweep made it).
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
MAX_AGE = 7 * 24 * 3600.0  # seconds a record is shown: a card repaired or replaced since


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


def marks(folder: Path, now: float | None = None) -> dict[str, dict[str, Any]]:
    """Device key (as in file names) -> its record, for each regular file that parses and is
    younger than MAX_AGE (at `now`, else the time now)."""
    now = time.time() if now is None else now
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
        if isinstance(record, dict) and isinstance(record.get("why"), str) and not (
                isinstance(record.get("time"), (int, float)) and now - record["time"] > MAX_AGE):
            out[name[len(PREFIX):-len(".json")]] = record
    return out


def clear(folder: Path, key: str) -> bool:
    """Forget device `key`'s record (the file a sweep of this user made: a link, or another
    user's file, stays); whether there was one to forget."""
    path = folder / f"{PREFIX}{file_key(key)}.json"
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    os.unlink(path)
    return True


def shown(record: dict[str, Any]) -> str:
    """One record as `sweep gpus` shows it."""
    when = record.get("time")
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if isinstance(
        when, (int, float)) else "?"
    return f"taken out by sweep pid {record.get('pid')} at {at}: {str(record['why'])[:200]}"
