"""study.scheduler in the driver's loop, on the fake clock: pauses are gentle stops told
PRUNED, promotions continue a paused lineage from its checkpoint before a new configuration
starts, PBT exploits copy a donor's checkpoint folder, and a continuation that starts over is
flagged. A whole sweep in milliseconds, with exact assertions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep.analysis import summary
from sweep.runner.schedulers import Promote
from sweep.runner.scheduling import NO_RESUME_ARGS, Scheduling
from sweep.study import lineages
from sweep.study.ownership import Owner
from sweep.study.store import Store
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep, capture_messages
from sweep.trial.lineage import CHECKPOINT_ENV

DIST = {"x": FloatDistribution(0.0, 1.0)}
ASHA = {"type": "asha", "min_steps": 2, "max_steps": 18, "reduction_factor": 3}


def curve(x: float, step: int) -> float:
    return (x - 0.3) ** 2 + 1.0 / (step + 1)


class Trainer:
    """A fake trainer of `steps` one-second steps that checkpoints each step (before it
    reports it) in $SWEEP_CHECKPOINT_DIR/state.json and resumes from it (`resumes`: else it
    starts over); `log` keeps (trial, first step, last step planned) per start."""

    def __init__(self, s_box: list[Sweep], steps: int = 18, resumes: bool = True,
                 value: Any = curve, ignores_term: bool = False) -> None:
        self.box, self.steps, self.resumes, self.value = s_box, steps, resumes, value
        self.ignores_term = ignores_term  # goes on until SIGKILL, after the grace period
        self.starts: list[tuple[str, int]] = []

    def __call__(self, params: dict[str, Any]) -> Script:
        s = self.box[0]
        plan = s.spawn.plan
        folder = Path(plan.env[CHECKPOINT_ENV])
        state = folder / "state.json"
        first = json.loads(state.read_text())["next"] if self.resumes and state.exists() else 0
        self.starts.append((plan.paths.dir.name, first))
        index = len(s.spawn.processes)  # the process about to be made for this script
        t0 = s.clock.t

        def save(step: int) -> None:
            if not s.spawn.processes[index].command_exited:
                state.write_text(json.dumps({"next": step + 1}))

        reports = []
        for i, step in enumerate(range(first, self.steps)):
            s.clock.at(t0 + i + 1.0, lambda step=step: save(step))
            reports.append((i + 1.0, step, self.value(params["x"], step)))
        final = self.value(params["x"], self.steps - 1)
        return Script(runs=self.steps - first + 0.5, reports=reports, result={"score": final},
                      ignores_term=self.ignores_term)


def asha_sweep(tmp_path: Path, gpus: int = 2, enqueue: tuple[float, ...] = (),
               **kw: Any) -> tuple[Sweep, Trainer]:
    box: list[Sweep] = []
    trainer = Trainer(box, **kw)
    s = Sweep(tmp_path, trainer, gpus=gpus,
              study={"n_trials": 9, "scheduler": ASHA,
                     "enqueue": [{"x": x} for x in enqueue]},
              trainer={"resume_args": ["--resume"]})
    box.append(s)
    return s, trainer


def spans(s: Sweep) -> dict[int, list[tuple[float, float]]]:
    """Each lineage's processes as (start, end), by origin."""
    out: dict[int, list[tuple[float, float]]] = {}
    for p in s.spawn.processes:
        number = int(p.plan.paths.dir.name.split("_")[-1])
        t = s.trials[number]
        out.setdefault(int(t.user_attrs.get("retry_of", number)), []).append(
            (p.started, p.ended_at or float("inf")))
    return out


def test_asha_pauses_promotes_and_carries_the_best_lineages_to_max_steps(tmp_path):
    s, trainer = asha_sweep(tmp_path)
    said = capture_messages(s)
    result = s.driver.run()
    assert result.exit_code == 0
    assert result.message == "9/9 configurations: 1 trained to the end, 8 paused"
    trials = s.trials
    assert [t.state.name for t in trials if t.state.name in ("RUNNING", "WAITING")] == []
    lines = lineages.read(trials)
    assert len(lines) == 9  # n_trials counts configurations
    paused = [t for t in trials if "paused_at" in t.user_attrs]
    assert paused and all(t.state.name == "PRUNED" for t in paused)
    assert all("fail_reason" not in t.user_attrs for t in paused)  # no failure
    promoted = [t for t in trials if "continues" in t.user_attrs]
    assert promoted and any(m.startswith("trial ") and " promoted from rung" in m for m in said)
    # every promoted lineage continued from its checkpoint: its first step is the one after
    # the step it was paused at, and none is flagged
    by_dir = dict(trainer.starts)
    for t in promoted:
        before = trials[t.user_attrs["continues"]]
        assert by_dir[str(t.number)] == before.user_attrs["paused_at"] + 1
        assert "steps_repeated" not in t.user_attrs
    # the best lineage (x nearest 0.3) reached max_steps and completed
    best = min(lines.values(), key=lambda v: abs(v.params["x"] - 0.3))
    assert best.last_step == 17
    assert best.latest.state.name == "COMPLETE"
    assert s.store.best()[0][1] == [pytest.approx(curve(best.params["x"], 17))]
    # no lineage ran in two processes at once
    for runs in spans(s).values():
        runs.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs))
    # fewer steps than training every configuration to the end: 6 paused at step 2 (3
    # steps each), 3 at step 6 (7 each), and the best from 7 to 17
    assert sum(len(v.curve) for v in lines.values()) == 6 * 3 + 3 * 7 + 11 < 9 * 18
    assert NO_RESUME_ARGS not in said


