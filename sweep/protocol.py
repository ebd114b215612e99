"""The files between the driver and a trainer: both sides of the trial contract.

Trainer side (importable without torch, optuna or the rest of sweep):
    from sweep.protocol import params, report, should_stop, write_result

    write_result({"val_loss": 0.31, "acc": 0.9})   # atomically to $SWEEP_RESULT_FILE
    report(step=epoch, value=val_loss)              # one JSON line to $SWEEP_REPORT_FILE
    if should_stop(): ...                           # SIGTERM arrived (pruned, timeout, Ctrl-C)

Driver side: `parse_result` and `ReportReader` turn those files into values or one-line reasons.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULT_ENV = "SWEEP_RESULT_FILE"
REPORT_ENV = "SWEEP_REPORT_FILE"
PARAMS_ENV = "SWEEP_PARAMS_FILE"
TRIAL_DIR_ENV = "SWEEP_TRIAL_DIR"
TRIAL_NUMBER_ENV = "SWEEP_TRIAL_NUMBER"


# ---- trainer side -------------------------------------------------------------------------


def write_result(metrics: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """Write `metrics` as a JSON object to `path` (default `$SWEEP_RESULT_FILE`) atomically.

    A reader sees either no file or the whole object, never a partial write.
    Outside a sweep (no path, no env var) it does nothing, so a trainer also runs by hand.
    """
    target = path if path is not None else os.environ.get(RESULT_ENV)
    if not target:
        return
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=".result-", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dict(metrics), f, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report(step: int, value: float, path: str | os.PathLike[str] | None = None) -> None:
    """Append `{"step": step, "value": value}` as one flushed line to `$SWEEP_REPORT_FILE`.

    The driver passes it to the pruner. Outside a sweep it does nothing.
    """
    target = path if path is not None else os.environ.get(REPORT_ENV)
    if not target:
        return
    line = json.dumps({"step": int(step), "value": float(value)}) + "\n"
    with open(target, "a") as f:
        f.write(line)
        f.flush()


def params() -> dict[str, Any]:
    """The trial's params as typed JSON values (from `$SWEEP_PARAMS_FILE`); {} outside a sweep."""
    path = os.environ.get(PARAMS_ENV)
    return json.loads(Path(path).read_text()) if path else {}


_stop_requested = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True


def should_stop() -> bool:
    """True once the driver asked this trial to stop (SIGTERM: pruned, timeout or interrupt).

    The first call installs a SIGTERM handler, so call it once early (e.g. before training).
    After it, SIGTERM no longer kills the process: save a checkpoint and exit within the
    grace period (`trainer.stop_grace`), or the driver sends SIGKILL.
    """
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)
    return _stop_requested


# ---- driver side --------------------------------------------------------------------------


class ResultError(ValueError):
    """The result file cannot give the objective; `str(e)` is the trial's fail_reason."""


def parse_result(text: str, metrics: list[str]) -> tuple[list[float], dict[str, float]]:
    """A result file's text -> (objective values in `metrics` order, other numeric keys).

    Raises ResultError with the trial's fail_reason when the objective cannot be read.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultError(f"result file is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ResultError(f"result file must hold a JSON object, not {type(data).__name__}")
    values = []
    for name in metrics:
        if name not in data:
            keys = ", ".join(sorted(map(str, data))) or "none"
            raise ResultError(f"metric {name!r} missing from the result file (keys: {keys})")
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"metric {name!r} is not a number: {value!r}")
        if not math.isfinite(value):
            raise ResultError(f"metric {name!r} is not a finite number: {value}")
        values.append(float(value))
    extras = {
        k: float(v) for k, v in data.items()
        if k not in metrics and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return values, extras


def parse_report_lines(text: str) -> list[tuple[int, float]]:
    """The (step, value) pairs of the complete lines of `text`.

    A trailing line without its newline is not read yet; malformed lines are skipped.
    """
    reports: list[tuple[int, float]] = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        try:
            item = json.loads(line)
            step, value = item["step"], item["value"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        is_step = isinstance(step, int) and not isinstance(step, bool)
        if is_step and isinstance(value, (int, float)) and math.isfinite(value):
            reports.append((step, float(value)))
    return reports


class ReportReader:
    """Follows one trial's report file: each `read()` returns the new, not yet seen steps."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._seen: set[int] = set()

    def read(self) -> list[tuple[int, float]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        reports = parse_report_lines(complete.decode("utf-8", errors="replace"))
        fresh = []
        for step, value in reports:
            if step not in self._seen:
                self._seen.add(step)
                fresh.append((step, value))
        return fresh
