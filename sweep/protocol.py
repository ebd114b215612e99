"""The files between the driver and a trainer: both sides of the trial contract.

Trainer side (importable without torch, optuna or the rest of sweep):
    from sweep.protocol import params, report, should_stop, write_result

    write_result({"val_loss": 0.31, "acc": 0.9})   # atomically to $SWEEP_RESULT_FILE
    report(step=epoch, value=val_loss)              # one JSON line to $SWEEP_REPORT_FILE
    if should_stop(): ...                           # SIGTERM arrived (pruned, timeout, Ctrl-C)

Driver side: `parse_result`, `parse_stdout` and `ReportReader` turn those files (or the trainer's
output) into values or one-line reasons.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

RESULT_ENV = "SWEEP_RESULT_FILE"
REPORT_ENV = "SWEEP_REPORT_FILE"
PARAMS_ENV = "SWEEP_PARAMS_FILE"
TRIAL_DIR_ENV = "SWEEP_TRIAL_DIR"
PORT_ENV = "SWEEP_MAIN_PORT"  # a free port for a multi-GPU trial's rendezvous
TRIAL_NUMBER_ENV = "SWEEP_TRIAL_NUMBER"


# ---- trainer side -------------------------------------------------------------------------


def write_result(metrics: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """Write `metrics` as a JSON object to `path` (default `$SWEEP_RESULT_FILE`) atomically.

    A reader sees either no file or the whole object, never a partial write. The file is
    private (0600, as every trial file).
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
    """Append `{"step": step, "value": value}` as one flushed line to `$SWEEP_REPORT_FILE`,
    created private (0600, as every trial file), never through a symbolic link.

    The driver passes it to the pruner. Outside a sweep it does nothing.
    """
    target = path if path is not None else os.environ.get(REPORT_ENV)
    if not target:
        return
    line = json.dumps({"step": int(step), "value": float(value)}) + "\n"
    fd = os.open(target, REPORT_FLAGS, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)
        f.flush()


REPORT_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


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


MAX_STEP = 2**31 - 1  # what every Optuna storage keeps as a step
MAX_EXTRAS = 64  # other numeric keys of a result kept with the trial
MAX_EXTRA_KEY = 100  # characters of such a key (databases cap an attribute's name)


