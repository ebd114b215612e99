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
import hashlib
import os
import re
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import study_dict
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep._core import names, removal, userfiles
from sweep._core.errors import UsageError
from sweep._core.removal import remove_tree
from sweep._core.safefs import UnsafePath
from sweep.schedulers import _disk
from sweep.schedulers.run import Scheduling
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
    trial = s.trials[0]
    assert trial.state.name == "FAIL"
    reason = trial.user_attrs[names.FAIL_REASON]
    if (place, kind) == ("checkpoints", "folder"):  # the user's own folder: sweep adds to it
        assert reason.startswith("no result: nothing at")
        assert (at / "0").is_dir() and (at / ".0.sweep").is_file()
        assert len(s.trials) == 1
    else:  # nothing ran: its continuation waits for the next run (the path fixed)
        assert reason.startswith(f"could not prepare the trial: {at} ")
        assert [t.state.name for t in s.trials[1:]] == ["WAITING"]
        # the next run: a continuation has a folder of its own (trials/1) and runs; in the
        # lineage's folder it finds the same thing: refused again, neither taken for the
        # lineage's checkpoints (no marker beside it) nor emptied
        assert s.rerun() == 1
        assert survived(at, kind, victim)
        if place == "trials/0":
            assert s.trials[1].user_attrs[names.FAIL_REASON].startswith("no result: nothing at")
        else:
            assert [t.state.name for t in s.trials] == ["FAIL", "FAIL", "WAITING"]
            assert s.trials[1].user_attrs[names.FAIL_REASON] == reason
            assert not (tmp_path / "out" / "checkpoints" / ".0.sweep").exists()


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
    reason = s.trials[0].user_attrs[names.FAIL_REASON]
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
        s.trials[0].user_attrs[names.FAIL_REASON])


def test_a_stale_folder_sweep_made_is_still_made_anew(tmp_path):
    """The other side: what sweep made for an earlier study of this output_dir goes."""
    out = tmp_path / "out"
    (out / "trials" / "0").mkdir(parents=True)
    (out / "trials" / ".0.sweep").write_text("0\n")  # sweep's marker, beside it
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


def test_the_file_systems_root_as_output_dir_is_refused():
    """Run as root, `output_dir: /` wrote /trials, /checkpoints, /drivers and /study.json."""
    with pytest.raises(UsageError) as refused:
        folders.check_not_nested(Path("/"), Path("s.yaml"))
    assert str(refused.value) == ("s.yaml: study.output_dir: / is the file system's root: give "
                                  "the study a folder of its own")


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
    user_tree(folder / "b")
    (folder / "b" / "study.json").write_text('{"study": "b", "storage": "sqlite:///b.db"}')
    with pytest.raises(UnsafePath) as refused:
        remove_tree(folder, True)
    assert str(refused.value) == (f"{folder} holds {folder}/b/study.json, another study's "
                                  "output_dir")
    assert intact(folder / "b")


def test_a_clean_retry_empties_only_its_own_folder_never_through_a_link_inside(tmp_path):
    victim = user_tree(tmp_path / "victim")
    folder = lineage.checkpoint_dir(tmp_path / "out", 2)
    folder.mkdir(parents=True)
    (folder / "to_victim").symlink_to(victim, target_is_directory=True)
    (folder / "model.pt").write_text("the lineage's")
    lineage.made_marker(tmp_path / "out", 2).write_text("2\n")  # sweep made it
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


ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CI runs as root)")


@ROOT
def test_a_disk_mounted_inside_a_folder_sweep_made_is_never_emptied(tmp_path):
    folder = tmp_path / "trials" / "0"
    folder.mkdir(parents=True)
    with mounted(folder / "disk"):
        (folder / "disk" / "data.bin").write_text(MINE)
        with pytest.raises(UnsafePath) as refused:
            remove_tree(folder, True)
        assert str(refused.value) == (f"{folder} holds {folder}/disk, where a file system or a "
                                      "folder is mounted: unmount it first")
        assert (folder / "disk" / "data.bin").read_text() == MINE


