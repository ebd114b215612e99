"""A trial's lineage: what its attempts share (checkpoint folder, run id, curve), what an
interruption or a retry queues, and how the driver carries it out (fakes, in milliseconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sweep._core import names
from sweep._core.errors import ConfigError
from sweep._core.safefs import UnsafePath
from sweep.analysis import summary
from sweep.schedulers import history
from sweep.spec import config
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep
from sweep.trial import lineage
from sweep.trial.lineage import Lineage, Start


def test_a_first_attempt_is_its_own_lineage_and_old_retries_count_as_retries():
    assert Lineage.of({}, 7) == Lineage(7)
    assert Lineage.of({names.RETRY_OF: 3, names.ATTEMPT: 2}, 9) == Lineage(3, 2, retries=2)
    line = Lineage.of({names.RETRY_OF: 3, names.ATTEMPT: 2, names.RETRIES: 0, names.CONTINUES: 8,
                       names.RUN_ID: "s-3-ab"}, 9)
    assert (line.origin, line.attempt, line.retries, line.continues, line.resumes) == (
        3, 2, 0, 8, True)


def test_an_interruption_is_continued_without_spending_a_retry_and_a_retry_spends_one():
    line = Lineage(3, attempt=1, retries=0, continues=5, run_id="s-3-ab")
    assert line.next_attrs(9, retry=False) == {
        names.RETRY_OF: 3, names.ATTEMPT: 2, names.CONTINUES: 9, names.RETRIES: 0,
        names.RUN_ID: "s-3-ab"}
    assert line.next_attrs(9, retry=True) == {
        names.RETRY_OF: 3, names.ATTEMPT: 2, names.CONTINUES: 9, names.RETRIES: 1,
        names.RUN_ID: "s-3-ab"}
    clean = line.next_attrs(9, retry=True, clean=True)
    assert clean["clean"] is True and not Lineage.of(clean, 10).resumes
    assert names.CLEAN not in line.next_attrs(9, retry=False, clean=True)  # continuations resume
    assert names.CLEAN not in line.again_attrs(9)  # in place of one that never ran: as it was
    assert Lineage(3).again_attrs(3)[names.CLEAN] is True  # a first attempt's: it starts anew
    assert names.CLEAN not in Lineage(3).again_attrs(3, kept=True)  # a PBT copy made for it
    assert Lineage(3, 2, 1, 9, clean=True).again_attrs(10) == {
        names.RETRY_OF: 3, names.ATTEMPT: 3, names.CONTINUES: 10, names.RETRIES: 1,
        names.CLEAN: True}


def test_the_curve_takes_each_step_from_the_latest_attempt_that_reported_it():
    assert lineage.merged_curve([(2, {4: 0.1, 5: 0.2}), (0, {0: 1.0, 4: 0.9}),
                                 (1, {1: 0.5})]) == {0: 1.0, 1: 0.5, 4: 0.1, 5: 0.2}


def test_the_newest_complete_hf_checkpoint_is_found(tmp_path):
    assert lineage.last_checkpoint(tmp_path / "none") is None
    assert lineage.last_checkpoint(tmp_path) is None
    for n in (5, 10, 40):
        (tmp_path / f"checkpoint-{n}").mkdir()
    (tmp_path / "checkpoint-99").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-x").mkdir()
    assert lineage.last_checkpoint(tmp_path) == tmp_path / "checkpoint-40"  # none complete
    for n in (5, 10):
        (tmp_path / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    assert lineage.last_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # 40 was cut short


def test_resume_args_only_when_the_lineage_is_carried_on_into_a_folder_not_empty(tmp_path):
    args = ["--resume_from_checkpoint", "{last_checkpoint}", "--dir", "{checkpoint_dir}/$X"]
    places = {"checkpoint_dir": str(tmp_path)}
    env = {"X": "y"}
    assert lineage.resume_args(args, Start(tmp_path), places, env) == []
    assert lineage.resume_args(args, Start(tmp_path, resume=True), places, env) == []
    last = tmp_path / "checkpoint-3"
    (tmp_path / "y").mkdir()
    last.mkdir()  # as `last_checkpoint` finds it
    assert lineage.resume_args(args, Start(tmp_path, True, last), places, env) == [
        "--resume_from_checkpoint", str(last), "--dir", f"{tmp_path}/y"]
    assert lineage.resume_args(["--resume"], Start(tmp_path, resume=True), places, env) == [
        "--resume"]


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_resume_args_naming_a_file_not_saved_yet_are_left_out(tmp_path, form):
    """Item 10 of issue 38: timm writes `args.yaml` under its run folder at once and
    `last.pth.tar` only at the end of an epoch; a trial stopped before its first save left a
    folder that is not empty, and its continuation was given `--resume .../last.pth.tar`,
    which timm cannot load: with no retries the configuration was lost. Resume arguments are
    added only when what they name inside the checkpoint folder is there."""
    args = (["--resume", "{checkpoint_dir}/run/last.pth.tar"] if form == "separate"
            else ["--resume={checkpoint_dir}/run/last.pth.tar"])
    places = {"checkpoint_dir": str(tmp_path)}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "args.yaml").write_text("epochs: 6\n")
    start = Start(tmp_path, resume=True)  # carried on into a folder not empty
    assert not lineage.resumable(args, start, places, {})
    assert lineage.resume_args(args, start, places, {}) == []
    (tmp_path / "run" / "last.pth.tar").write_bytes(b"state")
    assert lineage.resumable(args, start, places, {})
    assert "".join(lineage.resume_args(args, start, places, {})).endswith(
        f"{tmp_path}/run/last.pth.tar")


def test_prepare_empties_the_folder_of_a_new_lineage_or_a_clean_retry_only(tmp_path):
    folder = lineage.checkpoint_dir(tmp_path, 4)
    folder.mkdir(parents=True)
    (folder / "old.pt").write_text("left by an earlier study of this output_dir")
    lineage.made_marker(tmp_path, 4).write_text("4\n")  # sweep made it, for that study
    new = lineage.prepare(tmp_path, Lineage(4))
    assert new == Start(folder, False, None, None) and not any(folder.iterdir())
    (folder / "checkpoint-2").mkdir()
    carried = lineage.prepare(tmp_path, Lineage(4, 1, continues=4, run_id="r"))
    assert carried == Start(folder, True, folder / "checkpoint-2", "r")
    clean = lineage.prepare(tmp_path, Lineage(4, 2, 1, continues=5, clean=True))
    assert not clean.resume and not any(folder.iterdir())
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


def test_a_new_lineage_never_empties_a_folder_sweep_did_not_make(tmp_path):
    """Issue 32: a folder at a new lineage's place that sweep did not make (no marker beside
    it) is refused, and kept; an empty one is taken, and marked."""
    folder = lineage.checkpoint_dir(tmp_path, 7)
    folder.mkdir(parents=True)
    (folder / "data.bin").write_text("the user's")
    with pytest.raises(UnsafePath, match="holds files sweep did not put there"):
        lineage.prepare(tmp_path, Lineage(7))
    assert (folder / "data.bin").read_text() == "the user's"
    (folder / "data.bin").unlink()
    assert lineage.prepare(tmp_path, Lineage(7)) == Start(folder, False, None, None)
    assert lineage.made_marker(tmp_path, 7).read_text() == "7\n"


def test_a_linked_checkpoints_folder_is_refused_before_anything_through_it_goes(tmp_path):
    """Issue 32: `checkpoints` as a link to a bigger disk: the new lineage's folder there
    was emptied through the link before the link was refused."""
    disk = tmp_path / "bigdisk"
    (disk / "0").mkdir(parents=True)
    (disk / "0" / "model.pt").write_text("weeks of training")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "checkpoints").symlink_to(disk)
    (disk / ".0.sweep").write_text("0\n")  # even marked as sweep's
    with pytest.raises(UnsafePath) as refused:
        lineage.prepare(tmp_path / "out", Lineage(0))
    assert str(refused.value) == (
        f"{tmp_path}/out/checkpoints is a symbolic link: sweep writes no checkpoint through a "
        "link; to keep checkpoints on another disk, put study.output_dir there")
    assert (disk / "0" / "model.pt").read_text() == "weeks of training"


def test_wandb_continues_the_run_unless_the_study_sets_its_own():
    start = Start(Path("/o/checkpoints/3"), run_id="s-3-ab")
    assert lineage.env(start, {}) == {
        "SWEEP_CHECKPOINT_DIR": "/o/checkpoints/3", "SWEEP_RUN_ID": "s-3-ab",
        "WANDB_RUN_ID": "s-3-ab", "WANDB_RESUME": "allow"}
    assert lineage.env(start, {"WANDB_RESUME": "never"}) == {
        "SWEEP_CHECKPOINT_DIR": "/o/checkpoints/3", "SWEEP_RUN_ID": "s-3-ab",
        "WANDB_RUN_ID": "s-3-ab"}
    run_id = lineage.new_run_id("my study/v2", 12)
    assert run_id.startswith("my-study-v2-12-") and len(run_id) == len("my-study-v2-12-") + 8


def study_file(tmp_path: Path, trainer: dict) -> Path:
    path = tmp_path / "s.yaml"
    import yaml
    from conftest import study_dict
    path.write_text(yaml.safe_dump(study_dict(trainer=trainer)))
    return path


def test_last_checkpoint_is_a_placeholder_of_resume_args_only(tmp_path):
    spec = config.load(study_file(tmp_path, {"resume_args": [
        "--resume_from_checkpoint", "{last_checkpoint}"], "args": ["--out", "{checkpoint_dir}"]}))
    assert spec.trainer.retry_from == "checkpoint"
    with pytest.raises(ConfigError) as e:
        config.load(study_file(tmp_path, {"args": ["--r", "{last_checkpoint}"]}))
    assert "trainer.args.1" in str(e.value) and "unknown placeholder {last_checkpoint}" in str(
        e.value)
    with pytest.raises(ConfigError) as e:
        config.load(study_file(tmp_path, {"retry_from": "scratch"}))
    assert "trainer.retry_from" in str(e.value)


def scripted(*scripts: Script):
    left = list(scripts)
    return lambda params: left.pop(0)


def test_an_interrupted_trial_continues_in_the_next_run_and_keeps_its_retry(tmp_path):
    s = Sweep(tmp_path, scripted(Script(runs=100), Script(runs=1, code=3, result=None),
                                 Script(runs=1, result={"score": 0.25})), gpus=1,
              study={"n_trials": 1, "max_consecutive_failures": 2},
              trainer={"max_retries": 1, "resume_args": ["--resume"]})
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    assert s.states() == ["FAIL", "WAITING"]
    assert s.rerun() == 0
    assert s.states() == ["FAIL", "FAIL", "COMPLETE"]
    attrs = [t.user_attrs for t in s.trials]
    assert [a[names.FAIL_REASON] for a in attrs[:2]] == ["interrupted", "exit code 3: no stderr"]
    assert [(a.get(names.RETRY_OF), a.get("continues"), a.get("retries")) for a in attrs] == [
        (None, None, None), (0, 0, 0), (0, 1, 1)]  # the interruption spent no retry
    assert len({a[names.RUN_ID] for a in attrs}) == 1
    dirs = {p.plan.env["SWEEP_CHECKPOINT_DIR"] for p in s.spawn.processes}
    assert dirs == {str(s.spec.output_dir / "checkpoints" / "0")}
    assert s.store.counts().finished == 1 and s.driver.policy.streak == 0
    frame = summary.trials_frame(s.store.study, s.spec)
    assert frame["continues"].tolist()[1:] == [0, 1] and frame["continues"].isna().tolist()[0]
    assert frame["lineage"].tolist() == [0, 0, 0]
    assert frame["lineage_attempts"].tolist() == [3, 3, 3]
    total = frame["duration_s"].sum()
    assert frame["lineage_device_s"].tolist() == pytest.approx([total] * 3)
    assert frame["value"].notna().tolist() == [False, False, True]  # the final value, once


def test_a_retry_after_a_real_failure_resumes_by_default_and_starts_clean_if_asked(tmp_path):
    for retry_from, resumed in (("checkpoint", True), ("clean", False)):
        folder = tmp_path / retry_from
        folder.mkdir()
        s = Sweep(folder, scripted(Script(runs=2, code=1, result=None),
                                   Script(runs=1, result={"score": 0.5})), gpus=1,
                  study={"n_trials": 1},
                  trainer={"max_retries": 1, "retry_from": retry_from,
                           "resume_args": ["--resume", "{checkpoint_dir}/last.pt"]})
        saved = s.spec.output_dir / "checkpoints" / "0" / "last.pt"
        s.clock.at(1.0, lambda p=saved: p.write_text("step 10"))  # the trainer saves
        assert s.run() == 0
        assert s.states() == ["FAIL", "COMPLETE"]
        first, retry = (p.plan.argv for p in s.spawn.processes)
        assert "--resume" not in first
        assert ("--resume" in retry) is resumed  # after trainer.args, before the params
        if resumed:
            assert retry[retry.index("--resume"):][:4] == ["--resume", str(saved), "--x",
                                                           retry[-1]]
        assert saved.exists() is resumed
        assert s.trials[1].user_attrs.get(names.CLEAN, False) is not resumed


def test_a_clean_retry_that_never_ran_is_taken_up_clean_in_the_next_run(tmp_path):
    """A clean retry that could not be prepared (a file where its trial folder goes) never
    emptied its lineage's folder: the attempt in its place starts clean too, not from the
    failed attempt's state, and spends no retry."""
    s = Sweep(tmp_path, scripted(Script(runs=2, code=1, result=None),
                                 Script(runs=1, result={"score": 0.5})), gpus=1,
              study={"n_trials": 1, "max_consecutive_failures": 3},
              trainer={"max_retries": 1, "retry_from": "clean",
                       "resume_args": ["--resume"]})
    saved = s.spec.output_dir / "checkpoints" / "0" / "last.pt"
    s.clock.at(1.0, lambda: saved.write_text("step 10"))  # the failing attempt saves
    s.clock.at(1.0, lambda: (s.spec.output_dir / "trials" / "1").write_text("in the way"))
    assert s.run() == 1
    assert s.states() == ["FAIL", "FAIL", "WAITING"]
    assert s.trials[1].user_attrs[names.FAIL_REASON].startswith("could not prepare the trial")
    (s.spec.output_dir / "trials" / "1").unlink()
    assert s.rerun() == 0
    assert s.states() == ["FAIL", "FAIL", "COMPLETE"]
    assert [(t.user_attrs.get(names.CONTINUES), t.user_attrs.get(names.RETRIES),
             t.user_attrs.get(names.CLEAN)) for t in s.trials] == [
        (None, None, None), (0, 1, True), (1, 1, True)]
    assert "--resume" not in s.spawn.processes[-1].plan.argv and not saved.exists()