def _number(value: Any) -> float | None:
    """`value` as a finite float, or None (booleans, strings, NaN, inf, too large)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_result(text: str, metrics: list[str]) -> tuple[list[float], dict[str, float]]:
    """A result file's text -> (objective values in `metrics` order, other numeric keys).

    Raises ResultError with the trial's fail_reason when the objective cannot be read. Other
    keys are kept only when they are finite numbers (at most MAX_EXTRAS of them) under a name
    any storage takes: printable, at most MAX_EXTRA_KEY characters.
    """
    try:
        data = _loads(text)
    except json.JSONDecodeError as e:
        raise ResultError(f"result file is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ResultError("result file is nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ResultError(f"result file must hold a JSON object, not {type(data).__name__}")
    values = []
    for name in metrics:
        value = lookup(data, name)
        if value is _MISSING:
            keys = _short(", ".join(sorted(map(str, data))) or "none")
            raise ResultError(f"metric {name!r} missing from the result file (keys: {keys})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"metric {name!r} is not a number: {_short(repr(value))}")
        number = _number(value)
        if number is None:
            raise ResultError(f"metric {name!r} is not a finite number: {_short(str(value))}")
        values.append(number)
    extras: dict[str, float] = {}
    for key, value in data.items():
        number = _number(value)
        if (key not in metrics and number is not None and len(extras) < MAX_EXTRAS
                and len(key) <= MAX_EXTRA_KEY and key.isprintable()):
            extras[key] = number
    return values, extras


_MISSING = object()
MISSING = _MISSING  # what `lookup` returns for a name that is not there


def lookup(data: dict[str, Any], name: str) -> Any:
    """`data[name]`, or for a dotted name (`eval.accuracy`) the nested value; else _MISSING."""
    if name in data:
        return data[name]
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:nan|inf)"
"""A number as Python prints it (`3`, `-0.25`, `1.2e-05`, `nan`, `inf`), for a named group:
`loss: (?P<loss>` + NUMBER + `)`. `nan`/`inf` match so that a diverged value is seen."""

LINE_TAIL = 2048  # characters of each output line the patterns see (its end)
MAX_PROGRAM = 1000  # RE2 instructions a pattern may compile to (common patterns: under 100)
PATTERN_SECONDS = 1.0  # CPU seconds the patterns may spend on one trial's output
CHECK_WORK = 1 << 14  # characters searched (times patterns) between two looks at the clock

_LINE_ENDS = re.compile(r"[\r\n]+")  # an empty line is no line: no pattern sees it
_NO_LOW_BOUND = re.compile(r"(?<!\\)\{,\d*\}")  # `{,n}`: up to n in `re`, plain text in RE2
_RE2_LACKS = [  # (what RE2 says, what the user wrote)
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "lookbehind (?<!...)"),
    ("invalid perl operator: (?P", "a backreference (?P=name)"),
    ("invalid perl operator: (?>", "an atomic group (?>...)"),
    ("invalid perl operator: (?(", "a conditional (?(...)...)"),
    ("invalid perl operator: (?x", "verbose mode (?x)"),
    ("invalid escape sequence: \\Z", "\\Z (write $: a pattern sees one line)"),
    ("bad repetition operator: ", "a possessive quantifier"),
]


class PatternError(ValueError):
    """A stdout pattern sweep cannot use; `str(e)` says why, in one line."""


class PatternTimeout(ResultError):
    """The stdout patterns ran out of time before every metric was found."""


def compile_pattern(pattern: str) -> Any:
    r"""`pattern` compiled with RE2 for `parse_stdout`; PatternError says what is wrong.

    RE2 matches in time linear in the text, whatever the pattern. A pattern must also be a
    regular expression to Python's `re` and mean the same there, so what RE2 lacks
    (backreferences, lookaround, atomic groups, possessive quantifiers, conditionals, `\Z`) is
    refused, as is a pattern of more than MAX_PROGRAM RE2 instructions or without named groups.
    """
    cut = _short(pattern, 60)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # `re` would read it another way
            re.compile(pattern)
    except re.error as e:
        raise PatternError(f"not a regular expression ({e}): {cut}") from None
    except FutureWarning as e:
        raise PatternError(f"{e} (RE2 and Python read it differently: escape the [ or "
                           f"the -/&/~/|): {cut}") from None
    if _NO_LOW_BOUND.search(pattern):
        raise PatternError(f"write {{0,n}} for up to n repeats ({{,n}} reads as text): {cut}")
    try:
        import re2  # type: ignore[import-untyped]
    except ImportError:
        raise PatternError("stdout patterns need the google-re2 package: "
                           "pip install google-re2") from None
    options = re2.Options()
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as e:
        said = e.args[0].decode(errors="replace") if e.args and isinstance(
            e.args[0], bytes) else str(e)
        what = next((name for start, name in _RE2_LACKS if said.startswith(start)), None)
        if what is None and said.startswith("invalid escape sequence: \\") and said[-1:].isdigit():
            what = f"a backreference {said.rsplit(' ', 1)[-1]}"
        why = (f"{what} is not supported (sweep matches with RE2, in time linear in the "
               "output: no backreferences or lookaround)") if what else (
            f"RE2, which sweep matches with, cannot read it ({said})")
        raise PatternError(f"{why}: {cut}") from None
    if compiled.programsize > MAX_PROGRAM:
        raise PatternError(f"too complex to match in bounded time ({compiled.programsize} RE2 "
                           f"instructions, at most {MAX_PROGRAM}; large {{m,n}} repeats cost "
                           f"most): {cut}")
    if not compiled.groupindex:
        raise PatternError(f"a stdout pattern needs named groups, e.g. "
                           f"'loss: (?P<loss>[0-9.]+)': {cut}")
    return compiled


def parse_stdout(
    text: str, patterns: list[str], rejected: dict[str, str] | None = None,
    needed: Collection[str] = (), budget: float = PATTERN_SECONDS,
    clock: Callable[[], float] = time.thread_time,
) -> dict[str, float]:
    """The named groups of `patterns` over a trainer's output, as numbers; last match wins.

    Patterns match within one line (`\\r` ends a line too: progress bars), against its last
    LINE_TAIL characters, with RE2 (`compile_pattern`), in time linear in the text. Lines are
    searched from the end until every group has a number, for at most `budget` seconds of
    `clock` (the thread's CPU time): past it, the groups found so far are the answer if every
    `needed` one is among them (a found value is always the last in the text), else
    PatternTimeout. A group whose last match is text that is no finite number (`nan`, `inf`,
    `97.5%`) goes to `rejected` (that text) and not to the answer: an earlier value is stale.
    """
    compiled = [compile_pattern(p) for p in patterns][::-1]  # the last pattern wins in a line
    groups = {name for c in compiled for name in c.groupindex}
    deadline = clock() + budget
    found: dict[str, float] = {}
    seen: set[str] = set()  # groups whose last match was met (the first, going backwards)
    lines = _LINE_ENDS.split(text)
    if lines[-1] == "":  # what follows the last newline
        lines.pop()
    if lines and lines[0] == "":  # what precedes the first
        lines.pop(0)
    work = searched = 0
    for searched, line in enumerate(reversed(lines), 1):
        line = line[-LINE_TAIL:]
        for pattern in compiled:
            match = pattern.search(line)
            if match is None:
                continue
            for key, raw in match.groupdict().items():
                if raw is None or key in seen:  # the last match decides, even a diverged one
                    continue
                number = _number(_float(raw))
                if number is not None:
                    found[key] = number
                elif key not in seen and rejected is not None:
                    rejected[key] = _short(raw, 40)
                seen.add(key)
        if len(found) == len(groups):
            break
        work += 1 + len(line) * len(compiled)
        if work >= CHECK_WORK:
            work = 0
            if clock() > deadline:
                missing = [m for m in needed if m not in found]
                if missing:
                    raise PatternTimeout(
                        f"stdout patterns ran out of time ({budget:g} s) after the last "
                        f"{searched} of {len(lines)} lines, before {missing[0]!r} matched: "
                        "print it nearer the end, or simplify the pattern")
                break
    return found


def _float(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def _loads(text: str) -> Any:
    """`json.loads`, with integers too long for Python's int() read as infinity (they are no
    finite metric) instead of an error for the whole document."""
    return json.loads(text, parse_int=lambda s: int(s) if len(s) < 4000 else math.inf)


def _short(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class ReportError(ValueError):
    """A report line sweep cannot use; `str(e)` is the trial's fail_reason."""