def test_a_file_a_trainer_calls_study_json_does_not_stop_a_clean_retry(tmp_path):
    """Only a study's marker (naming a study and its storage) marks another study's folder."""
    folder = lineage.checkpoint_dir(tmp_path / "out", 4)
    folder.mkdir(parents=True)
    (folder / "study.json").write_text('{"lr": 0.1, "epochs": 3}')  # the trainer's own
    lineage.made_marker(tmp_path / "out", 4).write_text("4\n")
    lineage.prepare(tmp_path / "out", Lineage(4, 1, 1, continues=4, clean=True))
    assert not any(folder.iterdir())


@ROOT
def test_a_disk_mounted_at_a_trial_folder_itself_is_never_emptied(tmp_path):
    folder = tmp_path / "trials" / "0"
    with mounted(folder):
        (folder / "data.bin").write_text(MINE)
        with pytest.raises(UnsafePath) as refused:
            remove_tree(folder, True)
        assert str(refused.value) == (f"{folder} is where a file system or a folder is "
                                      "mounted: unmount it first")
        assert (folder / "data.bin").read_text() == MINE


# ---- issue 31: the checkpoint folders of lineages that can never continue ---------------

def finished_study(tmp_path: Path) -> Sweep:
    """A scheduler's study (keep_checkpoints: 0) whose two lineages, 0 and 1, trained to the
    end: both can never continue, so both folders are due to go."""
    s = Sweep(tmp_path, lambda p: Script(result=None), gpus=1,
              study={"n_trials": 2, "output_dir": str(tmp_path / "out"),
                     "scheduler": {"type": "asha", "min_steps": 2, "max_steps": 18,
                                   "keep_checkpoints": 0}},
              trainer={"resume_args": ["--resume"]})
    for number in (0, 1):
        s.store.study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=float(number), params={"x": 0.5},
            distributions={"x": FloatDistribution(0.0, 1.0)},
            intermediate_values={17: float(number)}))
    return s


def sweeps_folder(out: Path, origin: int) -> Path:
    """Lineage `origin`'s folder as sweep makes it (its marker beside it), with a link inside
    to the user's tree."""
    folder = lineage.checkpoint_dir(out, origin)
    lineage.prepare(out, Lineage(origin))
    (folder / "model.pt").write_text("the lineage's")
    return folder


@pytest.mark.parametrize(("kind", "marked"), [("link", True), ("folder", False),
                                               ("file", True)])
def test_nothing_planted_at_a_dead_lineages_folder_is_removed(tmp_path, kind, marked):
    victim = user_tree(tmp_path / "victim")
    out = tmp_path / "out"
    out.mkdir()
    s = finished_study(tmp_path)
    ours = sweeps_folder(out, 0)
    (ours / "to_victim").symlink_to(victim, target_is_directory=True)
    at = lineage.checkpoint_dir(out, 1)
    plant(at, kind, victim)
    if marked:  # sweep's marker beside it: the folder sweep made was replaced
        lineage.made_marker(out, 1).write_text("1\n")
    said: list[str] = []
    Scheduling(s.spec, s.store, said.append).tidy()
    assert not ours.exists() and intact(victim)  # its own folder went, not through its link
    assert survived(at, kind, victim)
    assert lineage.made_marker(out, 0).is_file()  # nothing outside the lineage's folder goes
    if kind == "folder":  # a real folder sweep did not make: refused, said once
        assert said[:1] == [f"the checkpoint folder of trial 1 is kept: {at} holds files "
                            "sweep did not put there: move or remove it, or give the study "
                            "another output_dir"]
    else:  # not a folder: not a lineage folder to measure or remove
        assert not any("is kept" in m for m in said)
    Scheduling(s.spec, s.store, said.append).tidy()  # another driver, or a later run
    assert survived(at, kind, victim)