def test_the_continuation_carries_the_curve_its_lineage_reached(tmp_path):
    s = Sweep(tmp_path, scripted(
        Script(runs=100, reports=[(0.1, 0, 0.9), (0.2, 1, 0.8)]),
        Script(runs=1, reports=[(0.1, 2, 0.7)], result={"score": 0.6})), gpus=1,
        study={"n_trials": 1, "pruner": {"type": "median"}})
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    assert s.rerun() == 0
    assert s.trials[1].intermediate_values == {0: 0.9, 1: 0.8, 2: 0.7}
    assert s.trials[1].value == 0.6 and s.trials[0].value is None


def test_a_stopping_driver_tells_a_trainer_that_died_of_the_same_signal_interrupted(tmp_path):
    """A Slurm job step's signal reaches the trainers too: one that ends before the loop has
    reacted is still interrupted (and continued), not a failure."""
    s = Sweep(tmp_path, scripted(Script(runs=1.0, code=143, result=None)), gpus=1,
              study={"n_trials": 1})
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))  # as the trainer exits
    assert s.run() == 130
    assert s.states() == ["FAIL", "WAITING"]
    assert s.trials[0].user_attrs[names.FAIL_REASON] == "interrupted"
    assert os.path.isdir(s.spec.output_dir / "checkpoints" / "0")


