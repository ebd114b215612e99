"""What the verbs' arguments share: the types that check a value as it is parsed, the flags
every verb takes (`--debug`, `--storage`), and what to do about a file that cannot be
written."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias, TypeVar

Verbs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # where verbs go
N = TypeVar("N", int, float)


def gpu_list(text: str) -> list[int]:
    """`--gpus 0,1`: distinct device indices, at least one."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of GPU indices: {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"not a list of GPU indices: {text!r}")
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"a GPU listed twice: {text!r}")
    return ids


def positive(text: str) -> float:
    """A finite number above 0."""
    return _checked(text, float, lambda v: v > 0 and v != float("inf"), "a positive number")


def count(text: str) -> int:
    """A whole number of at least 1."""
    return _checked(text, int, lambda v: v >= 1, "a whole number of at least 1")


def _checked(text: str, kind: Callable[[str], N], ok: Callable[[N], bool], what: str) -> N:
    """`text` read as `kind`, if `ok` takes it; else the error naming `what` it must be."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
    return value


def common(verb: argparse.ArgumentParser, storage: bool = True) -> argparse.ArgumentParser:
    """`verb` with the flags every verb takes, after its own: `--debug`, and with `storage`
    `--storage`."""
    verb.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                      help="show tracebacks and debug logs")
    if storage:
        verb.add_argument("--storage", metavar="URL",
                          help="override study.storage (also $SWEEP_STORAGE)")
    return verb


def other_file(e: OSError, flag: str) -> str:
    """What to do when a file for the user cannot be written: name another with `flag`."""
    from sweep._core import UnsafePath

    if isinstance(e, UnsafePath):
        return f"give {flag} another file's name (sweep writes over no file it did not write)"
    return f"give {flag} a file you can write"
