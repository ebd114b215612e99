"""What the driver asks of a scheduler (`TrialScheduler`, Ray Tune's and syne-tune's name), and
the scheduler of a study without `study.scheduler` (`NoScheduler`: every hook leaves the run as
the policy has it).

The hooks, in the order of a trial's life: the run begins (`begin`); how many jobs may start
(`room`); under the budget lock, before and after an ask (`before_ask`, `after_ask`); where a
trial starts from (`on_start`, which may refuse it: `NotStarted`); what a trial does after its
results (`on_result`: go on, pause, or be replaced, `OnResult`); all its results read
(`results_read`); its processes gone (`ended`, which tidies the checkpoint disk: `tidy`); and
the run's last line (`last_line`). The driver never asks which scheduler it has.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Protocol

from sweep.schedulers.halving import NewConfiguration, Promote
from sweep.study import Asked
from sweep.trial import RunningTrial, Start, Stop

Job = Promote | NewConfiguration  # what a scheduler chose for a free device (`before_ask`)


class OnResult(enum.Enum):
    """What a trial does after a result (Ray's CONTINUE, PAUSE, STOP)."""

    GO_ON = "go on"
    PAUSE = "pause"  # stopped gently, told PRUNED: it may be promoted later
    REPLACE = "replace"  # stopped, told PRUNED: a PBT exploit of another lineage takes its place

    @property
    def stop(self) -> Stop | None:
        """The stop the trial is given (None: it goes on)."""
        return {OnResult.PAUSE: Stop.PAUSED, OnResult.REPLACE: Stop.REPLACED}.get(self)


class NotStarted(Exception):
    """An attempt not started that carries its lineage on (`on_start` refused it): it is told
    PRUNED, paused (`PAUSED_AT` set first), and its lineage goes on only if it is promoted or
    given back."""

    def __init__(self, number: int, origin: int) -> None:
        super().__init__(number, origin)
        self.number, self.origin = number, origin


class TrialScheduler(Protocol):
    """The hooks a scheduler is told of a run's trials at (see the module's docstring)."""

    @property
    def follows_results(self) -> bool:
        """It decides on every reported step (each is stored, not only a batch's last)."""
        ...

    @property
    def waits_on_running(self) -> bool:
        """The run waits while any trial of the study runs: its end may promote one."""
        ...

    def begin(self) -> None:
        """The run begins (its launcher ready): what the study file lacks for it is said."""

    def room(self, allowed: Callable[[], int]) -> int:
        """How many jobs may start now; `allowed`: the policy's room (n_trials)."""
        ...

    def before_ask(self) -> Job | None:
        """Under the budget lock, before an ask: what a free device gets. None: the ask takes
        what is queued, else study.enqueue's next, else the sampler's."""
        ...

    def after_ask(self, asked: Asked, job: Job | None) -> None:
        """`asked` was asked for `job` (still under the budget lock)."""

    def on_start(self, asked: Asked, start: Start) -> Start:
        """Where `asked` starts from (its lineage's lock held); NotStarted, a `LineageBusy`
        or `exploit_copy.CalledOff` if it does not start now."""
        ...

    def on_result(self, run: RunningTrial, steps: Sequence[int],
                  decide: bool = True) -> OnResult:
        """New steps stored for `run`; with `decide` (it still runs), what it does now."""
        ...

    def results_read(self, run: RunningTrial) -> None:
        """`run`'s command exited and all its results were read: it is about to be told."""

    def ended(self, number: int, abort: Callable[[], bool] = lambda: False) -> None:
        """Trial `number`'s processes are gone (`abort`: a signal came, give up waiting)."""

    def tidy(self, abort: Callable[[], bool] = lambda: False) -> None:
        """The checkpoint folders of lineages that can never continue removed."""

    def last_line(self, line: str, exit_code: int, stopped: bool = False) -> str:
        """The run's last line (`line`, of a run that exits with `exit_code`), as this
        scheduler counts (`stopped`: no new trials were to start: study.timeout, a signal, a
        give-up)."""
        ...


class NoScheduler:
    """A study without `study.scheduler`: every trial goes on, the policy's room stands, and
    nothing is kept or tidied."""

    follows_results = False
    waits_on_running = False

    def begin(self) -> None:
        pass

    def room(self, allowed: Callable[[], int]) -> int:
        return allowed()

    def before_ask(self) -> Job | None:
        return None

    def after_ask(self, asked: Asked, job: Job | None) -> None:
        pass

    def on_start(self, asked: Asked, start: Start) -> Start:
        return start

    def on_result(self, run: RunningTrial, steps: Sequence[int],
                  decide: bool = True) -> OnResult:
        return OnResult.GO_ON

    def results_read(self, run: RunningTrial) -> None:
        pass

    def ended(self, number: int, abort: Callable[[], bool] = lambda: False) -> None:
        pass

    def tidy(self, abort: Callable[[], bool] = lambda: False) -> None:
        pass

    def last_line(self, line: str, exit_code: int, stopped: bool = False) -> str:
        return line


NO_SCHEDULER: NoScheduler = NoScheduler()  # it keeps nothing: one serves every caller