def test_counted_steps_go_on_from_the_lineages_last_step_after_a_resume(tmp_path):
    """A `trainer.report` without a `step` group counts its values: after a resume the
    continuation's count goes on from the lineage's last step (timm prints epochs 3-5 as its
    first three values), so no earlier value is replaced by a later epoch's (issue 32)."""
    saved = tmp_path / "out" / "checkpoints" / "0" / "state"
    first = [(0.1 * (i + 1), f"acc {v}") for i, v in enumerate((46.9, 96.9, 59.4))]
    later = [(0.1 * (i + 1), f"acc {v}") for i, v in enumerate((50.0, 100.0, 93.75))]
    s = Sweep(tmp_path, scripted(Script(runs=100, output=first),
                                 Script(runs=1, output=later, result={"score": 0.6})),
              gpus=1, study={"n_trials": 1, "pruner": {"type": "median"},
                             "output_dir": str(tmp_path / "out")},
              trainer={"report": {"stdout": r"acc (?P<value>\S+)"}})
    s.clock.at(0.5, lambda: saved.write_text("epoch 3"))
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    assert s.trials[0].intermediate_values == {1: 46.9, 2: 96.9, 3: 59.4}
    assert s.rerun() == 0
    assert s.trials[0].intermediate_values == {1: 46.9, 2: 96.9, 3: 59.4}
    assert s.trials[1].intermediate_values == {1: 46.9, 2: 96.9, 3: 59.4,
                                               4: 50.0, 5: 100.0, 6: 93.75}
    curve = history.read(s.trials)[0].curve
    assert curve == {1: 46.9, 2: 96.9, 3: 59.4, 4: 50.0, 5: 100.0, 6: 93.75}


