"""Nothing outside a study's own files is ever removed (issue 32, the data-loss items).

sweep removes or empties, in all: a trial's folder (`trials/<n>/`, made anew), a lineage's
checkpoint folder (`checkpoints/<origin>/`, emptied for a new lineage or a clean retry), and,
before issue 32, the declared result file. Each test plants a link, a folder and a user's file
at each of those places (and a folder where a file is declared) and checks that nothing of
the user's goes: sweep removes only what it made, inside folders it made, never through a
link, and refuses the rest in one line.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import study_dict

from sweep._core.errors import UsageError
from sweep._core.safefs import UnsafePath, remove_tree
from sweep.spec import config, schema
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep
from sweep.trial import folders, lineage
from sweep.trial.lineage import Lineage

MINE = "the user's, not sweep's"


def user_tree(root: Path) -> Path:
    """A user's folder with a file in it and a subfolder: what must survive."""
    root.mkdir(parents=True)
    (root / "keep.txt").write_text(MINE)
    (root / "sub").mkdir()
    (root / "sub" / "data.bin").write_text(MINE)
    return root


def intact(root: Path) -> bool:
    return ((root / "keep.txt").read_text() == MINE
            and (root / "sub" / "data.bin").read_text() == MINE)


def plant(at: Path, kind: str, victim: Path) -> None:
    """A link to the user's folder, a user's folder, or a user's file at `at`."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        at.symlink_to(victim, target_is_directory=True)
    elif kind == "folder":
        user_tree(at)
    else:
        at.write_text(MINE)


def survived(at: Path, kind: str, victim: Path) -> bool:
    if kind == "link":
        return at.is_symlink() and intact(victim)
    if kind == "folder":
        return intact(at)
    return at.read_text() == MINE


def sweep_of(tmp_path: Path, **trainer: Any) -> Sweep:
    return Sweep(tmp_path, lambda p: Script(result=None), gpus=1,
                 study={"n_trials": 1, "max_consecutive_failures": 1,
                        "output_dir": str(tmp_path / "out")},
                 trainer=trainer)


# the places sweep removes or empties, relative to output_dir (trial 0, lineage 0)
PLACES = ["trials/0", "checkpoints", "checkpoints/0"]


@pytest.mark.parametrize("kind", ["link", "folder", "file"])
@pytest.mark.parametrize("place", PLACES)
def test_nothing_planted_where_sweep_removes_is_removed(tmp_path, place, kind):
    victim = user_tree(tmp_path / "victim")
    at = tmp_path / "out" / place
    plant(at, kind, victim)
    s = sweep_of(tmp_path)
    assert s.run() == 1
    assert survived(at, kind, victim)
    [trial] = s.trials
    assert trial.state.name == "FAIL"
    reason = trial.user_attrs["fail_reason"]
    if (place, kind) == ("checkpoints", "folder"):  # the user's own folder: sweep adds to it
        assert reason.startswith("no result: nothing at")
        assert (at / "0").is_dir() and (at / ".0.sweep").is_file()
    else:
        assert reason.startswith(f"could not prepare the trial: {at} ")


@pytest.mark.parametrize("kind", ["link", "folder", "file"])
def test_a_declared_result_file_is_never_removed(tmp_path, kind):
    """Before issue 32 the declared result file was removed before each trial: a folder
    named there went with all it held."""
    victim = user_tree(tmp_path / "victim")
    at = tmp_path / "results" / "0.json"
    plant(at, kind, victim)
    s = sweep_of(tmp_path, result={"file": str(tmp_path / "results" / "{trial_number}.json")})
    assert s.run() == 1
    assert survived(at, kind, victim)
    reason = s.trials[0].user_attrs["fail_reason"]
    if kind == "file":  # the user's file is not the trial's result
        assert reason == (f"no result: {at} was last written before the trial started (left "
                          "by an earlier run?)")
    else:
        assert reason == (f"could not prepare the trial: {at} is a folder: trainer.result.file "
                          "must name a file (the one the trainer writes)")


@pytest.mark.parametrize("declared", ["{study_dir}", "{output_dir}",
                                      "{trial_dir}/../../../mydata"])
def test_a_folder_given_as_the_result_file_is_refused_and_kept(tmp_path, declared):
    """The hostile pass: `result: {file: "{study_dir}"}` removed the user's project, its
    .git, the study file and the database."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text(MINE)
    user_tree(tmp_path / "mydata")
    user_tree(tmp_path / "out" / "notes")
    s = sweep_of(tmp_path, result={"file": declared})
    assert s.run() == 1
    assert (tmp_path / ".git" / "HEAD").read_text() == MINE
    assert (tmp_path / "study.yaml").is_file()
    assert intact(tmp_path / "mydata") and intact(tmp_path / "out" / "notes")
    assert "is a folder: trainer.result.file must name a file" in (
        s.trials[0].user_attrs["fail_reason"])


