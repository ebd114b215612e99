"""A table as wide as the terminal allows, for `sweep summary`: numbers never fold, headers
fold between their words, text folds; what still does not fit is left out and named."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sweep._core import names

HEADER_LINES = 3  # a header takes at most this many lines, its words (`a_`, `b`) whole
TEXT_WIDTH = 8  # a text cell folds down to this many characters; a number never folds
WHOLE = (names.IMAGE,)  # columns of text that never folds (an image ID, 12 hex digits)


@dataclass(frozen=True)
class _Fitted:
    """A table of `frame` as wide as the terminal allows: a number keeps its line (`1.785`,
    never `1.78` / `5`); a header folds between its words (`gpu_mem_` / `peak_mb`, at most
    HEADER_LINES lines), never inside one; text folds. Where even that is too wide, the
    rightmost columns but the first `keep` are left out, and a line under the table names
    them."""

    frame: pd.DataFrame
    title: str
    keep: int = 1

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        headers = [str(c).removeprefix("params_") for c in self.frame.columns]
        cells = [[_cell(v) for v in row] for row in self.frame.itertuples(index=False)]
        least, natural = [], []
        for i, head in enumerate(headers):
            column = [row[i] for row in cells]
            number = max((len(c) for c in column if _is_number(c)), default=0)
            text = max((len(c) for c in column if not _is_number(c)), default=0)
            natural.append(max(len(head), number, text, 1))
            folds = min(text, TEXT_WIDTH) if head not in WHOLE else text
            least.append(max(number, folds, _header_width(head), 1))
        shown = len(headers)
        while shown > self.keep and sum(least[:shown]) + 3 * shown + 1 > options.max_width:
            shown -= 1
        widths = _grow(least[:shown], natural[:shown], options.max_width - 3 * shown - 1)
        yield _rich_table(headers[:shown], [row[:shown] for row in cells], widths, self.title)
        if shown < len(headers):
            yield Text(f"{len(headers) - shown} more columns in a wider terminal and in the "
                       "CSV: " + ", ".join(headers[shown:]), style="dim")


def _words(head: str) -> list[str]:
    """A header's words, each with the `_` that ends it: `gpu_mem_peak_mb` -> `gpu_`,
    `mem_`, `peak_`, `mb`."""
    return re.findall(r"[^_]*_+|[^_]+", head) or [head]


def _header_lines(head: str, width: int) -> list[str]:
    """`head` in lines of at most `width` characters, broken between its words only (a
    word wider than `width` has a line of its own)."""
    lines: list[str] = []
    for word in _words(head):
        if lines and len(lines[-1]) + len(word) <= width:
            lines[-1] += word
        else:
            lines.append(word)
    return lines


def _header_width(head: str) -> int:
    """The narrowest width at which `head` takes at most HEADER_LINES lines, its words
    whole."""
    width = max(len(w) for w in _words(head))
    while len(_header_lines(head, width)) > HEADER_LINES:
        width += 1
    return width


def _grow(least: list[int], natural: list[int], room: int) -> list[int]:
    """Widths from `least` towards `natural`, one character to each column in turn, until
    `room` is used up."""
    widths = list(least)
    room -= sum(widths)
    while room > 0 and any(w < n for w, n in zip(widths, natural, strict=True)):
        for i, n in enumerate(natural):
            if room > 0 and widths[i] < n:
                widths[i] += 1
                room -= 1
    return widths


def table(frame: pd.DataFrame, title: str, keep: int = 1) -> Any:
    """`frame` as a table fitted to the terminal (a rich renderable), under `title`;
    its first `keep` columns are never left out."""
    return _Fitted(frame, title, keep)


def _rich_table(headers: list[str], cells: list[list[str]], widths: list[int],
                title: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for head, width in zip(headers, widths, strict=True):
        table.add_column(Text("\n".join(_header_lines(head, width)), no_wrap=True),
                         justify="right", overflow="fold", width=width)
    for row in cells:
        table.add_row(*(Text(c, no_wrap=_is_number(c)) for c in row))  # never markup
    return table


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
