"""How a finished trial process is judged: state, values, and a one-line reason (pure)."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from sweep._core import PatternTimeout, parse_stdout
from sweep.trial._launcher_echo import launcher_echo
from sweep.trial._results import ResultError, parse_result

COMPLETE, FAIL, PRUNED = TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED
NO_RESULT = "no result: the trainer exited 0 but wrote no result"
MAX_RESULT = 1 << 20  # bytes of a result file read (one of metrics holds a few hundred)
HOW_TO_GIVE = ("; write one with sweep.protocol.write_result (to $SWEEP_RESULT_FILE) or set "
               "trainer.result (a file or stdout patterns)")
STDOUT_TAIL = 4 << 20  # bytes of a trial's stdout that its patterns search (its end)

# CalledProcessError's last line: "returned non-zero exit status N." or, for a child killed by
# a signal, "died with <Signals.SIGKILL: 9>." / "died with unknown signal N."
_LAUNCHER_FAILURE = re.compile(
    r"(?:returned non-zero exit status (-?\d+)|died with (?:<Signals\.\w+: |unknown signal )"
    r"(\d+)>?)\.?\s*$")
_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
    r"CUBLAS_STATUS_ALLOC_FAILED|HIP out of memory",
)
# A CUDA error that may be the card's, not the program's: what a sick GPU makes trials print
# ("an illegal memory access", "unspecified launch failure", "uncorrectable ECC error", ...).
# Out of memory and a device-side assert (the program's own indexing) are not.
_CUDA_ERROR = re.compile(
    r"CUDA error: (?!out of memory|device-side assert)|CUDA driver error|"
    r"unspecified launch failure|illegal memory access|uncorrectable ECC error|"
    r"ECC error|cudaErrorECCUncorrectable|cudaErrorIllegalAddress|cudaErrorLaunchFailure|"
    r"CUDA_ERROR_(?:ILLEGAL_ADDRESS|LAUNCH_FAILED|ECC_UNCORRECTABLE|UNKNOWN)|"
    r"CUBLAS_STATUS_EXECUTION_FAILED|NCCL error.*unhandled cuda error",
)


@dataclass(frozen=True)
class Outcome:
    """What to tell Optuna about a trial, and the user attributes to store with it. `state`
    is COMPLETE, PRUNED or FAIL."""

    state: TrialState
    values: list[float] | None = None
    fail_reason: str | None = None
    exit_code: int | None = None
    oom: bool = False
    extras: dict[str, float] = field(default_factory=dict)
    cuda_error: bool = False  # a crash with a CUDA error that is not out-of-memory
    study_fix: bool = False  # its reason names a fix of the study file: every trial would fail so


def split_launcher_traceback(stderr: str) -> tuple[str, int | None]:
    """Remove `accelerate launch`'s own CalledProcessError traceback from the end of stderr.

    Since accelerate 1.16 the launcher raises it `from RuntimeError(<the tail of the child's
    stderr>)`, so the child's stderr is followed by a copy of its tail and "The above exception
    was the direct cause ..." before the traceback: the copy goes too (`launcher_echo`).

    Returns (the trainer's stderr, the trainer's exit code if the launcher reported it; 128 + N
    for a trainer killed by signal N, as the other launchers report it).
    """
    lines = stderr.rstrip().splitlines()
    if not lines:
        return "", None
    match = _LAUNCHER_FAILURE.search(lines[-1])
    if not match or "CalledProcessError" not in lines[-1]:
        return stderr, None
    code = int(match.group(1)) if match.group(1) is not None else 128 + int(match.group(2))
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            return _launcher_cause("\n".join(lines[:i])), code
    return "\n".join(lines[:-1]), code


def _launcher_cause(text: str) -> str:
    """`text` (stderr before the launcher's traceback) without accelerate 1.16's chained cause,
    the copy of the child's stderr tail (`launcher_echo`); `text` as it is without one."""
    at = launcher_echo(text)
    return text if at is None else text[:at].rstrip("\n")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def last_line(text: str, width: int = 200) -> str:
    """The last non-blank line of `text`, stripped and cut to `width` characters, without
    terminal escapes or control characters (it is stored, and printed)."""
    for line in reversed(text.splitlines()):
        line = _CONTROL.sub("?", _ANSI.sub("", line)).strip()
        if line:
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""


def judge(
    exit_code: int | None,
    stderr: str,
    result_text: str | None,
    metrics: list[str],
    stop: str | None = None,
    timeout: float | None = None,
    last_report: tuple[int, float] | None = None,
) -> Outcome:
    """Decide a trial from what it left behind.

    `exit_code` is the command's; `stop` is why the driver stopped the trial, if it did
    (`sweep.trial.running.Stop`: "pruned", "timeout", "interrupted", "driver error"), and
    `timeout` the limit that a "timeout" stop enforced. Order matters: a stop the driver caused
    explains the exit (a pruned trial is PRUNED with its last reported value); a clean exit
    with a valid result is COMPLETE, whatever stderr says; out-of-memory explains a crash; a
    crash explains a missing result.
    """
    trainer_stderr, trainer_code = split_launcher_traceback(stderr)
    code = trainer_code if trainer_code is not None else exit_code
    if stop in ("pruned", "paused", "replaced"):  # "paused", "replaced": study.scheduler's
        values = [last_report[1]] if last_report is not None else None
        return Outcome(PRUNED, values=values, exit_code=code)
    if stop == "timeout":
        return Outcome(FAIL, fail_reason=f"timeout after {timeout or 0:g} s", exit_code=code)
    if stop is not None:
        return Outcome(FAIL, fail_reason=str(stop), exit_code=code)
    if code != 0:
        oom = _oom_line(trainer_stderr)
        if oom is not None:
            return Outcome(FAIL, fail_reason=f"out of memory: {last_line(oom)}", exit_code=code,
                           oom=True)
        detail = last_line(trainer_stderr) or "no stderr"
        return Outcome(FAIL, fail_reason=f"exit code {code}: {detail}", exit_code=code,
                       cuda_error=cuda_error_line(died_of(trainer_stderr)) is not None)
    if result_text is None:
        return Outcome(FAIL, exit_code=code, fail_reason=NO_RESULT)
    try:
        values, extras = parse_result(result_text, metrics)
    except ResultError as e:
        return Outcome(FAIL, fail_reason=str(e), exit_code=code)
    return Outcome(COMPLETE, values=values, exit_code=code, extras=extras)


def judge_files(
    stderr: Path, result: Path, exit_code: int | None, metrics: list[str],
    stdout: Path | None = None, patterns: Sequence[str] = (), env_result: Path | None = None,
    at_end: tuple[str | None] | None = None, stream: str = "stdout", **how: Any,
) -> Outcome:
    """`judge` a trial from its files: the tail of its stderr, and its metrics from the result
    file, or from `patterns` over its stdout. `env_result` is the file `$SWEEP_RESULT_FILE`
    named (default: `result`; another one came from `trainer.result.file`). A missing result
    says where sweep looked, quotes the trainer's last line of output, and, where sweep looked
    at `$SWEEP_RESULT_FILE`, the two ways to give one. `at_end`: the result file's text as it
    was when the trainer ended (read then), instead of as it is now. `stream` ("stdout" or
    "stderr") is the output the patterns search; when they fail there but would match in the
    other one, the reason says so."""
    out = read_text(stdout, tail_bytes=STDOUT_TAIL) if stdout is not None else None
    searched_path = stderr if stream == "stderr" else stdout
    searched = read_text(stderr, tail_bytes=STDOUT_TAIL) if stream == "stderr" else out
    rejected: dict[str, str] = {}
    timed_out = None
    hint = ""
    too_large = False
    if patterns:
        try:
            found = parse_stdout(searched or "", list(patterns), rejected, needed=metrics)
        except PatternTimeout as e:
            found, timed_out = {}, str(e)
        result_text = json.dumps(found) if found else None
        shown = " or ".join("'" + p + "'" for p in patterns)
        where = f"no line of {searched_path} matched {shown}"
    else:
        result_text = read_text(result) if at_end is None else at_end[0]
        if result_text is not None and len(result_text.encode()) > MAX_RESULT:  # cut: unread
            result_text, too_large = None, True
        where = f"nothing at {result}"
        if env_result is None or result == env_result:
            hint = HOW_TO_GIVE
        else:
            where += " (trainer.result.file)"
        if at_end is not None and at_end[0] is None and read_text(result) is not None:
            where += (" when the trainer ended (it was written later, by a process the trainer "
                      "left running?)")
            hint = ""
        elif os.path.lexists(result) and result_text is None:
            where = f"the result file {result} is not a regular file (a link? a FIFO? a folder?)"
            hint = ""  # the trainer knows where its result goes
    verdict = judge(exit_code, read_text(stderr, tail_bytes=64_000) or "", result_text,
                    metrics, **how)
    missing = [m for m in metrics if m in rejected and verdict.state == FAIL]
    if patterns and missing:
        said = rejected[missing[0]]
        how_bad = "diverged" if _diverged(said) else "is not a finite number"
        return Outcome(FAIL, exit_code=verdict.exit_code, fail_reason=(
            f"metric {missing[0]!r} matched in {stream} but {how_bad}: {said!r}"))
    if verdict.fail_reason == NO_RESULT and too_large:
        return Outcome(FAIL, exit_code=verdict.exit_code, fail_reason=(
            f"result file {result} is larger than {MAX_RESULT} bytes, all sweep reads: write "
            "only the metrics to it"))
    if verdict.fail_reason == NO_RESULT and timed_out is not None:
        return Outcome(FAIL, fail_reason=timed_out, exit_code=verdict.exit_code)
    other = "stdout" if stream == "stderr" else "stderr"
    if verdict.fail_reason == NO_RESULT:
        said = last_line(searched or "", 120)
        reason = f"no result: {where}" + (f"; last line of {stream}: {said}" if said else
                                           f"; {stream} is empty") + hint
        if patterns and _matches_in(stdout if other == "stdout" else stderr, patterns,
                                    metrics):
            reason += f"; they match in {other}.log: set trainer.result.{other} instead"
            return Outcome(FAIL, fail_reason=reason, exit_code=verdict.exit_code,
                           study_fix=True)
        return Outcome(FAIL, fail_reason=reason, exit_code=verdict.exit_code)
    if patterns and verdict.fail_reason and "missing from the result file" in verdict.fail_reason:
        reason = verdict.fail_reason.replace("missing from the result file (keys:",
                                             f"not found in {stream} (groups found:")
        if _matches_in(stdout if other == "stdout" else stderr, patterns, metrics):
            reason += f"; the patterns match in {other}.log: set trainer.result.{other} instead"
            return Outcome(FAIL, fail_reason=reason, exit_code=verdict.exit_code,
                           study_fix=True)
        return Outcome(FAIL, fail_reason=reason, exit_code=verdict.exit_code)
    return verdict


def _diverged(text: str) -> bool:
    """`text` reads as NaN or an infinity (a training that diverged), not as other text."""
    try:
        number = float(text)
    except ValueError:
        return False
    return number != number or number in (float("inf"), float("-inf"))


def _matches_in(path: Path | None, patterns: Sequence[str], metrics: list[str]) -> bool:
    """Whether `patterns` find every metric in the file at `path` (a quick second look)."""
    text = read_text(path, tail_bytes=STDOUT_TAIL) if path is not None else None
    if not text:
        return False
    try:
        found = parse_stdout(text, list(patterns), needed=metrics, budget=0.2)
    except PatternTimeout:
        return False
    return all(m in found for m in metrics)


TAIL_LINES = 20  # lines of stderr a trainer that died without a Python traceback is judged by


def died_of(stderr: str) -> str:
    """What the trainer died of, as its stderr says: the exception lines of its Python
    tracebacks (`RuntimeError: CUDA error: ...`, also a child's before a launcher's), or,
    with no traceback (an abort in C++), its last TAIL_LINES lines. What it printed along the
    way ("ECC error" in a log line before a ValueError) is not the error it died of."""
    lines = stderr.splitlines()
    found: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("Traceback (most recent call last):"):
            i += 1
            continue
        i += 1
        while i < len(lines) and (lines[i][:1].isspace() or not lines[i].strip()):
            i += 1  # the frames ("  File ...", their code, ^^^ marks)
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("Traceback"):
            found.append(lines[i])  # the exception and the rest of its message
            i += 1
    return "\n".join(found) if found else "\n".join(lines[-TAIL_LINES:])


def cuda_error_line(stderr: str) -> str | None:
    """The last line of `stderr` that reports a CUDA error other than out-of-memory, if any
    (a sick card's sign, when it comes twice in a row on one device; see `sweep.gpus.health`)."""
    for line in reversed(stderr.splitlines()):
        if _CUDA_ERROR.search(line):
            return line.strip()
    return None


def _oom_line(stderr: str) -> str | None:
    """The last line of `stderr` that reports running out of device memory, if any."""
    for line in reversed(stderr.splitlines()):
        if _OOM.search(line):
            return line.strip()
    return None


def read_text(path: Path, tail_bytes: int | None = None,
              limit: int = MAX_RESULT + 1) -> str | None:
    """A regular file's text (its last `tail_bytes`, else at most `limit` bytes), or None.

    Never blocks, never follows a link: a link, a FIFO, a device or a directory in the file's
    place reads as None.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, a FIFO, a device
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        if tail_bytes is not None:
            f.seek(max(0, info.st_size - tail_bytes))
        return f.read(tail_bytes or limit).decode("utf-8", errors="replace")