def test_a_paused_trial_is_promoted_before_a_new_configuration_starts(tmp_path):
    """Li et al.'s get_job, on one device: trials 0 and 1 are paused at rung 0 (step 2: the
    first two there, floor(2/3) = 0 places at its top); trial 2 is worse than 0, so it is
    paused too, and 0 is now the top third of rung 0: the free device continues it (as trial
    3) before the fourth configuration starts."""
    s, trainer = asha_sweep(tmp_path, gpus=1)
    assert s.run() == 0
    assert trainer.starts[:5] == [("0", 0), ("1", 0), ("2", 0), ("3", 3), ("4", 0)]
    assert s.trials[3].user_attrs["continues"] == 0
    assert s.trials[3].params == s.trials[0].params
    assert [s.trials[n].user_attrs["paused_at"] for n in (0, 1, 2)] == [2, 2, 2]
    assert s.trials[3].user_attrs["paused_at"] == 6  # first at rung 1: paused there


def test_configurations_of_study_enqueue_do_not_go_before_a_promotion(tmp_path):
    """Optuna asks queued trials first: a scheduler queues study.enqueue's configurations one
    at a time, as new configurations, so a promotion still comes first."""
    xs = (0.3, 0.32, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)
    s, trainer = asha_sweep(tmp_path, gpus=1, enqueue=xs)
    assert s.run() == 0
    assert trainer.starts[:5] == [("0", 0), ("1", 0), ("2", 0), ("3", 3), ("4", 0)]
    assert s.trials[3].user_attrs["continues"] == 0
    firsts = [t for t in s.trials if "retry_of" not in t.user_attrs]
    assert [t.params["x"] for t in firsts] == list(xs)


def test_a_continuation_that_starts_over_is_flagged_once_with_the_fix(tmp_path):
    s, _trainer = asha_sweep(tmp_path, resumes=False)
    said = capture_messages(s)
    assert s.run() == 0
    flagged = [t for t in s.trials if "steps_repeated" in t.user_attrs]
    assert flagged
    for t in flagged:
        before = s.trials[t.user_attrs["continues"]]
        assert t.user_attrs["resumed_at"] == 0
        assert t.user_attrs["steps_repeated"] == before.user_attrs["paused_at"] + 1
    fixes = [m for m in said if "steps repeated" in m]
    assert len(fixes) == 1 and "$SWEEP_CHECKPOINT_DIR" in fixes[0] \
        and "trainer.resume_args" in fixes[0]
    frame = summary.trials_frame(s.store.study, s.spec)
    shown = frame[frame["steps_repeated"].notna()]
    assert list(shown["number"]) == [t.number for t in flagged]
    assert list(shown["resumed_at"]) == [0] * len(flagged)
    assert frame["paused_at"].notna().sum() == sum("paused_at" in t.user_attrs for t in s.trials)


def test_without_resume_args_the_run_says_once_how_a_paused_trial_continues(tmp_path):
    box: list[Sweep] = []
    s = Sweep(tmp_path, Trainer(box), gpus=2,
              study={"n_trials": 3, "scheduler": ASHA})
    box.append(s)
    said = capture_messages(s)
    assert s.run() == 0
    assert said.count(NO_RESUME_ARGS) == 1


