"""What a user sees while a sweep runs: a live table on a terminal, one line per event elsewhere."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from optuna.trial import TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweep.runner._events import Events, Finished, Started, View

if TYPE_CHECKING:
    from sweep.gpus import Monitor

# s between reads of the best trials for the live view (a query over all of the study's
# finished trials: at 10,000 trials, not one per trial that ends)
BEST_EVERY = 2.0
RENDER_EVERY = 0.1  # s between redraws of the live view when something changed


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _one_line(text: str) -> str:
    """`text` on one line: each control character (a newline, a tab, a terminal escape)
    written as its escape sequence, as Python writes it in a string."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _params(params: Mapping[str, object], width: int = 60) -> str:
    """`k=v k=v ...` on one line, cut to `width` (shown as plain text, never as markup)."""
    text = " ".join(_one_line(f"{k}={_fmt(v) if isinstance(v, float) else v}")
                    for k, v in params.items())
    return text if len(text) <= width else text[: width - 1] + "…"


class Progress(Events):
    """Prints each start and finish; on a terminal also keeps a live table of the GPUs."""

    def __init__(self, console: Console | None = None, monitor: Monitor | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._plain = not self.console.is_terminal  # lines as plain text: a log, a pipe
        self.monitor = monitor
        self.live: Live | None = None
        self._last_render = 0.0
        self._changed = True
        self.best: str = "-"
        self._best_read = -math.inf  # when the best trials were last read from storage

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self.live = Live(console=self.console, auto_refresh=False, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def _say(self, line: Text) -> None:
        """One line: through rich on a terminal, as plain text elsewhere (what rich writes
        there without wrapping, at a tenth of its cost: two lines per trial)."""
        if self._plain:
            self.console.file.write(line.plain + "\n")
        else:
            self.console.print(line)

    def started(self, trial: Started) -> None:
        self._changed = True
        self._say(Text.assemble(
            (f"trial {trial.number}", "cyan"),
            f" started on {trial.where}: "
            f"{_params(trial.params, max(60, self.console.width - 30))}",
        ))

    def finished(self, done: Finished) -> None:
        self._changed = True
        colour = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow"}.get(
            done.state, "red")
        values = ", ".join(_fmt(v) for v in done.values or [])
        if done.state is TrialState.PRUNED:
            values = f"pruned at {values}"
        detail = values or (done.fail_reason or "")
        self._say(Text.assemble(
            (f"trial {done.number} {done.state.name}", colour),
            f" on {done.where} in {done.seconds:.1f} s: {detail}",
        ))

    def message(self, text: str) -> None:
        self._say(Text(text, style="yellow"))

    def tick(self, view: View) -> None:
        if self.live is None:
            return
        # at most 10 redraws a second while trials come and go, one every 0.5 s otherwise
        if time.monotonic() - self._last_render < (RENDER_EVERY if self._changed else 0.5):
            return
        self._last_render, self._changed = time.monotonic(), False
        self.live.update(self.render(view), refresh=True)

    def render(self, view: View) -> Group:
        """The live view: budget, best value, and each GPU with its trial and load."""
        if time.monotonic() - self._best_read >= BEST_EVERY:
            self._best_read = time.monotonic()
            try:
                best = view.best()
            except Exception:  # a storage hiccup costs one refresh of the view, not the run
                best = []
            if best:
                self.best = "; ".join(f"#{n} {', '.join(_fmt(v) for v in values)}"
                                      for n, values in best)
        head = Text.assemble(
            (view.study, "bold"),
            f": {view.finished}/{view.n_trials} finished, {len(view.running)} "
            f"running, best {self.best}",
        )
        table = Table(box=None, pad_edge=False)
        for col in ("GPU", "trial", "elapsed", "util %", "mem MB", "params"):
            table.add_column(col)
        for index in view.devices:
            runs = [r for r in view.running if r.gpu == index]
            reading = self.monitor.latest.get(index) if self.monitor else None
            util = _fmt(reading.util_gpu) if reading else "-"
            mem = _fmt(reading.mem_used_mb) if reading else "-"
            if index in view.quarantined:
                table.add_row(str(index), "[red]out of pool[/]", "", util, mem, "")
            for r in runs or [None]:  # type: ignore[list-item]
                if r is None:
                    table.add_row(str(index), "[dim]idle[/]", "", util, mem, "")
                else:
                    table.add_row(
                        str(index), str(r.number), f"{r.elapsed:.0f} s",
                        util, mem, Text(_params(r.params, max(40, self.console.width - 40))),
                    )
        return Group(head, table)
