"""Where a running trial's intermediate values come from (`trainer.report`): readers.

Every reader has the interface the driver follows (`protocol.ReportReader`'s): `read()`
returns the new `(step, value)` pairs, a bounded batch per pass, and sets `more` when some
were left for the next pass; `read_rest()` reads what is left once the command exited; the
first value that cannot be used sets `error` (the trial's fail_reason: a diverged value is
reported as such) and stops the reading. A step already seen is ignored. None blocks.
A reader whose values carry no step counts them (`counted` says it has); the count goes on
from `counted_from`, the step a resumed attempt's lineage had reached, so a continuation's
first counted value is the step after its lineage's last, not step 1 again.

- `ReportReader`: the JSON lines `sweep.protocol.report` writes to `$SWEEP_REPORT_FILE` (the
  default);
- `OutputReader`: patterns over the trainer's stdout.log or stderr.log;
- `KeyedLinesReader`: a JSON-lines file the script writes anyway, keys named;
- `TensorboardReader`: one tag's scalars from the event files a `SummaryWriter` writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from sweep._core import LINE_TAIL, compile_pattern, fill
from sweep.spec import ReportSection
from sweep.trial._launcher_echo import MAX_COPY, START, echo_verdict
from sweep.trial._results import (
    CHUNK,
    MAX_STEP,
    MISSING,
    FollowedFile,
    ReportError,
    ReportReader,
    drain,
    lookup,
)
from sweep.trial.folders import TrialPaths

BATCH = 100  # values passed on per pass at most


class IntermediateValues(Protocol):
    """What the driver follows while a trial runs: the intermediate values of its
    `trainer.report` source (the report file by default)."""

    @property
    def error(self) -> str | None: ...

    more: bool
    counted: bool  # some of its steps are counts of values, not the trainer's own

    def read(self) -> list[tuple[int, float]]: ...

    def read_rest(self, limit: int = ...) -> list[tuple[int, float]]: ...

    def watched(self) -> list[Path]: ...  # the files it reads now, for `trainer.hang_after`


def reader_for(report: ReportSection | None, paths: TrialPaths, metric: str,
               places: Mapping[str, str], cwd: Path | None = None,
               counted_from: int = 0) -> IntermediateValues:
    """The reader of `trainer.report` for the trial of `paths` (`places` fills its
    placeholders; a relative path is the trial's, from `cwd`, its `trainer.workdir`, as for
    `result.file`); without `trainer.report`, the report file of `$SWEEP_REPORT_FILE`.
    Counted steps start after `counted_from` (the step a resumed lineage had reached)."""
    if report is None:
        return ReportReader(paths.reports)
    if report.stream is not None:
        log = paths.stdout if report.stream == "stdout" else paths.stderr
        return OutputReader(log, report.patterns, metric, name=report.stream,
                            counted_from=counted_from)

    def where(text: str) -> Path:
        filled = Path(fill(text, places))
        return (cwd / filled if cwd is not None else filled).absolute()

    if report.tensorboard is not None:
        return TensorboardReader(where(report.tensorboard.dir), report.tensorboard.tag)
    assert report.file is not None
    return KeyedLinesReader(where(report.file), report.step or "step", report.value or metric,
                            counted_from=counted_from)


def _value(raw: Any, where: str) -> float:
    """`raw` as a finite float; ReportError says when it diverged or is no number."""
    if isinstance(raw, bool):
        raise ReportError(f"{where}: the value is not a number ({raw!r})")
    try:
        number = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise ReportError(f"{where}: the value is not a number ({_cut(repr(raw))})") from None
    if not math.isfinite(number):
        raise ReportError(f"{where}: the value diverged ({_cut(str(raw).strip())})")
    return number


def _step(raw: Any, where: str) -> int:
    """`raw` as a step Optuna stores; ReportError otherwise."""
    try:
        step = int(raw) if isinstance(raw, str) else raw
    except ValueError:
        step = None
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ReportError(f"{where}: step must be a whole number from 0 to {MAX_STEP} "
                          f"(got {_cut(repr(raw))})")
    return step


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


_LINE = re.compile(rb"([^\r\n]*)[\r\n]+")  # `\r` ends a line too (progress bars)


class OutputReader:
    """Intermediate values matched in a trainer's output log, line by line.

    Each pattern has a named group for the value (`value`, or the study's metric) and
    optionally `step`; without it the step is the count of values matched so far (1, 2, ...,
    after `counted_from`).
    A pattern sees a line's last LINE_TAIL characters, as `result.stdout` patterns do. At most
    CHUNK bytes are searched and BATCH values passed on per pass; a line still being written
    waits for its end.

    In stderr, the values end where `accelerate launch` (1.16) repeats the trainer's last lines
    after it ended (`launcher_echo`): a line starting `RuntimeError: ` waits until what follows
    it shows whether it begins that copy (or until the command exited).
    """

    def __init__(self, path: Path, patterns: list[str], metric: str, name: str = "stdout",
                 batch: int = BATCH, counted_from: int = 0) -> None:
        self.name, self.batch = name, batch
        self._file = FollowedFile(path, f"{path.name}")
        self._path = path
        self.more = False
        self._patterns = [compile_pattern(p) for p in patterns][::-1]  # the last one wins
        self._metric = metric
        self._line = 0
        self._count = counted_from
        self.counted = False
        self._seen: set[int] = set()
        self._echoes = name == "stderr"  # the launcher's copy can follow (see the class)
        self._before = bytearray()  # the last lines read, that a copy would repeat
        self._ended = False  # the launcher's copy was reached: nothing after it is the trainer's
        self._exited = False  # the command exited: a line that waits for its verdict waits no more

    @property
    def error(self) -> str | None:
        return self._file.error

    def _echo_at(self, start: int) -> bool | None:
        """`echo_verdict` of the line `start` bytes past the offset read to."""
        offset = self._file.offset
        self._file.offset += start
        try:
            after = self._file.chunk(MAX_COPY + CHUNK) or b""
        finally:
            self._file.offset = offset
        verdict = echo_verdict(self._before.decode("utf-8", "replace"),
                               after.decode("utf-8", "replace"))
        return False if verdict is None and self._exited else verdict

    def read(self) -> list[tuple[int, float]]:
        self.more = False
        if self.error is not None or self._ended:
            return []
        chunk = self._file.chunk()
        if not chunk:
            return []
        fresh: list[tuple[int, float]] = []
        end = 0
        complete = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1  # what follows waits
        for line in _LINE.finditer(chunk, 0, complete):
            if self._echoes and line.group(1).startswith(START.encode()):
                verdict = self._echo_at(line.start())
                if verdict is not False:  # the copy (nothing more is the trainer's), or wait
                    self._ended = bool(verdict)
                    self._file.offset += line.start()
                    return fresh
            end = line.end()
            if self._echoes:
                self._before += line.group(0)
                del self._before[:-MAX_COPY - CHUNK]
            self._line += 1
            try:
                found = self._match(line.group(1)[-4 * LINE_TAIL:].decode("utf-8", "replace"))
            except ReportError as e:
                self._file.error = str(e)
                self._file.offset += end
                return fresh
            if found is not None and found[0] not in self._seen:
                self._seen.add(found[0])
                fresh.append(found)
                if len(fresh) >= self.batch:
                    self.more = True
                    break
        if end == 0 and len(chunk) == CHUNK:  # one line longer than a chunk: keep its end
            end = CHUNK - LINE_TAIL
        self._file.offset += end
        self.more = self.more or len(chunk) == CHUNK
        return fresh

    def _match(self, line: str) -> tuple[int, float] | None:
        line = line[-LINE_TAIL:]
        for pattern in self._patterns:
            match = pattern.search(line)
            if match is None:
                continue
            groups = match.groupdict()
            raw = groups.get(self._metric, groups.get("value"))
            if raw is None:
                continue
            where = f"{self.name} line {self._line}"
            value = _value(raw, where)
            self._count += 1
            step = groups.get("step")
            if step is not None:
                return _step(step, where), value
            self.counted = True
            return self._count, value
        return None

    def watched(self) -> list[Path]:
        return [self._path]

    def read_rest(self, limit: int = 1 << 26) -> list[tuple[int, float]]:
        """Every new value left (up to `limit` bytes), for a trial whose command exited."""
        self._exited = True
        return drain(self, self._file, limit)


class KeyedLinesReader(ReportReader):
    """A JSON-lines file the script appends anyway: `value` and `step` name its keys (a
    dotted name reads a nested one). A line without the value key reports nothing (a log of
    several kinds of line); a line without the step key takes the count of values so far
    (after `counted_from`)."""

    def __init__(self, path: Path, step: str, value: str, batch: int = BATCH,
                 counted_from: int = 0) -> None:
        super().__init__(path, batch)
        self.step_key, self.value_key = step, value
        self._count = counted_from

    def parse(self, line: str, number: int) -> tuple[int, float] | None:
        where = f"{self.path.name} line {number}"
        if not line.strip():
            return None
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise ReportError(f"{where} is not JSON: {_cut(line.strip(), 60)}") from None
        if not isinstance(item, dict):
            return None
        raw = lookup(item, self.value_key)
        if raw is MISSING:
            return None
        value = _value(raw, where)
        self._count += 1
        step = lookup(item, self.step_key)
        if step is MISSING:
            self.counted = True
            return self._count, value
        return _step(step, where), value


class TensorboardReader:
    """The scalars of `tag` in the TensorBoard event files under `folder` (any depth: HF and
    Lightning write into a run's subfolder), with their own steps, read incrementally through
    tensorboard's `EventFileLoader`. At most BATCH values are passed on per pass."""

    def __init__(self, folder: Path, tag: str, batch: int = BATCH) -> None:
        self.folder, self.tag, self.batch = folder, tag, batch
        self.error: str | None = None
        self.more = False
        self.counted = False  # its steps are the event files' own
        self._loaders: dict[Path, Any] = {}
        self._events: dict[Path, Any] = {}
        self._seen: set[int] = set()

    def read(self) -> list[tuple[int, float]]:
        self.more = False
        if self.error is not None:
            return []
        fresh: list[tuple[int, float]] = []
        for path in self._files():
            for step, value in self._scalars(path, self.batch - len(fresh)):
                if step not in self._seen:
                    self._seen.add(step)
                    fresh.append((step, value))
            if self.error is not None:
                break
            if len(fresh) >= self.batch:
                self.more = True
                break
        return fresh

    def read_rest(self, limit: int = 1 << 20) -> list[tuple[int, float]]:
        """Every new value left (up to `limit` of them), for a trial whose command exited."""
        fresh: list[tuple[int, float]] = []
        while len(fresh) < limit:
            fresh += self.read()
            if not self.more:
                break
        return fresh

    def watched(self) -> list[Path]:
        return self._files()

    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.rglob("*tfevents*") if p.is_file())

    def _scalars(self, path: Path, room: int) -> list[tuple[int, float]]:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util

        if path not in self._loaders:
            self._loaders[path] = EventFileLoader(str(path))
        found: list[tuple[int, float]] = []
        events = 0
        while events < room * 10 and len(found) < room:
            if path not in self._events:
                self._events[path] = self._loaders[path].Load()
            event = next(self._events[path], None)
            if event is None:
                del self._events[path]  # at the end for now: a new Load() goes on from here
                break
            events += 1
            for value in event.summary.value:
                if value.tag != self.tag:
                    continue
                where = f"tensorboard tag {self.tag!r} at step {event.step}"
                try:
                    raw = (value.simple_value if value.HasField("simple_value")
                           else tensor_util.make_ndarray(value.tensor).item())
                    found.append((_step(int(event.step), where), _value(raw, where)))
                except ReportError as e:
                    self.error = str(e)
                    return found
                except (ValueError, TypeError):
                    self.error = f"{where}: not a scalar"
                    return found
        else:
            self.more = True
        return found