def test_a_step_a_continuation_reports_again_keeps_its_earlier_value(tmp_path):
    """A resumed trainer that repeats a step (its checkpoint was older than its last report)
    does not replace what the earlier attempt stored at that step: Optuna's own rule, a step
    already reported is ignored, holds across the lineage."""
    saved = tmp_path / "out" / "checkpoints" / "0" / "state"
    s = Sweep(tmp_path, scripted(
        Script(runs=100, reports=[(0.1, 1, 0.9), (0.2, 2, 0.8)]),
        Script(runs=1, reports=[(0.1, 2, 0.5), (0.2, 3, 0.7)], result={"score": 0.6})),
        gpus=1, study={"n_trials": 1, "pruner": {"type": "median"},
                       "output_dir": str(tmp_path / "out")})
    s.clock.at(0.5, lambda: saved.write_text("step 1"))
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    assert s.rerun() == 0
    assert s.trials[1].intermediate_values == {1: 0.9, 2: 0.8, 3: 0.7}
    assert history.read(s.trials)[0].curve == {1: 0.9, 2: 0.8, 3: 0.7}


@pytest.mark.parametrize(("saves", "resume_args", "base", "fix"), [
    (True, ["--resume", "{checkpoint_dir}"], 0, "the script did not resume from what "
     "trainer.resume_args names (--resume {checkpoint_dir}); have it load its state from "
     "there"),
    # a script counting from 1 (a HF Trainer) that started over is no older state resumed
    (True, ["--resume", "{checkpoint_dir}"], 1, "the script did not resume from what "
     "trainer.resume_args names (--resume {checkpoint_dir}); have it load its state from "
     "there"),
    (True, [], 0, "it did not resume from its checkpoint; have the script load its state "
     "from $SWEEP_CHECKPOINT_DIR, or pass it with trainer.resume_args (e.g. "
     "[--resume_from_checkpoint, \"{last_checkpoint}\"])"),
    (False, ["--resume", "{checkpoint_dir}"], 0, "its checkpoint folder held nothing (never "
     "written, or removed) to resume from; have the script save its state in "
     "$SWEEP_CHECKPOINT_DIR"),  # no scheduler: no keep_checkpoints to name
    (True, ["--resume", "{checkpoint_dir}"], 0, "it resumed from a state older than the step "
     "its lineage reached; have the script save its state more often, or when it is stopped "
     "(SIGTERM: sweep.protocol.should_stop())")])