def test_no_dead_lineages_folder_is_removed_through_a_checkpoints_link(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    user_tree(victim / "0")
    user_tree(victim / "1")
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").symlink_to(victim, target_is_directory=True)
    for origin in (0, 1):
        (victim / f".{origin}.sweep").write_text(f"{origin}\n")
    s = finished_study(tmp_path)
    said: list[str] = []
    Scheduling(s.spec, s.store, said.append).tidy()
    assert intact(victim / "0") and intact(victim / "1")
    assert said == []  # nothing measured through it (a trial's start refuses it, saying so)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        _disk.retire(out, 0)


def test_report_and_summary_files_never_replace_a_link_a_fifo_or_a_folder(write_study, tmp_path,
                                                                          capsys):
    """`sweep report -o` and `sweep summary --csv` write a new file that takes the name:
    over a device, a FIFO, a link or a folder it would take theirs (`-o /dev/full` became
    an HTML file). Refused in one line; what was there stays as it was."""
    from conftest import run_cli

    study_file = one_trial_study(write_study)
    fifo, folder, target = tmp_path / "fifo", tmp_path / "folder", tmp_path / "mine.txt"
    os.mkfifo(fifo)
    folder.mkdir()
    target.write_text("mine")
    (tmp_path / "link").symlink_to(target)
    for name in ("fifo", "folder", "link"):
        for verb, flag in (("report", "-o"), ("summary", "--csv")):
            capsys.readouterr()
            assert run_cli(verb, str(study_file), flag, str(tmp_path / name)) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{tmp_path / name}" in err, err
            assert ".report-" not in err and "give the name of a new or plain file" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir() and not any(folder.iterdir())
    assert (tmp_path / "link").is_symlink() and target.read_text() == "mine"
    page = tmp_path / "page.html"
    assert run_cli("report", str(study_file), "-o", str(page)) == 0
    assert run_cli("report", str(study_file), "-o", str(page)) == 0  # a plain file: replaced
    # no temporary file left; only the mark that says sweep wrote page.html
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".page.html.sweep"]


# ---- issue 38, items 1-4: bind mounts, a stray command.sh, the study's own files ---------


def mounts_under(top: Path) -> list[str]:
    """The mount points at or under `top`, read from /proc/self/mountinfo here (not with the
    code under test), deepest first."""
    real = os.path.realpath(top)
    points = []
    for line in Path("/proc/self/mountinfo").read_bytes().splitlines():
        point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split(b" ")[4])
        if os.fsdecode(point) == real or os.fsdecode(point).startswith(real + os.sep):
            points.append(os.fsdecode(point))
    return sorted(points, key=len, reverse=True)


@contextlib.contextmanager
def bind_mounted(source: Path, at: Path) -> Iterator[None]:
    """`source` (a folder of the same file system) bind-mounted at `at`: it shares the
    device number of the folder around it. Every mount under the folder that holds both (the
    test's tmp_path) is unmounted afterwards (`umount -l`), wherever code under test may have
    renamed a folder above it, so that no mount outlives the test."""
    at.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "--bind", str(source), str(at)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        assert os.stat(at).st_dev == os.stat(at.parent).st_dev  # what st_dev cannot see
        yield
    finally:
        for point in mounts_under(Path(os.path.commonpath([source, at]))):
            subprocess.run(["umount", "-l", point], check=True)


def marked_trial_folder(out: Path, number: int) -> Path:
    """Trial `number`'s folder as sweep made it for an earlier trial of that number."""
    folder = out / "trials" / str(number)
    folder.mkdir(parents=True)
    (out / "trials" / f".{number}.sweep").write_text(f"{number}\n")
    (folder / "stdout.log").write_text("the earlier trial's")
    return folder