def test_a_stale_folder_sweep_made_is_still_made_anew(tmp_path):
    """The other side: what sweep made for an earlier study of this output_dir goes."""
    out = tmp_path / "out"
    (out / "trials" / "0").mkdir(parents=True)
    (out / "trials" / "0" / "command.sh").write_text("#!/bin/sh\n")
    (out / "trials" / "0" / "old.log").write_text("old")
    (out / "checkpoints" / "0").mkdir(parents=True)
    (out / "checkpoints" / "0" / "model.pt").write_text("old")
    lineage.made_marker(out, 0).write_text("0\n")
    s = Sweep(tmp_path, lambda p: Script(result={"score": 0.5}), gpus=1,
              study={"n_trials": 1, "output_dir": str(out)})
    assert s.run() == 0
    assert not (out / "trials" / "0" / "old.log").exists()
    assert not any((out / "checkpoints" / "0").iterdir())


def spec_at(tmp_path: Path, name: str, output_dir: Path) -> schema.Spec:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study_dict(study={
        "name": name, "output_dir": str(output_dir),
        "storage": f"sqlite:///{tmp_path}/{name}.db"}), sort_keys=False))
    return config.load(path)


def test_an_output_dir_inside_another_studys_is_refused_before_anything_is_written(tmp_path):
    """The hostile pass: an output_dir inside another study's trial folder was accepted, and
    later deleted with it."""
    a = spec_at(tmp_path, "a", tmp_path / "a")
    folders.claim_output_dir(a.output_dir, folders.owner_of(a), a.source)
    inner = tmp_path / "a" / "trials" / "3" / "b"
    b = spec_at(tmp_path, "b", inner)
    with pytest.raises(UsageError) as refused:
        folders.claim_output_dir(inner, folders.owner_of(b), b.source)
    assert str(refused.value) == (
        f"{b.source}: study.output_dir: {inner} is inside {tmp_path}/a/trials, a folder of "
        f"study 'a' (storage sqlite:///{tmp_path}/a.db) (see {tmp_path}/a/study.json) whose "
        "contents are removed with its trials: give this study a folder of its own")
    assert not inner.exists() and not (tmp_path / "b.db").exists()
    beside = tmp_path / "a" / "ablation"  # next to a's trials, not in them: fine
    c = spec_at(tmp_path, "c", beside)
    folders.claim_output_dir(beside, folders.owner_of(c), c.source)
    assert (beside / "study.json").is_file()


def test_a_study_inside_a_trial_folder_stops_its_removal(tmp_path):
    """Made the other way round (the inner study first): the outer study's trial folder that
    holds it is never removed."""
    folder = tmp_path / "trials" / "3"
    folder.mkdir(parents=True)
    (folder / "command.sh").write_text("#!/bin/sh\n")
    user_tree(folder / "b")
    (folder / "b" / "study.json").write_text('{"study": "b", "storage": "sqlite:///b.db"}')
    with pytest.raises(UnsafePath) as refused:
        remove_tree(folder, "command.sh")
    assert str(refused.value) == (f"{folder} holds {folder}/b/study.json, another study's "
                                  "output_dir")
    assert intact(folder / "b")


def test_a_clean_retry_empties_only_its_own_folder_never_through_a_link_inside(tmp_path):
    victim = user_tree(tmp_path / "victim")
    folder = lineage.checkpoint_dir(tmp_path / "out", 2)
    folder.mkdir(parents=True)
    (folder / "to_victim").symlink_to(victim, target_is_directory=True)
    (folder / "model.pt").write_text("the lineage's")
    lineage.prepare(tmp_path / "out", Lineage(2, 1, 1, continues=2, clean=True))
    assert not any(folder.iterdir()) and intact(victim)


@contextlib.contextmanager
def mounted(at: Path) -> Iterator[None]:
    at.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "sweep-test",
                           str(at)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(at)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CI runs as root)")
def test_a_disk_mounted_inside_a_folder_sweep_made_is_never_emptied(tmp_path):
    folder = tmp_path / "trials" / "0"
    folder.mkdir(parents=True)
    (folder / "command.sh").write_text("#!/bin/sh\n")
    with mounted(folder / "disk"):
        (folder / "disk" / "data.bin").write_text(MINE)
        with pytest.raises(UnsafePath, match="another file system mounted there"):
            remove_tree(folder, "command.sh")
        assert (folder / "disk" / "data.bin").read_text() == MINE


def test_a_file_a_trainer_calls_study_json_does_not_stop_a_clean_retry(tmp_path):
    """Only a study's marker (naming a study and its storage) marks another study's folder."""
    folder = lineage.checkpoint_dir(tmp_path / "out", 4)
    folder.mkdir(parents=True)
    (folder / "study.json").write_text('{"lr": 0.1, "epochs": 3}')  # the trainer's own
    lineage.prepare(tmp_path / "out", Lineage(4, 1, 1, continues=4, clean=True))
    assert not any(folder.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CI runs as root)")
def test_a_disk_mounted_at_a_trial_folder_itself_is_never_emptied(tmp_path):
    folder = tmp_path / "trials" / "0"
    with mounted(folder):
        (folder / "command.sh").write_text("#!/bin/sh\n")
        (folder / "data.bin").write_text(MINE)
        with pytest.raises(UnsafePath, match="is where another file system is mounted"):
            remove_tree(folder, "command.sh")
        assert (folder / "data.bin").read_text() == MINE
