"""A fake clock and fake trial processes, to test the driver's loop in milliseconds.

`FakeClock.wait` jumps to the next scheduled event (or the timeout) instead of sleeping, and
`FakeSpawn` starts `FakeProcess`es that follow a `Script`: exit after so many seconds with a
code, a result file, report lines and stderr, as a trainer would; ignore SIGTERM; leave a
child behind. Files are real (in the trial directory), so `outcome` and the report reader run
as they do for real trials.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.gpus.pool import Lease, PidSource, Pool
from sweep.protocol import PARAMS_ENV
from sweep.trial.launch_plan import LaunchPlan


class FakeClock:
    """Time that passes only when the driver waits. `waits` counts the loop's wake-ups."""

    def __init__(self, max_waits: int = 100_000) -> None:
        self.t = 0.0
        self.waits = 0
        self.max_waits = max_waits
        self._woken = False
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run `action` once the clock reaches `when`."""
        heapq.heappush(self._events, (when, next(self._order), action))

    def wait(self, timeout: float | None) -> None:
        self.waits += 1
        if self.waits > self.max_waits:
            raise RuntimeError(f"the loop woke {self.waits} times: a busy loop")
        if self._woken:  # as the real clock's pipe: a wake while busy cuts the next wait short
            self._woken = False
            return
        until = self.t + timeout if timeout is not None else None
        if self._events and (until is None or self._events[0][0] <= until):
            when = max(self.t, self._events[0][0])
            self.t = when
            while self._events and self._events[0][0] <= when:
                heapq.heappop(self._events)[2]()
        elif until is not None:
            self.t = until
        else:
            raise RuntimeError("the loop would sleep forever")

    def wake(self) -> None:
        self._woken = True

    def close(self) -> None:
        pass


@dataclass
class Script:
    """What a fake trainer does. Times are seconds after its start."""

    runs: float = 1.0  # then the command exits with `code`
    code: int = 0
    result: dict[str, Any] | None = field(default_factory=lambda: {"score": 0.5})
    stderr: str = ""
    reports: list[tuple[float, int, float]] = field(default_factory=list)  # (time, step, value)
    ignores_term: bool = False  # exits only when SIGKILLed (after the grace period)
    leftover: float = 0.0  # a detached child lives this long after the command exits
    output: list[tuple[float, str]] = field(default_factory=list)  # (time, stdout line)


class FakeProcess:
    """A trial process on a `FakeClock`, following a `Script` (see
    `sweep.trial.process.Process`)."""

    _pids = itertools.count(10_000)

    def __init__(
        self, plan: LaunchPlan, grace: float, clock: FakeClock, script: Script,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.plan, self.grace, self.clock, self.script = plan, grace, clock, script
        self.on_change = on_change
        self.pid = next(self._pids)
        self.started = clock.now()
        self.result_at_end: tuple[str | None] | None = None  # read at the verdict
        self.exit_code: int | None = None
        self.command_exited = False
        self.ended = False
        self.ended_at: float | None = None
        self.lost = False
        self.signals: list[str] = []
        self._stopping = False
        for when, step, value in script.reports:
            clock.at(self.started + when, functools.partial(self._report, step, value))
        for when, line in script.output:
            clock.at(self.started + when, functools.partial(self._print, line))
        clock.at(self.started + script.runs, self._finish)

    def _report(self, step: int, value: float) -> None:
        if not self.command_exited:
            with open(self.plan.paths.reports, "a") as f:
                f.write(json.dumps({"step": step, "value": value}) + "\n")

    def _print(self, line: str) -> None:
        if not self.command_exited:
            with open(self.plan.paths.stdout, "a") as f:
                f.write(line + "\n")

    def _finish(self) -> None:
        if self.command_exited:
            return
        paths = self.plan.paths
        paths.stderr.write_text(self.script.stderr)
        if self.script.result is not None:
            paths.result.write_text(json.dumps(self.script.result))
        self._exit(self.script.code, min(self.script.leftover, self.grace))

    def _exit(self, code: int, linger: float = 0.0) -> None:
        if self.command_exited:
            return
        self.exit_code, self.command_exited = code, True
        self.on_change()
        if linger > 0:
            self.clock.at(self.clock.now() + linger, self._end)
        else:
            self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended, self.ended_at = True, self.clock.now()
            self.on_change()

    def stop(self) -> None:
        self.signals.append("TERM")
        if self._stopping:
            return
        self._stopping = True
        if self.script.ignores_term:
            self.clock.at(self.clock.now() + self.grace, lambda: self._kill(137))
        else:
            self._exit(143)

    def _kill(self, code: int) -> None:
        self._exit(code)
        self._end()

    def kill(self) -> None:
        self.signals.append("KILL")
        self._kill(137)

    def force_kill(self) -> None:
        self.signals.append("FORCE")
        self._kill(137)

    def tree_pids(self) -> set[int]:
        return set() if self.ended else {self.pid}

    @property
    def seen_pids(self) -> set[int]:
        return {self.pid}

    def wait(self, timeout: float | None = None) -> bool:
        return self.ended

    def close(self) -> None:
        pass


class FakeSpawn:
    """Starts `FakeProcess`es; `script(params)` says what each trial does. Keeps them all."""

    def __init__(self, clock: FakeClock, script: Callable[[dict[str, Any]], Script]) -> None:
        self.clock, self.script = clock, script
        self.processes: list[FakeProcess] = []

    def __call__(
        self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
        hold: tuple[int, ...] = (),
    ) -> FakeProcess:
        params = json.loads(Path(plan.env[PARAMS_ENV]).read_text())
        self.plan = plan  # the trial being started, for a script that depends on its device
        proc = FakeProcess(plan, grace, self.clock, self.script(params), on_change)
        self.processes.append(proc)
        return proc

    def most_at_once(self) -> int:
        """The most processes that were alive at the same moment."""
        edges = []
        for p in self.processes:
            edges += [(p.started, 1), (p.ended_at if p.ended_at is not None else float("inf"), -1)]
        return max(itertools.accumulate(d for _, d in sorted(edges))) if edges else 0


def lease(pool: Pool, trial: int, process: PidSource | None = None) -> Lease:
    """`pool.acquire()` bound to `trial` (and its process), as the driver does; AssertionError
    with the refusal if the pool has no room."""
    got = pool.acquire()
    assert isinstance(got, Lease), got
    got.bind(trial)
    if process is not None:
        got.attach(process)
    return got