@ROOT
def test_a_folder_bind_mounted_inside_a_trial_folder_is_never_emptied(tmp_path):
    """Item 1: a bind mount shares its file system's device number, so the st_dev check let
    a trial folder made again take the user's files with it. Refused now, from the kernel's
    list of mount points; the trial fails in one line, its continuation queued."""
    user = user_tree(tmp_path / "data")
    out = tmp_path / "out"
    folder = marked_trial_folder(out, 0)
    s = sweep_of(tmp_path)
    with bind_mounted(user, folder / "data"):
        assert s.run() == 1
        assert [t.state for t in s.trials] == [TrialState.FAIL, TrialState.WAITING]
        assert s.trials[0].user_attrs[names.FAIL_REASON] == (
            f"could not prepare the trial: {folder} holds {folder}/data, where a file system "
            "or a folder is mounted: unmount it first")
        assert intact(folder / "data")
    assert intact(user) and (folder / "stdout.log").read_text() == "the earlier trial's"


@ROOT
@pytest.mark.parametrize("attempt", ["new lineage", "clean retry"])
def test_a_folder_bind_mounted_in_a_lineages_folder_is_never_emptied(tmp_path, attempt):
    """Item 1: a new lineage's folder emptied, and a `retry_from: clean` retry (which then
    failed with 'Device or resource busy' after it had removed the files)."""
    user = user_tree(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    folder = lineage.checkpoint_dir(out, 0)
    lineage.prepare(out, Lineage(0))
    line = Lineage(0) if attempt == "new lineage" else Lineage(0, 1, 1, continues=0, clean=True)
    with bind_mounted(user, folder / "data"), pytest.raises(UnsafePath) as refused:
        lineage.prepare(out, line)
    assert str(refused.value) == (f"{folder} holds {folder}/data, where a file system or a "
                                  "folder is mounted: unmount it first")
    assert intact(user)


@ROOT
def test_a_folder_bind_mounted_in_a_lineages_folder_is_never_retired_or_purged(tmp_path):
    """Item 1: `keep_checkpoints` / `max_checkpoint_gb` removal, both of its steps: the
    folder is not retired with a bind mount in it, and a retired one that has one mounted in
    it since is not purged."""
    user = user_tree(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    folder = lineage.checkpoint_dir(out, 0)
    lineage.prepare(out, Lineage(0))
    with bind_mounted(user, folder / "data"):
        with pytest.raises(UnsafePath, match="where a file system or a folder is mounted"):
            _disk.retire(out, 0)
        assert intact(folder / "data")
    trash = _disk.retire(out, 0)
    assert trash is not None and not folder.exists()
    with bind_mounted(user, trash / "data"):
        done, refused = _disk.purge(out)
        assert done == [] and [str(e) for e in refused] == [
            f"{trash} holds {trash}/data, where a file system or a folder is mounted: "
            "unmount it first"]
    assert intact(user)
    assert _disk.purge(out) == ([trash], []) and not trash.exists()


@ROOT
def test_a_folder_bind_mounted_at_a_trial_folder_itself_is_never_emptied(tmp_path):
    user = user_tree(tmp_path / "data")
    folder = marked_trial_folder(tmp_path / "out", 0)
    with bind_mounted(user, folder), pytest.raises(UnsafePath) as refused:
        remove_tree(folder, True)
    assert str(refused.value) == (f"{folder} is where a file system or a folder is mounted: "
                                  "unmount it first")
    assert intact(user)


def test_the_kernels_mount_list_is_read_with_its_escapes_undone(tmp_path, monkeypatch):
    """A mount point whose name has a space (`\\040` in mountinfo) is still found, and one
    beside the folder, whose name only begins the same, is not inside it."""
    folder = tmp_path / "a b"
    folder.mkdir()
    table = tmp_path / "mountinfo"
    escaped = str(folder).replace(" ", "\\040")
    table.write_text(f"22 1 0:21 / / rw - ext4 /dev/root rw\n"
                     f"45 22 254:0 /data {escaped}/inner rw - ext4 /dev/vda rw\n"
                     f"46 22 254:0 /data {escaped}x rw - ext4 /dev/vda rw\n")
    monkeypatch.setattr(removal, "MOUNTINFO", table)
    assert removal.mounts_at_or_under(folder) == ["inner"]
    assert removal.mounts_at_or_under(tmp_path / "elsewhere") == []
    monkeypatch.setattr(removal, "MOUNTINFO", tmp_path / "none")  # not Linux: st_dev only
    assert removal.mount_points() is None and removal.mounts_at_or_under(folder) == []


def test_a_command_sh_of_the_users_makes_no_folder_sweeps(tmp_path):
    """Item 2: with `output_dir: "."` in a project that has `trials/0/{command.sh,
    results.csv}`, `trials/0` was removed with results.csv: a file named command.sh made any
    folder sweep's. Only sweep's marker beside the folder does, written before it is made."""
    project = tmp_path / "project"
    mine = project / "trials" / "0"
    mine.mkdir(parents=True)
    (mine / "command.sh").write_text("#!/bin/sh\npython train.py\n")
    (mine / "results.csv").write_text("epoch,acc\n1,0.9\n")
    s = Sweep(tmp_path, lambda p: Script(result={"score": 0.5}), gpus=1,
              study={"n_trials": 1, "output_dir": str(project)})
    assert s.run() == 1  # nothing of it ran: its continuation is queued for the next run
    assert (mine / "results.csv").read_text() == "epoch,acc\n1,0.9\n"
    assert (mine / "command.sh").read_text() == "#!/bin/sh\npython train.py\n"
    assert not (project / "trials" / ".0.sweep").exists()
    first, queued = s.trials
    assert first.state is TrialState.FAIL and queued.state is TrialState.WAITING
    assert first.user_attrs[names.FAIL_REASON] == (
        f"could not prepare the trial: {mine} holds files sweep did not put there: move or "
        "remove it, or give the study another output_dir")
    mine.rename(tmp_path / "moved")  # the user moves it away, as the line says
    assert s.rerun() == 0
    assert [t.state for t in s.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert (project / "trials" / ".1.sweep").is_file()  # sweep's folder: marked before made
    assert (tmp_path / "moved" / "results.csv").is_file()


def one_trial_study(write_study: Any) -> Path:
    """A study file whose SQLite study has one COMPLETE trial."""
    study_file = write_study()
    study = optuna.create_study(study_name="probe",
                                storage=f"sqlite:///{study_file.parent / 'probe.db'}")
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE, value=0.5, params={"x": 0.5},
        distributions={"x": FloatDistribution(0.0, 1.0)}))
    return study_file


@pytest.mark.parametrize(("verb", "flag"), [("report", "-o"), ("summary", "--csv")])
def test_the_report_and_csv_never_replace_the_study_file_or_its_storage(write_study, capsys,
                                                                         verb, flag):
    """Item 3: `sweep report s.yaml -o s.db` turned the SQLite study into HTML and exited 0,
    `--csv s.db` the same, and `-o s.yaml` replaced the study file."""
    from conftest import run_cli

    study_file = one_trial_study(write_study)
    db = study_file.parent / "probe.db"
    before = {p: p.read_bytes() for p in (study_file, db)}
    for target, what in ((db, "the study's storage"), (study_file, "the study file")):
        capsys.readouterr()
        assert run_cli(verb, str(study_file), flag, str(target)) == 2
        err = capsys.readouterr().err
        kind = "the report" if verb == "report" else "the summary CSV"
        assert err == (f"sweep: error: {target}: cannot write {kind} there (is {what}); "
                       f"give {flag} another file's name (sweep writes over no file it did "
                       "not write)\n")
    assert {p: p.read_bytes() for p in before} == before
    assert optuna.load_study(study_name="probe", storage=f"sqlite:///{db}").trials[0].value == 0.5


@pytest.mark.parametrize(("verb", "name", "flag"),
                         [("report", "report.html", "-o"), ("summary", "summary.csv", "--csv")])
def test_a_file_sweep_did_not_write_is_never_replaced_at_the_default_path(write_study, capsys,
                                                                          verb, name, flag):
    """Item 4: a `summary.csv` or `report.html` in output_dir that sweep did not write (or
    one it wrote and the user edited since) was overwritten. Only what sweep wrote, as it
    wrote it, is replaced; otherwise one line naming -o / --csv."""
    from conftest import run_cli

    study_file = one_trial_study(write_study)
    spec = config.load(study_file)
    path = spec.output_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MINE)
    capsys.readouterr()
    code = run_cli(verb, str(study_file))
    err = capsys.readouterr().err
    assert path.read_text() == MINE
    why = "is a file sweep did not write, or one changed since"
    if verb == "report":
        assert code == 2 and err == (f"sweep: error: {path}: cannot write the report there "
                                     f"({why}); "
                                     f"give -o another file's name (sweep writes over no file "
                                     "it did not write)\n")
    else:  # the table is shown all the same
        assert code == 0 and err == (f"sweep: the summary CSV is not written: {path}: {why}; "
                                     f"give --csv another file's name (sweep writes over no "
                                     "file it did not write)\n")
    path.unlink()
    assert run_cli(verb, str(study_file)) == 0 and path.read_text() != MINE
    assert run_cli(verb, str(study_file)) == 0  # sweep's own, as it wrote it: replaced
    with path.open("a") as f:
        f.write("a note of the user's\n")  # edited since: the user's now
    capsys.readouterr()
    assert run_cli(verb, str(study_file)) == (2 if verb == "report" else 0)
    assert why in capsys.readouterr().err
    assert path.read_text().endswith("a note of the user's\n")