def test_pbt_replaces_the_bottom_with_a_perturbed_copy_of_a_top_lineage(tmp_path):
    box: list[Sweep] = []
    trainer = Trainer(box, steps=20)
    s = Sweep(tmp_path, trainer, gpus=4,
              study={"n_trials": 6, "enqueue": [{"x": x} for x in (0.3, 0.5, 0.7, 0.9)],
                     "scheduler": {"type": "pbt", "population": 4, "interval": 5,
                                   "max_steps": 20, "quantile": 0.25, "seed": 0,
                                   "perturb": [0.8, 1.25]}},
              trainer={"resume_args": ["--resume"]})
    box.append(s)
    said = capture_messages(s)
    assert s.run() == 0
    trials = s.trials
    exploits = [t for t in trials if "exploit_of" in t.user_attrs]
    assert len(exploits) == 2  # n_trials 6: the population of 4 and 2 exploits
    for t in exploits:
        donor = trials[t.user_attrs["exploit_of"]]
        replaced = trials[t.user_attrs["replaces"]]
        assert replaced.state.name == "PRUNED"
        assert t.params["x"] in (pytest.approx(donor.params["x"] * 0.8),
                                 pytest.approx(min(1.0, donor.params["x"] * 1.25)))
        # it started from the donor's checkpoint: past the step it was copied at
        first = dict(trainer.starts)[str(t.number)]
        assert first > t.user_attrs["exploit_step"]
        assert "steps_repeated" not in t.user_attrs
        assert (tmp_path / "probe" / "checkpoints" / str(t.number) / "state.json").is_file()
    assert sum(" exploits trial " in m for m in said) == 2
    assert [t.state.name for t in trials if t.state.name in ("RUNNING", "WAITING")] == []



def stored_rung(s: Sweep) -> None:
    """Three trials paused at rung 0 (step 2), as a study holds them: 0 is the best."""
    for number, x in enumerate((0.35, 0.6, 0.9)):
        s.store.study.add_trial(optuna.trial.create_trial(
            state=TrialState.PRUNED, params={"x": x}, distributions=DIST,
            intermediate_values={step: curve(x, step) for step in range(3)},
            user_attrs={"paused_at": 2, "rung": 0, "run_id": f"r{number}"}))


def test_two_drivers_deciding_at_once_promote_a_lineage_once(tmp_path):
    s, _ = asha_sweep(tmp_path)
    stored_rung(s)
    other = Store(s.store.study, s.store.storage, Owner("other-host", 1, 0.0), 60)
    mine = Scheduling(s.spec, s.store, lambda m: None)
    theirs = Scheduling(s.spec, other, lambda m: None)
    assert mine.room() == 1 + 6  # lineage 0 promotable, and 6 more configurations
    assert mine.before_ask() == Promote(0, 0)
    # the other driver, killed or not between its lock and its ask, finds it queued: it asks
    # that one rather than promoting it again
    assert theirs.before_ask() is None
    [queued] = [t for t in s.trials if t.state is TrialState.WAITING]
    assert (queued.user_attrs["retry_of"], queued.user_attrs["attempt"],
            queued.user_attrs["continues"]) == (0, 1, 0)
    assert queued.system_attrs["fixed_params"] == {"x": 0.35}
    # once it runs it is no longer paused: nothing more to promote from rung 0 (1 of 3)
    assert lineages.read(s.trials)[0].standing is lineages.Standing.QUEUED
    assert mine.before_ask() is None and theirs.room() == 1 + 6



def test_a_promotion_under_the_drivers_budget_lock_does_not_wait_for_that_lock(
        tmp_path, monkeypatch):
    """The driver holds the study's budget lock (an flock beside the SQLite file) around
    `before_ask`: the promotion's queueing must not take it a second time (it waited
    LOCK_PATIENCE, 30 s, then went around the lock for minutes)."""
    from conftest import study_dict

    from sweep.spec import config
    from sweep.study import budget
    from sweep.study.connect import connect

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(study={"n_trials": 9, "scheduler": ASHA}),
                                   sort_keys=False))
    spec = config.load(path)
    store = connect(spec, Owner("test-host", 1, 0.0))
    try:
        for x in (0.35, 0.6, 0.9):
            store.study.add_trial(optuna.trial.create_trial(
                state=TrialState.PRUNED, params={"x": x}, distributions=DIST,
                intermediate_values={step: curve(x, step) for step in range(3)},
                user_attrs={"paused_at": 2, "rung": 0}))

        def waited(seconds: float) -> None:
            raise AssertionError("waited for the budget lock it holds")

        monkeypatch.setattr(budget.time, "sleep", waited)
        with store.budget_lock() as held:
            assert held
            assert Scheduling(spec, store, lambda m: None).before_ask() == Promote(0, 0)
        assert [t.number for t in store.study.get_trials(states=(TrialState.WAITING,))] == [3]
    finally:
        store.close()


