"""Placeholders in a study file's args, env and result file: `{trial_dir}` and the other
`PLACES`, filled per trial, and `$NAME` of the driver's environment."""

from __future__ import annotations

import re
from collections.abc import Mapping

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


def check(file: str, key: str, text: str, extra: tuple[str, ...] = ()) -> None:
    """`text` uses only known placeholders (`PLACES`, and `extra` where the key has more)."""
    known = (*PLACES, *extra)
    try:
        fill(text, {name: "" for name in known})
    except KeyError as e:
        raise ConfigError(file, key, f"unknown placeholder {{{e.args[0]}}}: use "
                          f"{', '.join('{' + p + '}' for p in known)}; a literal brace is "
                          "doubled ({{ }})") from None