def test_a_continuation_that_starts_over_is_flagged_without_a_scheduler(
        tmp_path, saves, resume_args, base, fix):
    """An interrupted trial's continuation that reports its lineage's first step (`base`)
    again (it ignored its resume args, or found nothing to resume from) is flagged as under
    a scheduler, told once the fix that applies (never resume_args when they are set)."""
    from sweep.testing.harness import capture_messages

    again = [(0.1, base, 0.95), (0.2, base + 1, 0.85), (0.3, base + 2, 0.75)]
    older = 1 if fix.startswith("it resumed from a state older") else 0
    first = base + older
    s = Sweep(tmp_path, scripted(
        Script(runs=100, reports=[(0.1, base, 0.9), (0.2, base + 1, 0.8),
                                  (0.3, base + 2, 0.7)]),
        Script(runs=1, reports=[*again[older:]], result={"score": 0.6})),
        gpus=1, study={"n_trials": 1}, trainer={"resume_args": resume_args})
    if saves:
        saved = s.spec.output_dir / "checkpoints" / "0" / "state.json"
        s.clock.at(0.5, lambda: saved.write_text("{}"))
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    s.again()
    said = capture_messages(s)
    assert s.run() == 0
    flagged = s.trials[1].user_attrs
    assert (flagged[names.RESUMED_AT], flagged[names.STEPS_REPEATED]) == (first, 3 - older)
    assert names.STEPS_REPEATED not in s.trials[0].user_attrs
    assert [m for m in said if "steps repeated" in m] == [
        f"trial 1 continues lineage 0 but reported step {first} first, not a step after "
        f"{base + 2}: {3 - older} steps repeated; {fix}"]
    frame = summary.trials_frame(s.store.study, s.spec)
    assert frame[names.STEPS_REPEATED].tolist()[1] == 3 - older


