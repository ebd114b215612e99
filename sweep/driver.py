"""The loop of one sweep: ask -> lease a device -> launch -> follow -> tell -> release.

One process drives the study through ask/tell and is the only writer to storage. Every trial
it asks is told, whatever happens: a crash, a timeout, a pruning decision, Ctrl-C, an error in
the driver itself. Trials a dead driver left RUNNING are reclaimed (told FAIL and run again).
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import signal
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
import psutil
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState
from sqlalchemy.exc import IntegrityError, ProgrammingError

from sweep import config, launch, outcome
from sweep.config import Spec
from sweep.errors import UsageError
from sweep.monitor import Monitor
from sweep.pool import Pool
from sweep.protocol import ReportReader

log = logging.getLogger("sweep")

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
EXIT_INTERRUPTED = 130
PRUNED = "pruned"  # the stop reason of a trial the pruner ended
# A trial's exit wakes the loop at once; this bounds how late reports, timeouts and
# heartbeats are looked at.
POLL_SECONDS = 0.5


@dataclass
class Running:
    """A trial the driver is running now."""

    trial: optuna.Trial
    params: dict[str, Any]
    gpu: int
    process: launch.TrialProcess
    reports: ReportReader
    attempt: int
    origin: int
    deadline: float | None
    stopped: str | None = None
    kill_at: float | None = None
    killed: bool = False
    last_report: tuple[int, float] | None = None

    @property
    def number(self) -> int:
        return self.trial.number


@dataclass
class Finished:
    """What the driver told about one trial (for the progress display)."""

    number: int
    state: str
    values: list[float] | None
    gpu: int
    seconds: float
    fail_reason: str | None


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    message: str


class Events:
    """Hooks for a progress display; the default does nothing."""

    def started(self, run: Running) -> None: ...
    def finished(self, done: Finished) -> None: ...
    def tick(self, driver: Driver) -> None: ...
    def message(self, text: str) -> None:
        log.warning(text)


def open_storage(spec: Spec) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats on (the driver records them for its trials)."""
    engine_kwargs: dict[str, Any] = {}
    if spec.storage_url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    interval = spec.study.heartbeat_interval
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    spec.storage_url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=interval,
                    grace_period=spec.study.grace_period or 2 * interval,
                )
        except (IntegrityError, ProgrammingError):
            # Drivers on several hosts creating the schema at once: one wins, the rest retry.
            if attempt == 2:
                raise
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def open_study(spec: Spec, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Create the study, or load it; its directions must match the file."""
    directions = spec.study.objective_directions
    study = optuna.create_study(
        storage=storage,
        study_name=spec.study.name,
        sampler=config.build_sampler(spec),
        pruner=config.build_pruner(spec),
        directions=directions,
        load_if_exists=True,
    )
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise UsageError(
            f"{spec.source}: study.direction: study {spec.study.name!r} in storage optimises "
            f"{stored}, the file says {directions}; rename the study or fix the direction"
        )
    if study.user_attrs.get("metrics") is None:
        study.set_user_attr("metrics", spec.study.objective_metrics)
    if len(directions) > 1 and not study.metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(spec.study.objective_metrics)
    return study


def process_alive(pid: int | None, started: float | None) -> bool:
    """Whether the process `pid` that started at `started` (epoch s) still runs."""
    if not pid:
        return False
    try:
        p = psutil.Process(int(pid))
        return started is None or abs(p.create_time() - float(started)) < 1.0
    except psutil.Error:
        return False


class Driver:
    """Runs `spec` on `pool` until the budget, the timeout, a signal or too many failures."""

    def __init__(
        self,
        spec: Spec,
        study: optuna.Study,
        pool: Pool,
        monitor: Monitor | None = None,
        events: Events | None = None,
    ) -> None:
        self.spec = spec
        self.study = study
        self.pool = pool
        self.monitor = monitor
        self.events = events or Events()
        self.running: dict[int, Running] = {}
        self.host = socket.gethostname()
        me = psutil.Process()
        self.pid, self.pid_started = me.pid, me.create_time()
        self.distributions = config.distributions(spec)
        self.accelerate_config = spec.output_dir / "accelerate_config.yaml"
        self.consecutive_failures = 0
        self.signals = 0
        self.stop_reason: str | None = None
        self.gave_up = False  # too many failures in a row
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._last_beat = 0.0

    # ---- the loop -----------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run to the end. Always tells every trial it asked; restores signal handlers."""
        spec = self.spec
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        self.accelerate_config.write_text(launch.ACCELERATE_CONFIG)
        self.reclaim()
        for params in spec.study.enqueue:
            self.study.enqueue_trial(params, skip_if_exists=True)
        run_deadline = time.monotonic() + spec.study.timeout if spec.study.timeout else None
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        if self.monitor is not None:
            self.monitor.start()
        try:
            while True:
                if self.signals:
                    self._interrupt()
                if run_deadline is not None and time.monotonic() >= run_deadline:
                    self._stop_starting(f"study.timeout of {spec.study.timeout:g} s reached")
                if self.stop_reason is None:
                    self._start_trials()
                if not self.running:
                    break
                self.events.tick(self)
                if selector.select(self._wait_seconds()):
                    self._drain_wakeups()
                self._poll()
                self._heartbeat()
        finally:
            try:
                self._abandon_all()
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
                if self.monitor is not None:
                    self.monitor.stop()
                selector.close()
                os.close(self._wake_r)
                os.close(self._wake_w)
        return self._result()

    def _result(self) -> RunResult:
        done = self.count_finished()
        summary = f"{done}/{self.spec.study.n_trials} trials finished"
        elsewhere = len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if elsewhere:
            summary += f", {elsewhere} running in other drivers"
        if self.signals:
            return RunResult(EXIT_INTERRUPTED, f"interrupted; {summary}")
        if self.gave_up:
            return RunResult(1, f"{self.stop_reason}; {summary}")
        return RunResult(0, summary)

    def _wait_seconds(self) -> float:
        now = time.monotonic()
        times = [now + POLL_SECONDS]
        for r in self.running.values():
            times += [t for t in (r.deadline, None if r.killed else r.kill_at) if t is not None]
        return max(0.0, min(times) - now)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _drain_wakeups(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self._wake()

    def _stop_starting(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.events.message(f"{reason}: no new trials; waiting for {len(self.running)}")

    def _interrupt(self) -> None:
        """First signal: stop every trial with its grace period. Second: kill at once."""
        self._stop_starting("interrupted")
        for r in self.running.values():
            if r.stopped is None:
                self._stop(r, outcome.INTERRUPTED)
            if self.signals > 1 and not r.killed:
                r.process.kill()
                r.killed = True

    # ---- budget -------------------------------------------------------------------------

    def count_finished(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=FINISHED))

    def _budget_left(self) -> bool:
        trials = self.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
        return len(trials) < self.spec.study.n_trials and self._grid_left()

    def _grid_left(self) -> bool:
        """False once every point of a grid was started (asking again would repeat one)."""
        sampler = self.study.sampler
        if not isinstance(sampler, optuna.samplers.GridSampler):
            return True
        started = {
            t.system_attrs.get("grid_id") for t in self.study.get_trials(deepcopy=False)
            if t.state != TrialState.WAITING
        }
        return len(started - {None}) < len(sampler._all_grids)

    # ---- starting -----------------------------------------------------------------------

    def _start_trials(self) -> None:
        while self.stop_reason is None and self.pool.has_free() and self._budget_left():
            self._start_one()

    def _start_one(self) -> None:
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for optimize(); the driver records them.
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask(self.distributions)
        gpu = self.pool.lease(trial.number)
        try:
            attempt = int(trial.user_attrs.get("attempt", 0))
            origin = int(trial.user_attrs.get("retry_of", trial.number))
            params = {**trial.params, **self.spec.fixed}
            paths = launch.TrialPaths.of(self.spec.output_dir, trial.number)
            plan = launch.build_launch(
                self.spec.trainer, trial.number, params, gpu, paths, self.accelerate_config
            )
            launch.prepare_trial_dir(plan, params)
            proc = launch.TrialProcess(plan, self.spec.trainer.grace_period, on_exit=self._wake)
        except BaseException as e:
            self.pool.release(trial.number)
            self._tell_failed(trial, f"could not start the trial: {e}")
            raise
        timeout = self.spec.trainer.timeout
        run = Running(
            trial, params, gpu, proc, ReportReader(paths.reports), attempt, origin,
            deadline=time.monotonic() + timeout if timeout else None,
        )
        self.running[trial.number] = run
        # `host` goes last: other drivers judge ownership by it, and read the rest with it.
        self._record(trial, {
            "driver_pid": self.pid, "driver_started": self.pid_started,
            "trainer_pid": proc.pid, "trainer_started": proc.started,
            "attempt": attempt, "gpu": gpu, "host": self.host,
        })
        self._beat(trial)
        if self.monitor is not None:
            self.monitor.trial_started(trial.number, gpu)
        self.events.started(run)

    # ---- following ----------------------------------------------------------------------

    def _poll(self) -> None:
        now = time.monotonic()
        for run in list(self.running.values()):
            if not run.process.running:
                self._finish(run)
                continue
            if run.kill_at is not None and now >= run.kill_at:
                if not run.killed:
                    run.process.kill()
                    run.killed = True
            elif run.deadline is not None and now >= run.deadline and run.stopped is None:
                self._stop(run, f"timeout after {self.spec.trainer.timeout:g} s")
            elif run.stopped is None:
                self._follow_reports(run)

    def _stop(self, run: Running, reason: str) -> None:
        run.stopped = reason
        run.process.terminate()
        run.kill_at = time.monotonic() + self.spec.trainer.grace_period

    def _follow_reports(self, run: Running) -> None:
        if len(self.spec.study.objective_directions) > 1:
            return
        for step, value in run.reports.read():
            run.trial.report(value, step)
            run.last_report = (step, value)
        if run.last_report is not None and run.trial.should_prune():
            self._stop(run, PRUNED)

    # ---- telling ------------------------------------------------------------------------

    def _finish(self, run: Running) -> None:
        """Judge a trial that exited, tell it, free its device, maybe schedule a retry."""
        del self.running[run.number]
        run.process.close()
        paths = run.process.plan.paths
        if run.stopped is None:
            self._follow_reports(run)
        pruned = run.stopped == PRUNED
        result = outcome.judge(
            run.process.exit_code,
            outcome.read_text(paths.stderr, tail_bytes=64_000) or "",
            outcome.read_text(paths.result),
            self.spec.study.objective_metrics,
            stopped=None if pruned else run.stopped,
        )
        attrs: dict[str, Any] = {"exit_code": result.exit_code, **result.extras}
        if self.monitor is not None:
            usage = self.monitor.trial_finished(run.number)
            attrs.update({k: v for k, v in usage.items() if not math.isnan(v)})
        state = TrialState.PRUNED if pruned else getattr(TrialState, result.state)
        if result.fail_reason and not pruned:
            attrs["fail_reason"] = result.fail_reason
        if self._record(run.trial, attrs):
            self._tell(run.trial, result.values if state == TrialState.COMPLETE else None, state)
        self._release(run)
        seconds = time.time() - run.process.started
        values = [run.last_report[1]] if pruned and run.last_report else result.values
        done = Finished(run.number, state.name, values, run.gpu, seconds,
                        None if pruned else result.fail_reason)
        self.events.finished(done)
        if state == TrialState.FAIL and run.stopped != outcome.INTERRUPTED:
            self._after_failure(run, result)
        elif state != TrialState.FAIL:
            self.consecutive_failures = 0

    def _after_failure(self, run: Running, result: outcome.Outcome) -> None:
        trainer = self.spec.trainer
        if run.attempt < trainer.max_retries and (trainer.retry_oom or not result.oom):
            self._enqueue_again(run.params, run.origin, run.attempt + 1)
        self.consecutive_failures += 1
        limit = self.spec.study.max_consecutive_failures
        if self.consecutive_failures >= limit:
            self.gave_up = True
            self._stop_starting(
                f"stopped after {limit} failed trials in a row (last: {result.fail_reason}); "
                f"see {run.process.plan.paths.stderr}"
            )

    def _enqueue_again(self, params: dict[str, Any], origin: int, attempt: int) -> None:
        searched = {k: v for k, v in params.items() if k in self.distributions}
        self.study.enqueue_trial(
            searched, user_attrs={"retry_of": origin, "attempt": attempt}, skip_if_exists=False
        )

    def _release(self, run: Running) -> None:
        """Free the device, unless a process of the trial still holds GPU memory on it."""
        self.pool.release(run.number)
        if self.monitor is None:
            return
        ours = run.process.seen_pids
        left = set(self.monitor.reader.compute_processes(run.gpu)) & ours
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(1.0)
        if set(self.monitor.reader.compute_processes(run.gpu)) & ours:
            reason = f"processes {sorted(left)} of trial {run.number} still hold it"
            self.pool.quarantine(run.gpu, reason)
            self.events.message(f"GPU {run.gpu} taken out of the pool: {reason}")

    def _record(self, trial: optuna.Trial, attrs: dict[str, Any]) -> bool:
        """Store user attributes; False if another driver already finished the trial."""
        try:
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
        except optuna.exceptions.UpdateFinishedTrialError:
            self.events.message(f"trial {trial.number} was already told by another driver")
            return False
        return True

    def _tell(self, trial: optuna.Trial, values: list[float] | None, state: TrialState) -> None:
        """`study.tell`, letting a sampler end the search as it would under optimize()."""
        # GridSampler and BruteForceSampler call study.stop() once the space is exhausted;
        # Optuna allows that only inside optimize(), so mark the tell as such.
        local = self.study._thread_local
        local.in_optimize_loop = True
        try:
            self.study.tell(trial, values, state=state, skip_if_finished=True)
        finally:
            local.in_optimize_loop = False
        if self.study._stop_flag:
            self.study._stop_flag = False
            self._stop_starting("the sampler has searched its whole space")

    def _tell_failed(self, trial: optuna.Trial, reason: str) -> None:
        try:
            trial.set_user_attr("fail_reason", reason)
            self._tell(trial, None, TrialState.FAIL)
        except Exception as e:  # storage gone too: nothing more can be done from here
            log.error("could not tell trial %d: %s", trial.number, e)

    def _abandon_all(self) -> None:
        """On the way out with trials still running (a driver error): stop and tell them."""
        if not self.running:
            return
        for run in self.running.values():
            run.process.terminate()
        deadline = time.monotonic() + self.spec.trainer.grace_period
        for run in self.running.values():
            run.process.wait(max(0.0, deadline - time.monotonic()))
        for run in list(self.running.values()):
            run.process.kill()
            run.process.wait(5)
            run.process.close()
            self.pool.release(run.number)
            if self.monitor is not None:
                self.monitor.trial_finished(run.number)
            reason = run.stopped if run.stopped == outcome.INTERRUPTED else "driver error"
            self._tell_failed(run.trial, reason)
        self.running.clear()

    # ---- heartbeats and reclaiming ------------------------------------------------------

    def _beat(self, trial: optuna.Trial) -> None:
        storage = self.study._storage
        if is_heartbeat_enabled(storage):
            storage.record_heartbeat(trial._trial_id)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.spec.study.heartbeat_interval:
            return
        self._last_beat = now
        for run in self.running.values():
            self._beat(run.trial)
        self.reclaim()

    def reclaim(self) -> list[int]:
        """Fail and re-run trials whose driver is gone. Returns the reclaimed numbers.

        Same host: the recorded driver pid no longer runs. Any host: Optuna's heartbeat is
        older than the grace period. A survivor trainer of a dead driver on this host is killed.
        """
        storage = self.study._storage
        stale: set[int] = set()
        if is_heartbeat_enabled(storage):
            stale = set(storage._get_stale_trial_ids(self.study._study_id))
        reclaimed = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number in self.running:
                continue
            a = t.user_attrs
            same_host = a.get("host") == self.host and "driver_pid" in a
            if same_host and not process_alive(a.get("driver_pid"), a.get("driver_started")):
                reason = f"driver died (pid {a.get('driver_pid')} on {self.host})"
            elif t._trial_id in stale:
                reason = f"driver on {a.get('host', '?')} died (no heartbeat)"
            else:
                continue
            if same_host and process_alive(a.get("trainer_pid"), a.get("trainer_started")):
                try:
                    os.killpg(int(a["trainer_pid"]), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another driver reclaimed it first
            origin = int(a.get("retry_of", t.number))
            self._enqueue_again(dict(t.params), origin, int(a.get("attempt", 0)) + 1)
            reclaimed.append(t.number)
            self.events.message(f"trial {t.number}: {reason}; told FAIL, queued again")
        return reclaimed