def parse_report_line(line: str, number: int) -> tuple[int, float]:
    """One line of the report file -> (step, value); ReportError says what is wrong."""
    where = f"report line {number}"
    try:
        item = _loads(line)
    except (ValueError, RecursionError):
        raise ReportError(f"{where} is not JSON: {_short(line.strip(), 60)}") from None
    if not isinstance(item, dict) or "step" not in item or "value" not in item:
        raise ReportError(f'{where} must be {{"step": N, "value": X}}: {_short(line.strip(), 60)}')
    step, value = item["step"], item["value"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ReportError(f"{where}: step must be a whole number from 0 to {MAX_STEP} "
                          f"(got {_short(repr(step), 40)})")
    finite = _number(value)
    if finite is None:
        raise ReportError(f"{where}: value must be a finite number (got {_short(repr(value), 40)})")
    return step, finite


CHUNK = 1 << 18  # bytes of the report file read at most per pass
LONGEST_LINE = 1 << 24  # bytes of one report line read at most (a longer one is skipped)


class FollowedFile:
    """The bounded, never blocking reading of one growing regular file (from `offset`): a
    FIFO, a device or a folder sets `error` instead of blocking."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        self.error: str | None = None
        self.offset = 0

    def chunk(self, size: int = CHUNK) -> bytes | None:
        """At most `size` bytes from `offset` (None: no file yet, or `error`)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.error = f"cannot read {self.what} ({e.strerror})"
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self.error = f"{self.what} is not a regular file"
            return None
        with os.fdopen(fd, "rb") as f:
            f.seek(self.offset)
            return f.read(size)


class ReportReader:
    """Follows one trial's report file: each `read()` returns new steps, at most `batch` lines.

    Steps already seen are ignored; a trailing line without its newline waits. The first bad
    line stops the reading and sets `error` (the trial's fail_reason). Never blocks: a report
    file that is not a regular file is an error.
    """

    def __init__(self, path: Path, batch: int = 100) -> None:
        self.path = path
        self.batch = batch
        self.error: str | None = None
        self.more = False  # complete lines were left for the next read
        self._file = FollowedFile(path, "the report file")
        self._lines = 0
        self._seen: set[int] = set()
        self._skipping = False  # inside a line longer than LONGEST_LINE

    def watched(self) -> list[Path]:
        """The file it reads, for `trainer.hang_after`."""
        return [self.path]

    def read(self) -> list[tuple[int, float]]:
        self.more = False
        if self.error is not None:
            return []
        chunk = self._chunk(CHUNK)
        if chunk is None:
            return []
        if self._skipping:
            return self._skip(chunk)
        *lines, _incomplete = chunk.split(b"\n")
        asked = CHUNK
        if not lines and len(chunk) == CHUNK:  # one long line: read it whole, up to a bound
            asked = LONGEST_LINE + 1
            chunk = self._chunk(asked) or b""
            *lines, _incomplete = chunk.split(b"\n")
            if not lines and len(chunk) > LONGEST_LINE:
                return self._skip(chunk)
        self.more = len(lines) > self.batch or len(chunk) == asked
        fresh = []
        for raw in lines[: self.batch]:
            self._file.offset += len(raw) + 1
            self._lines += 1
            try:
                parsed = self.parse(raw.decode("utf-8", "replace"), self._lines)
            except ReportError as e:
                self.error, self.more = str(e), False
                break
            if parsed is None:
                continue
            step, value = parsed
            if step not in self._seen:
                self._seen.add(step)
                fresh.append((step, value))
        return fresh

    def _skip(self, chunk: bytes) -> list[tuple[int, float]]:
        """Pass over (the rest of) a line longer than LONGEST_LINE, said once on stderr."""
        if not self._skipping:
            print(f"sweep: {self.path}: line {self._lines + 1} is longer than {LONGEST_LINE} "
                  "bytes: skipped", file=sys.stderr)
        end = chunk.find(b"\n")
        self._skipping = end < 0
        self._file.offset += len(chunk) if end < 0 else end + 1
        self._lines += 0 if end < 0 else 1
        self.more = True
        return []

    def parse(self, line: str, number: int) -> tuple[int, float] | None:
        """One line -> (step, value), or None for a line that reports nothing; ReportError
        says what is wrong with it."""
        return parse_report_line(line, number)

    def read_rest(self, limit: int = 1 << 26) -> list[tuple[int, float]]:
        """Every new step left (up to `limit` bytes), for a trial whose command exited."""
        fresh: list[tuple[int, float]] = []
        start = self._file.offset
        while self._file.offset - start < limit:
            fresh += self.read()
            if not self.more:
                break
        return fresh

    def _chunk(self, size: int) -> bytes | None:
        chunk = self._file.chunk(size)
        self.error = self.error or self._file.error
        return chunk
