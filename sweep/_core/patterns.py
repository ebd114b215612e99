"""Stdout and stderr patterns (RE2, linear time): compiled with one-line reasons for what RE2
lacks, and searched over a trial's output within a time budget; `NUMBER` reads a number as
Python prints it."""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Collection
from typing import Any

from sweep._core.errors import short

NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:nan|inf)"


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


class PatternTimeout(ValueError):
    """The stdout patterns ran out of time before every metric was found."""


def compile_pattern(pattern: str) -> Any:
    r"""`pattern` compiled with RE2 for `parse_stdout`; PatternError says what is wrong.

    RE2 matches in time linear in the text, whatever the pattern. A pattern must also be a
    regular expression to Python's `re` and mean the same there, so what RE2 lacks
    (backreferences, lookaround, atomic groups, possessive quantifiers, conditionals, `\Z`) is
    refused, as is a pattern of more than MAX_PROGRAM RE2 instructions or without named groups.
    """
    cut = short(pattern, 60)
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
                number = finite_number(_float(raw))
                if number is not None:
                    found[key] = number
                elif key not in seen and rejected is not None:
                    rejected[key] = short(raw, 40)
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


def finite_number(value: Any) -> float | None:
    """`value` as a finite float, or None (booleans, strings, NaN, inf, too large)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None

