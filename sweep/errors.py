"""The errors a user sees as one line."""

from __future__ import annotations


class SweepError(Exception):
    """A failure explained in one line; the CLI exits with `exit_code` and no traceback."""

    exit_code = 1


class UsageError(SweepError):
    """Bad input: a study file, a command-line value or the environment. Nothing was written."""

    exit_code = 2


class ConfigError(UsageError):
    """A study file that does not validate: `file: key: what is wrong`."""

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file, self.key, self.message = file, key, message
        super().__init__(f"{file}: {key}: {message}" if key else f"{file}: {message}")