def test_a_continuation_whose_folder_was_removed_is_told_so_not_blamed_on_the_script(
        tmp_path):
    """Hostile pass: a lineage whose folder sweep removed (max_checkpoint_gb) started over
    when it continued, and the run told the user to have the script save its state. The
    folder sweep made for it was gone: that is said."""
    import shutil

    from sweep.testing.harness import capture_messages

    s = Sweep(tmp_path, scripted(
        Script(runs=100, reports=[(0.1, 0, 0.9), (0.2, 1, 0.8), (0.3, 2, 0.7)]),
        Script(runs=1, reports=[(0.1, 0, 0.95)], result={"score": 0.6})),
        gpus=1, study={"n_trials": 1}, trainer={"resume_args": ["--resume"]})
    folder = s.spec.output_dir / "checkpoints" / "0"
    s.clock.at(0.5, lambda: (folder / "state.json").write_text("{}"))
    s.clock.at(1.0, lambda: s.driver._on_signal(15, None))
    assert s.run() == 130
    shutil.rmtree(folder)  # its marker, .0.sweep, stays
    s.again()
    said = capture_messages(s)
    assert s.run() == 0
    assert [m for m in said if "steps repeated" in m] == [
        "trial 1 continues lineage 0 but reported step 0 first, not a step after 2: 3 steps "
        "repeated; its checkpoint folder was gone (removed by hand?) before it continued, so "
        "it started over"]


def test_after_a_crash_a_continuation_from_its_last_save_is_not_flagged_a_start_over_is(
        tmp_path):
    """A driver killed (-9) gave its trainer no time to save: resuming from the last save
    (an older step) is what a correct script does; only reporting the lineage's first step
    again is flagged."""
    import optuna
    from optuna.trial import TrialState

    from sweep.testing.harness import capture_messages

    for first, flagged in ((1, False), (0, True)):
        (tmp_path / str(first)).mkdir()
        s = Sweep(tmp_path / str(first), scripted(Script(runs=1, result={"score": 0.6},
                                                         reports=[(0.1, first, 0.9)])),
                  gpus=1, study={"n_trials": 1})
        dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
        s.store.study.add_trial(optuna.trial.create_trial(
            state=TrialState.FAIL, params={"x": 0.5}, distributions=dist,
            intermediate_values={0: 0.9, 1: 0.8, 2: 0.7},
            user_attrs={names.ATTEMPT: 0, names.FAIL_REASON: "driver died (pid 1 on h)"}))
        s.store.study.enqueue_trial({"x": 0.5}, user_attrs={
            names.RETRY_OF: 0, names.ATTEMPT: 1, names.CONTINUES: 0, names.RETRIES: 0})
        said = capture_messages(s)
        assert s.run() == 0
        assert (names.STEPS_REPEATED in s.trials[1].user_attrs) is flagged
        assert bool([m for m in said if "steps repeated" in m]) is flagged