def mounted_on_check(monkeypatch: pytest.MonkeyPatch, module: Any, user: Path, at: Path,
                     stack: contextlib.ExitStack) -> None:
    """`module.removable` checks as it does, then `user` is bind-mounted at `at`: the window
    between the check and the removal, forced."""
    check = module.removable

    def then_mounted(path: Path, made: bool) -> bool:
        ok = check(path, made)
        stack.enter_context(bind_mounted(user, at))
        return ok

    monkeypatch.setattr(module, "removable", then_mounted)


@ROOT
@pytest.mark.parametrize("depth", ["data", "a/b/data"])
def test_a_folder_bind_mounted_after_the_check_is_never_crossed(tmp_path, monkeypatch, depth):
    """Item 1 (review): a mount made after `removable` looked was crossed by the removal
    (shutil.rmtree); each folder's mount is now compared before anything in it goes."""
    user = user_tree(tmp_path / "data")
    folder = marked_trial_folder(tmp_path / "out", 0)
    with contextlib.ExitStack() as stack:
        mounted_on_check(monkeypatch, removal, user, folder / depth, stack)
        with pytest.raises(UnsafePath) as refused:
            remove_tree(folder, True)
        assert str(refused.value) == (f"{folder} holds {folder / depth}, where a file system "
                                      "or a folder is mounted: unmount it first")
        assert intact(folder / depth)
    assert intact(user)


