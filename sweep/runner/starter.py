"""Starting one trial the driver has asked and leased devices for: its checkpoint folder, its
launch plan, its trial folder and `env.json`, the reader of its intermediate values and the
watch of its output, then its spawn, all in one `RunningTrial`.

The driver asks (under the budget lock) and tells; the starter only prepares and spawns. A
`folders.TrialFileError` means nothing was spawned and the output_dir is to blame (full,
read-only, removed, or something sweep did not make in the way); `LineageBusy` that another
process still holds the lineage's folder (`lineage_lock`): nothing was touched, the attempt is to
be started later; any other error, nothing was spawned either. A dry run (`dry`) takes the same
path, writes nothing and spawns nothing: its trial's process is an `Unspawned`, which holds the
plan a run would have started.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.gpus import Lease
from sweep.launch import Launcher, RunRecord, write_trial
from sweep.runner._resume_check import ResumeCheck
from sweep.schedulers import NO_SCHEDULER, TrialScheduler
from sweep.spec import Spec
from sweep.study import Asked
from sweep.trial import (
    LaunchPlan,
    RunningTrial,
    Spawn,
    command_script,
    folders,
    hang,
    intermediate,
    launch_plan,
    lineage,
    lineage_lock,
)

POLL_SECONDS = 0.5  # how often a running trial's reports are read, and its output looked at


class Starter:
    """Prepares and spawns the trials of one run (`launcher` is the run's, made once)."""

    def __init__(self, spec: Spec, launcher: Launcher, own: Path, now: Callable[[], float],
                 wake: Callable[[], None], record: RunRecord | None = None,
                 note: Callable[[Any, Mapping[str, Any]], None] | None = None,
                 scheduler: TrialScheduler = NO_SCHEDULER, resume: ResumeCheck | None = None,
                 dry: bool = False, say: Callable[[str], None] = lambda _: None) -> None:
        self.spec, self.launcher, self.own = spec, launcher, own
        self.dry = dry  # a dry run's: nothing is written, nothing spawned
        self.now, self.wake = now, wake
        self.record, self.note = record, note  # env.json's shared part, and where its attrs go
        # the scheduler's word on where an attempt starts from, then the resume check's note
        # of what its first step must come after (none in a dry run)
        self.scheduler, self.resume = scheduler, resume
        self.say, self._said_unlocked = say, False  # what the user is told goes to `say`

    def start(self, asked: Asked, lease: Lease, port: int | None) -> RunningTrial:
        """`asked`'s trial on `lease` (bound to it), spawned, with all it needs followed."""
        spec, line = self.spec, asked.lineage
        params = {**asked.params, **spec.fixed}
        with self._lineage(line) as (start, hold):
            return self._start(asked, lease, port, params, start, hold)

    @contextlib.contextmanager
    def _lineage(self, line: lineage.Lineage) -> Iterator[tuple[lineage.Start, tuple[int, ...]]]:
        """The attempt's start in its lineage's folder, prepared under the lineage's lock, and
        the lock's descriptor for the guard (closed here after the block: the guard holds
        it). LineageBusy, with nothing touched, if another process holds it."""
        spec = self.spec
        if self.dry:  # what a run would find; nothing made
            yield lineage.planned(spec.output_dir, line), ()
            return
        folders.ensure_driver_dir(spec, self.own)
        try:
            lock: int | None = folders.take_lineage_lock(spec.output_dir, line)
        except lineage_lock.Unsupported as e:
            lock = -1  # started unlocked
            if not self._said_unlocked:
                self._said_unlocked = True
                self.say(f"{e}: two attempts of one lineage are not kept from running at once "
                         "on this file system (mount it with locking)")
        if lock is None:
            raise lineage_lock.LineageBusy(
                line.origin, lineage_lock.lock_path(spec.output_dir, line.origin))
        try:
            start = folders.prepare_checkpoint_dir(spec.output_dir, line)
            yield start, (lock,) if lock >= 0 else ()
        finally:
            if lock >= 0:
                os.close(lock)

    def _start(self, asked: Asked, lease: Lease, port: int | None, params: dict[str, Any],
               start: lineage.Start, hold: tuple[int, ...]) -> RunningTrial:
        spec, line = self.spec, asked.lineage
        start = self.scheduler.on_start(asked, start)
        if self.resume is not None:
            self.resume.started(asked, start)
        plan = self.launcher.plan(asked.number, params, lease.device, ",".join(lease.pins),
                                  port, start=start)
        secrets = command_script.arg_secrets(spec.trainer.args, os.environ)
        before = None if self.dry else folders.prepare_trial_dir(
            plan, launch_plan.script_params(params, spec.params), secrets)
        if self.record is not None:
            write_trial(self.record, plan, asked.number, lease.devices, secrets)
            if self.note is not None:
                self.note(asked.trial, self.record.attrs())
        single = len(spec.study.objective_metrics) == 1  # Optuna prunes one objective only
        reports = intermediate.reader_for(
            spec.trainer.report, plan.paths, spec.study.objective_metrics[0],
            {**launch_plan.spec_places(spec), "trial_dir": str(plan.paths.dir),
             "trial_number": str(asked.number), **lineage.places(start)},
            plan.cwd, start.after if start.after is not None
            else asked.reached if start.resume else 0) if single else None
        spawn: Spawn = Unspawned if self.dry else self.launcher.spawn
        proc = spawn(plan, spec.trainer.stop_grace, self.wake, (*lease.fds(), *hold))
        try:  # nothing may run that no record follows: a failure from here kills it
            lease.attach(proc)
            watch = None
            if spec.trainer.hang_after is not None:
                paths = plan.paths
                watch = hang.OutputWatch(
                    sorted({paths.stdout, paths.stderr, paths.reports, paths.result,
                            plan.result}),
                    self.now(), spec.trainer.hang_after, POLL_SECONDS,
                    reports.watched if reports is not None else tuple)
            # the wait for a fork server's imports is not the trial's time
            began = self.now()
            deadline = began + spec.trainer.timeout if spec.trainer.timeout else None
            return RunningTrial(asked.trial, asked.number, params, line, lease, proc,
                                spec.trainer.stop_grace, deadline, reports, watch,
                                result_before=before, resumed=start.resume, began=began)
        except BaseException:
            proc.force_kill()
            proc.wait(5)
            proc.close()
            raise


class Unspawned:
    """A dry run's trial process (a `process.Process`): the plan a run would have started,
    never started; it is not followed."""

    pid = 0
    lost = False
    exit_code: int | None = None
    command_exited = ended = False
    result_at_end: tuple[str | None] | None = None

    def __init__(self, plan: LaunchPlan, grace: float, on_change: Callable[[], None],
                 hold: Sequence[int] = ()) -> None:
        self.plan = plan
        self.started = time.time()

    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def force_kill(self) -> None: ...
    def close(self) -> None: ...

    def tree_pids(self) -> set[int]:
        return set()

    @property
    def seen_pids(self) -> set[int]:
        return set()

    def wait(self, timeout: float | None = None) -> bool:
        return True
