"""What a user sees while a sweep runs: one line per event, and the live view drawn from a
`View` snapshot of the run (never from the driver itself)."""

from __future__ import annotations

import io

from rich.console import Console

from sweep.runner._events import Running, Started, View
from sweep.runner.progress import Progress


def plain_lines(params: dict[str, object]) -> list[str]:
    out = io.StringIO()
    with Progress(Console(file=out, width=120)) as progress:
        progress.started(Started(3, 0, params, 0.0))
    return out.getvalue().splitlines()


def test_a_categorical_value_with_a_newline_stays_on_its_started_line():
    """Issue 26 item 12: a newline in a categorical value broke the live "started" line."""
    lines = plain_lines({"opt": "adam\nw", "tag": "a\tb\x1b[31mred\r"})
    assert lines == ["trial 3 started on GPU 0: opt=adam\\nw tag=a\\tb\\x1b[31mred\\r"]


def test_text_that_looks_like_markup_is_shown_as_it_is():
    assert plain_lines({"opt": "[red]x[/red]", "n": 2}) == [
        "trial 3 started on GPU 0: opt=[red]x[/red] n=2"]


def test_the_live_view_is_drawn_from_a_snapshot():
    progress = Progress(Console(file=io.StringIO(), width=120))
    reads: list[int] = []

    def best() -> list[tuple[int, list[float]]]:
        reads.append(1)
        return [(2, [0.5])]

    view = View("demo", 10, 3, (Running(4, 1, {"opt": "a\nb", "lr": 0.001}, 0.0),),
                (0, 1), frozenset({0}), best)
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(progress.render(view))
    text = console.export_text()
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] == "demo: 3/10 finished, 1 running, best #2 0.5"
    assert lines[2].split() == ["0", "out", "of", "pool", "-", "-"]
    assert lines[3].split() == ["0", "idle", "-", "-"]
    row = lines[4].split()
    assert row[:2] == ["1", "4"] and row[-2:] == ["opt=a\\nb", "lr=0.001"]
    console.print(progress.render(view))  # within BEST_EVERY: storage is not read again
    assert reads == [1]