@ROOT
def test_a_lineages_folder_mounted_in_after_the_check_is_not_retired(tmp_path, monkeypatch):
    """Item 1 (review): `retire` renamed a folder with a mount made in it after the check;
    it is refused now, with nothing renamed."""
    user = user_tree(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    folder = lineage.checkpoint_dir(out, 0)
    lineage.prepare(out, Lineage(0))
    with contextlib.ExitStack() as stack:
        mounted_on_check(monkeypatch, _disk, user, folder / "data", stack)
        with pytest.raises(UnsafePath) as refused:
            _disk.retire(out, 0)
        assert str(refused.value) == (f"{folder} holds {folder}/data, where a file system or "
                                      "a folder is mounted: unmount it first")
        assert sorted(os.listdir(folder.parent)) == [".0.lock", ".0.sweep", "0"]  # no trash
        assert intact(folder / "data")
    assert intact(user)


def test_a_mark_that_cannot_be_written_leaves_no_file_sweep_would_refuse(tmp_path,
                                                                          monkeypatch):
    """Item 4 (review): the report was written before its mark, so a mark that could not be
    written left a report sweep refused to write over ever after. The mark goes first now;
    a failure at either step leaves nothing, or a file the mark names."""
    path = tmp_path / "report.html"
    userfiles.output_mark(path).mkdir()  # the mark cannot be written
    with pytest.raises(OSError):
        userfiles.replace_output(path, "one")
    assert not path.exists()
    userfiles.output_mark(path).rmdir()
    userfiles.replace_output(path, "two")
    assert path.read_text() == "two" and userfiles.wrote(path)

    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(userfiles, "replace_file", full)
        with pytest.raises(OSError, match="No space left"):
            userfiles.replace_output(path, "three")
    assert path.read_text() == "two" and userfiles.wrote(path)
    userfiles.replace_output(path, "four")
    assert path.read_text() == "four" and userfiles.wrote(path)
    assert userfiles.output_mark(path).read_text().splitlines() == [
        hashlib.sha256(b"four").hexdigest()]


def test_two_writers_of_one_report_never_leave_it_unmarked(tmp_path):
    """Item 4 (review): two `sweep report` at once: one's mark could name the other's file,
    and both (and every later one) then refused it. They take turns now (a stress loop)."""
    path = tmp_path / "report.html"
    failed: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(200):
                userfiles.replace_output(path, f"{name} {i}\n" * 100)
        except BaseException as e:
            failed.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed == [] and userfiles.wrote(path)


def test_the_storages_side_files_and_locks_are_never_written_even_before_they_exist(
        write_study, tmp_path):
    """Item 5 (review): SQLite's -journal, -wal, -shm, the journal's lock and sweep's budget
    lock were not among the files report -o / summary --csv never write, and a file not
    there yet was not matched by name."""
    from sweep.analysis.summary import own_files

    study_file = one_trial_study(write_study)
    spec = config.load(study_file, runnable=False)
    db = study_file.parent / "probe.db"
    real = Path(os.path.realpath(db))
    assert [(str(p), w) for p, w in own_files(spec)] == [
        (str(study_file), "the study file"), (str(db), "the study's storage"),
        (f"{db}-journal", "the study's storage's -journal file"),
        (f"{db}-wal", "the study's storage's -wal file"),
        (f"{db}-shm", "the study's storage's -shm file"),
        (f"{real}.lock", "sweep's budget lock of the study's storage")]
    for side in ("-wal", ".lock"):
        target = Path(f"{db}{side}")
        with pytest.raises(UnsafePath, match=r"is the study's storage's -wal file|budget lock"):
            userfiles.replace_output(target, "<html>", own_files(spec))
        assert not target.exists() and not userfiles.output_mark(target).exists()
    journal = tmp_path / "j.log"
    spec = config.load(study_file, runnable=False, storage=f"journal://{journal}")
    assert [(str(p), w) for p, w in own_files(spec)][1:] == [
        (str(journal), "the study's storage"), (f"{journal}.lock", "the study's storage's lock"),
        (f"{journal}.budget.lock", "sweep's budget lock of the study's storage")]


def test_trial_folders_of_an_older_sweep_are_said_once_as_the_run_starts(tmp_path):
    """Item 6 (review): trial folders an older sweep left (command.sh, no mark) were refused
    one a run, each as its trial failed; the run now says them once, as it starts, naming
    trials/, and what to do."""
    from sweep.testing.harness import capture_messages

    out = tmp_path / "out"
    for n in (0, 3):
        (out / "trials" / str(n)).mkdir(parents=True)
        (out / "trials" / str(n) / "command.sh").write_text("#!/bin/sh\n")
    (out / "trials" / "7").mkdir()  # empty: sweep makes it anew, said not
    s = sweep_of(tmp_path)
    said = capture_messages(s)
    assert s.run() == 1  # trial 0's folder is still refused
    trials = out / "trials"
    assert [m for m in said if "older sweep" in m] == [
        f"{trials} holds trial folders of an older sweep, without sweep's mark (.<n>.sweep) "
        f"beside them: 0, 3; sweep removes none of them, and a trial of such a number fails "
        f"to prepare: move {trials} away, or give the study another output_dir"]
    assert (trials / "3" / "command.sh").is_file()