def test_hyperband_brackets_pause_at_their_own_first_rung(tmp_path):
    box: list[Sweep] = []
    trainer = Trainer(box)
    s = Sweep(tmp_path, trainer, gpus=2,
              study={"n_trials": 12, "scheduler": {**ASHA, "type": "hyperband"}},
              trainer={"resume_args": ["--resume"]})
    box.append(s)
    assert s.run() == 0
    lines = lineages.read(s.trials)
    brackets = {o: v.bracket for o, v in lines.items()}
    assert sorted(brackets.values()).count(2) >= 1 and 1 in brackets.values()
    for o, v in lines.items():
        paused = [t.user_attrs["paused_at"] for t in s.trials
                  if "paused_at" in t.user_attrs and t.user_attrs.get("retry_of", t.number) == o]
        if v.bracket == 2:  # no rung: trained to the end
            assert paused == [] and v.latest.state.name == "COMPLETE"
        if v.bracket == 1:  # its first rung is at step 6
            assert all(p >= 6 for p in paused)
    assert [t.user_attrs.get("bracket", 0) for t in s.trials if t.user_attrs.get(
        "attempt", 0) == 0][:5] == [0, 1, 0, 0, 2]  # shares 9, 5, 3


def test_a_scheduler_study_whose_trials_report_nothing_says_so_once(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(runs=1.0, result={"score": p["x"]}), gpus=2,
              study={"n_trials": 4, "scheduler": ASHA}, trainer={"resume_args": ["--r"]})
    said = capture_messages(s)
    assert s.run() == 0
    assert [m for m in said if "without reporting" in m] == [
        "trial 0 ended without reporting an intermediate value to $SWEEP_REPORT_FILE "
        "(sweep.protocol.report): study.scheduler cannot pause or promote this study; set "
        "trainer.report to read them from the script's output or TensorBoard logs"]
    assert s.states() == ["COMPLETE"] * 4


def test_the_steps_a_paused_trial_makes_while_it_stops_are_kept(tmp_path):
    """A trainer that runs on through its stop grace (1.5 s: one more step) reports a step
    after the one it was paused at; it is stored, so the lineage's curve has no hole, and its
    continuation starts after it, unflagged."""
    box: list[Sweep] = []
    trainer = Trainer(box, ignores_term=True)
    s = Sweep(tmp_path, trainer, gpus=1, study={"n_trials": 3, "scheduler": ASHA},
              trainer={"resume_args": ["--resume"], "grace_period": 1.5})
    box.append(s)
    assert s.run() == 0
    first = s.trials[0]
    assert first.user_attrs["paused_at"] == 2
    assert sorted(first.intermediate_values) == [0, 1, 2, 3]
    [then] = [t for t in s.trials if t.user_attrs.get("continues") == 0]
    assert dict(trainer.starts)[str(then.number)] == 4
    assert "steps_repeated" not in then.user_attrs


def test_a_lineage_replaced_by_a_driver_killed_before_it_stopped_it_stops_at_its_first_report(
        tmp_path):
    """A driver killed between queueing an exploit and stopping the lineage it replaces: the
    reclaimer queued that lineage's continuation (as for any orphan). It must not train on
    beside its replacement: it is stopped at its first report and told PRUNED."""
    box: list[Sweep] = []
    trainer = Trainer(box, steps=20)
    s = Sweep(tmp_path, trainer, gpus=1,
              study={"n_trials": 3, "scheduler": {"type": "pbt", "population": 2,
                                                  "interval": 5, "max_steps": 20}},
              trainer={"resume_args": ["--resume"]})
    box.append(s)
    add = s.store.study.add_trial
    add(optuna.trial.create_trial(  # lineage 0: its driver died as it was being replaced
        state=TrialState.FAIL, params={"x": 0.9}, distributions=DIST,
        intermediate_values={st: curve(0.9, st) for st in range(6)},
        user_attrs={"fail_reason": "driver died"}))
    add(optuna.trial.create_trial(  # lineage 1, its donor
        state=TrialState.COMPLETE, params={"x": 0.3}, distributions=DIST, value=0.1,
        intermediate_values={st: curve(0.3, st) for st in range(20)}))
    s.store.study.enqueue_trial({"x": 0.9}, user_attrs={"retry_of": 0, "attempt": 1,
                                                        "continues": 0})
    s.store.study.enqueue_trial({"x": 0.36}, user_attrs={"exploit_of": 1, "exploit_step": 5,
                                                         "replaces": 0})
    assert s.run() == 0
    continuation, exploit = s.trials[2], s.trials[3]
    assert continuation.state.name == "PRUNED"
    assert sorted(continuation.intermediate_values)[-1] == 6  # one step, then stopped
    assert exploit.state.name == "COMPLETE"
