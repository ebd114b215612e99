"""What a user sees while a sweep runs: a live table on a terminal, one line per event elsewhere."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweep.events import Events, Finished, Started

if TYPE_CHECKING:
    from sweep.driver import Driver
    from sweep.monitor import Monitor

# s between reads of the best trials for the live view (a query over all of the study's
# finished trials: at 10,000 trials, not one per trial that ends)
BEST_EVERY = 2.0
RENDER_EVERY = 0.1  # s between redraws of the live view when something changed


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


def _params(params: dict[str, object], width: int = 60) -> str:
    text = " ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in params.items())
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
        colour = {"COMPLETE": "green", "PRUNED": "yellow"}.get(done.state, "red")
        values = ", ".join(_fmt(v) for v in done.values or [])
        if done.state == "PRUNED":
            values = f"pruned at {values}"
        detail = values or (done.fail_reason or "")
        self._say(Text.assemble(
            (f"trial {done.number} {done.state}", colour),
            f" on {done.where} in {done.seconds:.1f} s: {detail}",
        ))

    def message(self, text: str) -> None:
        self._say(Text(text, style="yellow"))

    def tick(self, driver: Driver) -> None:
        if self.live is None:
            return
        # at most 10 redraws a second while trials come and go, one every 0.5 s otherwise
        if time.monotonic() - self._last_render < (RENDER_EVERY if self._changed else 0.5):
            return
        self._last_render, self._changed = time.monotonic(), False
        self.live.update(self.render(driver), refresh=True)

    def render(self, driver: Driver) -> Group:
        """The live view: budget, best value, and each GPU with its trial and load."""
        spec = driver.spec
        if time.monotonic() - self._best_read >= BEST_EVERY:
            self._best_read = time.monotonic()
            try:
                best = driver.store.best()
            except Exception:  # a storage hiccup costs one refresh of the view, not the run
                best = []
            if best:
                self.best = "; ".join(f"#{n} {', '.join(_fmt(v) for v in values)}"
                                      for n, values in best)
        counts = driver.counts()
        head = Text.assemble(
            (spec.study.name, "bold"),
            f": {counts.finished}/{spec.study.n_trials} finished, {len(driver.running)} "
            f"running, best {self.best}",
        )
        table = Table(box=None, pad_edge=False)
        for col in ("GPU", "trial", "elapsed", "util %", "mem MB", "params"):
            table.add_column(col)
        now = time.time()
        for device in driver.pool.devices:
            runs = [r for r in driver.running.values() if r.device == device.index]
            reading = self.monitor.latest.get(device.index) if self.monitor else None
            util = _fmt(reading.util_gpu) if reading else "-"
            mem = _fmt(reading.mem_used_mb) if reading else "-"
            if device.index in driver.pool.quarantined:
                table.add_row(str(device.index), "[red]out of pool[/]", "", util, mem, "")
            for r in runs or [None]:  # type: ignore[list-item]
                if r is None:
                    table.add_row(str(device.index), "[dim]idle[/]", "", util, mem, "")
                else:
                    table.add_row(
                        str(device.index), str(r.number), f"{now - r.process.started:.0f} s",
                        util, mem, Text(_params(r.params, max(40, self.console.width - 40))),
                    )
        return Group(head, table)
