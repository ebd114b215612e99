"""How a finished trial process is judged: state, values, and a one-line reason (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sweep.protocol import ResultError, parse_result

COMPLETE, FAIL, PRUNED = "COMPLETE", "FAIL", "PRUNED"

_LAUNCHER_FAILURE = re.compile(r"returned non-zero exit status (-?\d+)\.?\s*$")
_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|HIP out of memory",
)
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Outcome:
    """What to tell Optuna about a trial, and the user attributes to store with it."""

    state: str
    values: list[float] | None = None
    fail_reason: str | None = None
    exit_code: int | None = None
    oom: bool = False
    extras: dict[str, float] = field(default_factory=dict)


def split_launcher_traceback(stderr: str) -> tuple[str, int | None]:
    """Remove `accelerate launch`'s own CalledProcessError traceback from the end of stderr.

    Returns (the trainer's stderr, the trainer's exit code if the launcher reported it).
    """
    lines = stderr.rstrip().splitlines()
    if not lines:
        return "", None
    match = _LAUNCHER_FAILURE.search(lines[-1])
    if not match or "CalledProcessError" not in lines[-1]:
        return stderr, None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            return "\n".join(lines[:i]), int(match.group(1))
    return "\n".join(lines[:-1]), int(match.group(1))


def last_line(text: str, width: int = 200) -> str:
    """The last non-blank line of `text`, stripped and cut to `width` characters."""
    for line in reversed(text.splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""


def judge(
    exit_code: int | None,
    stderr: str,
    result_text: str | None,
    metrics: list[str],
    stopped: str | None = None,
) -> Outcome:
    """Decide a trial from what it left behind.

    `exit_code` is the guard's (the launcher's); `stopped` is why the driver stopped it, if it
    did ("interrupted", "timeout after 60 s"). Order matters: a stop the driver caused explains
    the exit code; out-of-memory explains a crash; a crash explains a missing result.
    """
    trainer_stderr, trainer_code = split_launcher_traceback(stderr)
    code = trainer_code if trainer_code is not None else exit_code
    if stopped is not None:
        return Outcome(FAIL, fail_reason=stopped, exit_code=code)
    if _OOM.search(trainer_stderr):
        line = next(
            (ln.strip() for ln in reversed(trainer_stderr.splitlines()) if _OOM.search(ln)), ""
        )
        return Outcome(FAIL, fail_reason=f"out of memory: {last_line(line)}", exit_code=code,
                       oom=True)
    if code != 0:
        detail = last_line(trainer_stderr) or "no stderr"
        return Outcome(FAIL, fail_reason=f"exit code {code}: {detail}", exit_code=code)
    if result_text is None:
        return Outcome(FAIL, exit_code=code, fail_reason=(
            "no result file: the trainer exited 0 but wrote nothing to $SWEEP_RESULT_FILE"
        ))
    try:
        values, extras = parse_result(result_text, metrics)
    except ResultError as e:
        return Outcome(FAIL, fail_reason=str(e), exit_code=code)
    return Outcome(COMPLETE, values=values, exit_code=code, extras=extras)


def read_text(path: Path, tail_bytes: int | None = None) -> str | None:
    """A file's text (only its last `tail_bytes` if given), or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            if tail_bytes is not None:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - tail_bytes))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
