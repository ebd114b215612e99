"""The errors a user sees, one line each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SweepError(Exception):
    """A failure explained in one line; the CLI exits with `exit_code` and no traceback."""

    exit_code = 1


class UsageError(SweepError):
    """Bad input: a study file, a command-line value or the environment. Nothing was written."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a study file: `file: key: what is wrong`, with what to do."""

    file: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" if self.key else (
            f"{self.file}: {self.message}")


class ConfigError(UsageError):
    """A study file that does not validate: every `Problem` found, one line each (`file`,
    `key` and `message` are the first's)."""

    def __init__(self, file: str, key: str, message: str, *more: Problem) -> None:
        self.problems = (Problem(file, key, message), *more)
        self.file, self.key, self.message = file, key, message
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def of(cls, problems: Sequence[Problem]) -> ConfigError:
        """One error for `problems` (at least one)."""
        first, *rest = problems
        return cls(first.file, first.key, first.message, *rest)


def short(text: str, width: int = 60) -> str:
    """`text` cut to `width` characters: error messages never echo unbounded input."""
    return text if len(text) <= width else text[: width - 1] + "…"


def clip(text: str, width: int = 400) -> str:
    """`text` on one line, whole when it has at most `width` characters; else cut at the last
    space before `width`, never inside a word, and marked `…` (another program's message
    quoted in an error: bounded, still readable)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " …"
