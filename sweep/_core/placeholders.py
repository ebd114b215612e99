"""Placeholders in a study file's args, env and result file: `{trial_dir}` and the other
`PLACES`, filled per trial, and `$NAME` of the driver's environment."""

from __future__ import annotations

import re
from collections.abc import Container, Mapping

from sweep._core.errors import ConfigError

# {checkpoint_dir}: the trial's lineage's checkpoint folder (see `lineage`)
PLACES = ("trial_dir", "trial_number", "study_dir", "output_dir", "checkpoint_dir")


_TOKEN = re.compile(
    r"\{\{|\}\}|\$\$|\$\{(?P<braced>[A-Za-z_]\w*)\}|\$(?P<bare>[A-Za-z_]\w*)"
    r"|\{(?P<place>[^{}]*)\}"
)


def fill(text: str, places: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """`text` with its placeholders filled ({trial_dir}, ...; `{{` and `}}` are braces) and,
    given `env`, `$NAME` / `${NAME}` of it expanded (`$$` is a dollar; unknown names stay).

    An unknown placeholder raises KeyError."""

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if m.group("place") is not None:
            return places[m.group("place")]
        if env is None:
            return token
        if token == "$$":
            return "$"
        return env.get(m.group("braced") or m.group("bare"), token)

    return _TOKEN.sub(one, text)


def variables(text: str) -> list[str]:
    """The names `text` expands as `$NAME` or `${NAME}` (not a `$$` dollar), in order."""
    return [m.group("braced") or m.group("bare") for m in _TOKEN.finditer(text)
            if m.group("braced") or m.group("bare")]


def check_variables(file: str, key: str, text: str, known: Container[str]) -> None:
    """Every `$NAME` in `text` is one the trial's environment will have (`known`): an unset
    one would reach the trainer as written."""
    unset = [name for name in variables(text) if name not in known]
    if unset:
        name = unset[0]
        raise ConfigError(file, key, f"${name} is not set in the environment sweep runs in "
                          f"(it would reach the trainer as the text ${name}): export {name} "
                          f"before sweep runs, set it in trainer.env, or write $${name} for "
                          "a literal dollar")


def check(file: str, key: str, text: str, extra: tuple[str, ...] = ()) -> None:
    """`text` uses only known placeholders (`PLACES`, and `extra` where the key has more)."""
    known = (*PLACES, *extra)
    try:
        fill(text, {name: "" for name in known})
    except KeyError as e:
        raise ConfigError(file, key, f"unknown placeholder {{{e.args[0]}}}: use "
                          f"{', '.join('{' + p + '}' for p in known)}; a literal brace is "
                          "doubled ({{ }})") from None
