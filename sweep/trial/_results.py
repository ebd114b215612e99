"""What a trainer leaves for the driver, read: its result file (`parse_result`, `lookup`) and
its report file (`parse_report_line`, `FollowedFile`, `ReportReader`), never blocking, with
one-line reasons for what cannot be used."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any, Protocol

from sweep._core import finite_number, short


class ResultError(ValueError):
    """The result file cannot give the objective; `str(e)` is the trial's fail_reason."""


MAX_EXTRAS = 64  # other numeric keys of a result kept with the trial


MAX_EXTRA_KEY = 100  # characters of such a key (databases cap an attribute's name)


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
            keys = short(", ".join(sorted(map(str, data))) or "none", 80)
            raise ResultError(f"metric {name!r} missing from the result file (keys: {keys})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"metric {name!r} is not a number: {short(repr(value), 80)}")
        number = finite_number(value)
        if number is None:
            raise ResultError(f"metric {name!r} is not a finite number: {short(str(value), 80)}")
        values.append(number)
    extras: dict[str, float] = {}
    for key, value in data.items():
        number = finite_number(value)
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


class ReportError(ValueError):
    """A report line sweep cannot use; `str(e)` is the trial's fail_reason."""


def parse_report_line(line: str, number: int) -> tuple[int, float]:
    """One line of the report file -> (step, value); ReportError says what is wrong."""
    where = f"report line {number}"
    try:
        item = _loads(line)
    except (ValueError, RecursionError):
        raise ReportError(f"{where} is not JSON: {short(line.strip(), 60)}") from None
    if not isinstance(item, dict) or "step" not in item or "value" not in item:
        raise ReportError(f'{where} must be {{"step": N, "value": X}}: {short(line.strip(), 60)}')
    step, value = item["step"], item["value"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ReportError(f"{where}: step must be a whole number from 0 to {MAX_STEP} "
                          f"(got {short(repr(step), 40)})")
    finite = finite_number(value)
    if finite is None:
        raise ReportError(f"{where}: value must be a finite number (got {short(repr(value), 40)})")
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
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.error = (f"{self.what} is a symbolic link, not a regular file"
                          if e.errno == errno.ELOOP else f"cannot read {self.what} ({e.strerror})")
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self.error = f"{self.what} is not a regular file"
            return None
        with os.fdopen(fd, "rb") as f:
            f.seek(self.offset)
            return f.read(size)


class Draining(Protocol):
    """A reader of a followed file that reads a bounded batch a call."""

    more: bool

    def read(self) -> list[tuple[int, float]]: ...


def drain(reader: Draining, file: FollowedFile, limit: int) -> list[tuple[int, float]]:
    """Every new step `reader` has left in `file`, a batch at a time, up to `limit` bytes
    (a trial whose command exited: nothing more comes)."""
    fresh: list[tuple[int, float]] = []
    start = file.offset
    while file.offset - start < limit:
        fresh += reader.read()
        if not reader.more:
            break
    return fresh


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
        self.counted = False  # a step of a counted value (a subclass without a step key)
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
        self.more = end >= 0 or len(chunk) >= CHUNK  # at the end of the file: nothing waits
        return []

    def parse(self, line: str, number: int) -> tuple[int, float] | None:
        """One line -> (step, value), or None for a line that reports nothing; ReportError
        says what is wrong with it."""
        return parse_report_line(line, number)

    def read_rest(self, limit: int = 1 << 26) -> list[tuple[int, float]]:
        """Every new step left (up to `limit` bytes), for a trial whose command exited."""
        return drain(self, self._file, limit)

    def _chunk(self, size: int) -> bytes | None:
        chunk = self._file.chunk(size)
        self.error = self.error or self._file.error
        return chunk


MAX_STEP = 2**31 - 1  # what every Optuna storage keeps as a step


def _loads(text: str) -> Any:
    """`json.loads`, with integers too long for Python's int() read as infinity (they are no
    finite metric) instead of an error for the whole document."""
    return json.loads(text, parse_int=lambda s: int(s) if len(s) < 4000 else math.inf)
