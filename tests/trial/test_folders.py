"""Trial folders and files that can be trusted (issue 26, items 1, 6, 8 and 10): a folder of
one study, made anew for each trial; no link followed, no other user's folder written in;
secrets left out of command.sh; a full or removed output_dir fails one trial, not the run."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import study_dict

from sweep._core import names
from sweep._core.errors import UsageError
from sweep._core.safefs import UnsafePath
from sweep.analysis import logs
from sweep.commands._dry_run import dry_run
from sweep.commands.assembly import execute
from sweep.gpus.monitor import SAMPLE_COLUMNS, Monitor, NoReader
from sweep.gpus.pool import Pool, fake_devices
from sweep.spec import config, schema, storageurl
from sweep.study.storage import find
from sweep.testing.fakes import Script
from sweep.testing.harness import Sweep
from sweep.trial import command_script, folders, launch_plan
from sweep.trial.folders import TrialFileError, TrialPaths

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def load(tmp_path: Path, name: str = "study.yaml", **sections: Any) -> schema.Spec:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(study_dict(**sections), sort_keys=False))
    return config.load(path)


def plan_of(tmp_path: Path, number: int = 0, env: dict[str, str] | None = None,
            args: list[str] | None = None, **sections: Any) -> launch_plan.LaunchPlan:
    trainer = {"env": env or {}, "args": args or [], **sections.pop("trainer", {})}
    spec = load(tmp_path, trainer=trainer, **sections)
    return launch_plan.plan_trial(spec, number, {"x": 0.5}, 0)


# ---- item 1: a trial folder belongs to one study, and to one trial --------------------


def test_a_result_file_left_by_an_earlier_trial_of_that_number_never_counts(tmp_path):
    """Item 1: a study restarted in the same output_dir, whose trainer writes no result,
    COMPLETEd with the old trial's `result.file` value (0.7524). The old file is not removed
    (issue 32: it may be the user's): the very file found before the trial never counts,
    however new its time."""
    old = tmp_path / "out" / "results" / "0.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"score": 0.7524}))
    stale = tmp_path / "out" / "trials" / "0"
    stale.mkdir(parents=True)
    (stale.parent / ".0.sweep").write_text("0\n")  # sweep's marker: from the earlier study
    (stale / "checkpoint.pt").write_text("another trial's")
    s = Sweep(tmp_path, lambda p: Script(result=None), gpus=1,
              study={"n_trials": 1, "max_consecutive_failures": 1,
                     "output_dir": str(tmp_path / "out")},
              trainer={"result": {"file": "{output_dir}/results/{trial_number}.json"}})
    assert s.run() == 1
    [trial] = s.trials
    assert trial.state.name == "FAIL"
    assert trial.user_attrs[names.FAIL_REASON] == (
        f"no result: {old} was last written before the trial started (left by an earlier "
        "run?)")
    assert json.loads(old.read_text()) == {"score": 0.7524}  # never removed
    assert not (stale / "checkpoint.pt").exists()  # sweep's stale trial folder was made anew


@pytest.mark.parametrize("planted", ["link", "file", "folder"])
def test_prepare_never_removes_a_link_file_or_folder_sweep_did_not_make(tmp_path, planted):
    """Issue 32: a link, a file or a folder at a trial's folder's place that sweep did not
    make is refused, and nothing of it (or of what a link points to) goes."""
    plan = plan_of(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    plan.paths.dir.parent.mkdir(parents=True)
    if planted == "link":
        plan.paths.dir.symlink_to(victim)
    elif planted == "file":
        plan.paths.dir.write_text("mine")
    else:
        plan.paths.dir.mkdir()
        (plan.paths.dir / "keep").write_text("mine")
    with pytest.raises(TrialFileError) as refused:
        folders.prepare_trial_dir(plan, {"x": 0.5})
    why = {"link": "is a symbolic link", "file": "is not a folder",
           "folder": "holds files sweep did not put there: move or remove it, or give the "
                     "study another output_dir"}
    assert str(refused.value) == f"{plan.paths.dir} {why[planted]}"
    assert (victim / "keep").read_text() == "mine"
    kept = plan.paths.dir.read_text() if planted == "file" else (plan.paths.dir / "keep")
    assert kept == "mine" or kept.read_text() == "mine"


def test_prepare_makes_a_trial_folder_sweep_made_anew(tmp_path):
    plan = plan_of(tmp_path)
    folders.prepare_trial_dir(plan, {"x": 0.5})
    (plan.paths.dir / "model.pt").write_text("the earlier trial's")
    (plan.paths.dir / "link").symlink_to(tmp_path / "victim")
    (tmp_path / "victim").write_text("mine")
    folders.prepare_trial_dir(plan, {"x": 0.5})
    assert sorted(p.name for p in plan.paths.dir.iterdir()) == ["command.sh", "params.json"]
    assert (tmp_path / "victim").read_text() == "mine"


def test_a_second_study_is_refused_its_output_dir_before_storage_is_touched(tmp_path):
    """Item 1: two studies in one output_dir overwrote each other's trial folders and swapped
    values; the second is refused in one line, and its storage is never created."""
    out = tmp_path / "out"
    first = load(tmp_path, "a.yaml", study={"name": "a", "output_dir": str(out),
                                              "storage": f"sqlite:///{tmp_path}/a.db"})
    folders.claim_output_dir(out, folders.owner_of(first), first.source)
    folders.claim_output_dir(out, folders.owner_of(first), first.source)  # again: its own
    assert json.loads((out / "study.json").read_text()) == {
        "study": "a", "storage": f"sqlite:///{tmp_path}/a.db"}
    second = load(tmp_path, "b.yaml", study={"name": "b", "output_dir": str(out),
                                               "storage": f"sqlite:///{tmp_path}/b.db"})
    with pytest.raises(UsageError) as refused, find(second) as found:
        execute(second, [], found)
    assert str(refused.value) == (
        f"{second.source}: study.output_dir: {out} holds the trials of study 'a' (storage "
        f"sqlite:///{tmp_path}/a.db), see {out}/study.json: give this study another "
        "output_dir, or remove that folder to start afresh")
    assert not (tmp_path / "b.db").exists()


def test_the_same_name_in_another_storage_is_another_study(tmp_path):
    out = tmp_path / "out"
    a = load(tmp_path, "a.yaml", study={"name": "s", "output_dir": str(out),
                                          "storage": f"sqlite:///{tmp_path}/1.db"})
    b = load(tmp_path, "b.yaml", study={"name": "s", "output_dir": str(out),
                                          "storage": f"sqlite:///{tmp_path}/2.db"})
    folders.claim_output_dir(out, folders.owner_of(a), a.source)
    with pytest.raises(UsageError, match="holds the trials of study 's' "):
        folders.claim_output_dir(out, folders.owner_of(b), b.source)


def test_the_marker_shows_no_password(tmp_path):
    spec = load(tmp_path, study={"storage": "postgresql://me:hunter2@db:5432/s"})
    assert "hunter2" not in folders.owner_of(spec).storage


def test_logs_of_a_study_never_show_another_studys_files(tmp_path):
    """Item 1: `sweep logs` of the old study showed the new study's trial 0."""
    out = tmp_path / "out"
    mine = load(tmp_path, "a.yaml", study={"name": "a", "output_dir": str(out)})
    theirs = load(tmp_path, "b.yaml", study={"name": "b", "output_dir": str(out)})
    folders.claim_output_dir(out, folders.owner_of(theirs), theirs.source)
    (out / "trials" / "0").mkdir(parents=True)
    (out / "trials" / "0" / "stdout.log").write_text("study b's trial 0\n")
    with pytest.raises(UsageError, match="holds the trials of study 'b'"):
        list(logs.trial_log(mine.source, 0))
    assert list(logs.trial_log(theirs.source, 0)) == ["study b's trial 0\n"]
    with pytest.raises(UsageError, match="holds the trials of study 'b'"), find(mine) as found:
        dry_run(mine, [], found)  # as a run would


# ---- item 6: no link followed, no other user's folder trusted -------------------------


def test_a_planted_log_link_never_truncates_what_it_points_to(tmp_path):
    """Item 6: a pre-made `trials/0/stdout.log -> victim` had sweep truncate the victim."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "stdout.log").symlink_to(victim)
    with pytest.raises(TrialFileError, match=r"stdout.log is a symbolic link"):
        folders.open_log(folder / "stdout.log")
    os.link(victim, folder / "stderr.log")
    with pytest.raises(TrialFileError, match=r"stderr.log has other hard links"):
        folders.open_log(folder / "stderr.log")
    assert victim.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_an_output_dir_of_another_user_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, NOBODY, -1)
    spec = load(tmp_path, study={"output_dir": str(out)})
    with pytest.raises(UsageError) as refused:
        folders.claim_output_dir(out, folders.owner_of(spec), spec.source)
    assert str(refused.value).startswith(
        f"{spec.source}: study.output_dir: {out} is owned by nobody, not by root who runs "
        "sweep")
    assert not (out / "study.json").exists()


def test_an_output_dir_writable_by_every_user_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    spec = load(tmp_path, study={"output_dir": str(out)})
    with pytest.raises(UsageError, match=r"out is writable by every user \(mode 777\)"):
        folders.claim_output_dir(out, folders.owner_of(spec), spec.source)


def test_an_output_dir_under_a_folder_anyone_may_change_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename what is in it
    spec = load(tmp_path, study={"output_dir": str(shared / "out")})
    with pytest.raises(UsageError, match=r"is inside .*shared, writable by every user"):
        folders.claim_output_dir(spec.output_dir, folders.owner_of(spec), spec.source)
    shared.chmod(0o1777)  # sticky, as /tmp
    folders.claim_output_dir(spec.output_dir, folders.owner_of(spec), spec.source)


# ---- item 8: no secret in command.sh ------------------------------------------------


def test_trial_files_are_private_and_command_sh_leaves_out_secrets(tmp_path, monkeypatch):
    """Item 8: `$HF_TOKEN` in trainer.args and `WANDB_API_KEY` in trainer.env were written
    into a 0644 command.sh in 0755 folders."""
    environ = {**os.environ, "HF_TOKEN": "hf_abcdefghijkl"}
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    spec = load(tmp_path, trainer={
        "env": {"WANDB_API_KEY": "wandb-secret-1234", "MODE": "fast"},
        "args": ["--token=$HF_TOKEN", "--name", "run"]})
    plan = launch_plan.build_launch(spec.trainer, 0, {"x": 0.5}, 0,
                               TrialPaths.of(spec.output_dir, 0),
                               launch_plan.ACCELERATE_CONFIG_FILE,
                               places=launch_plan.spec_places(spec), environ=environ)
    assert "--token=hf_abcdefghijkl" in plan.argv  # the trainer gets it
    folders.prepare_trial_dir(plan, {"x": 0.5},
                               command_script.arg_secrets(spec.trainer.args, environ))
    paths = plan.paths
    assert (mode(paths.dir), mode(paths.dir.parent)) == (0o700, 0o700)
    assert (mode(paths.params), mode(paths.command)) == (0o600, 0o700)
    text = paths.command.read_text()
    assert "hf_abcdefghijkl" not in text and "wandb-secret-1234" not in text
    assert "# left out (their names look secret): HF_TOKEN, WANDB_API_KEY;" in text
    assert "MODE=fast" in text
    # runnable by its owner with the secrets from the environment: here, a script that
    # prints what it got
    paths.command.write_text(text.replace(str(spec.trainer.script), str(tmp_path / "p.py")))
    (tmp_path / "p.py").write_text(
        "import os, sys; print(sys.argv[1:], os.environ['WANDB_API_KEY'])")
    done = subprocess.run([str(paths.command)], capture_output=True, text=True, check=True,
                          env={**environ, "WANDB_API_KEY": "wandb-secret-1234"})
    assert done.stdout.split("] ")[1].strip() == "wandb-secret-1234"
    assert "'--token=hf_abcdefghijkl'" in done.stdout
    unset = subprocess.run([str(paths.command)], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"]})
    assert unset.returncode != 0 and "is left out of command.sh: set it" in unset.stderr


def test_logs_are_private(tmp_path):
    with folders.open_log(tmp_path / "stdout.log") as f:
        f.write(b"x")
    assert mode(tmp_path / "stdout.log") == 0o600


def test_secret_looking_names():
    assert [n for n in ("HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                        "MODE", "CUDA_VISIBLE_DEVICES", "SWEEP_PARAM_KEY_SIZE")
            if command_script.secret_name(n)] == ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD",
                                            "AWS_SECRET_ACCESS_KEY"]


# ---- item 10: a full, read-only or removed output_dir --------------------------------


def test_a_trial_that_cannot_be_prepared_fails_alone_and_the_run_stops_starting(
        tmp_path, monkeypatch):
    """Item 10: a full output_dir ended the run with a bare OSError naming no path and turned
    the healthy running trials into `FAIL driver error`."""
    s = Sweep(tmp_path, lambda p: Script(runs=5.0), gpus=3, study={"n_trials": 6})
    full = TrialPaths.of(s.spec.output_dir, 2).dir
    real_mkdir = os.mkdir

    def mkdir(path: Any, *args: Any, **kw: Any) -> None:
        if Path(path) == full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert s.run() == 1
    states = {t.number: (t.state.name, t.user_attrs.get(names.FAIL_REASON)) for t in s.trials}
    reason = f"cannot write {full}: No space left on device"
    # nothing of trial 2 ran: its continuation is queued for the next run (hostile pass: a
    # promotion whose folder could not be prepared was lost for good)
    assert states == {0: ("COMPLETE", None), 1: ("COMPLETE", None),
                      2: ("FAIL", f"could not prepare the trial: {reason}"),
                      3: ("WAITING", None)}
    carried = s.trials[3].user_attrs
    assert carried[names.CONTINUES] == 2 and carried[names.RETRIES] == 0
    assert s.driver.policy.stop_reason == f"trial 2 could not be prepared: {reason}"
    assert s.driver.policy.result(s.store.counts()).message.startswith(
        f"trial 2 could not be prepared: {reason}; 2/6 trials finished")


def test_the_drivers_folder_is_made_again_when_output_dir_was_removed(tmp_path):
    """Item 10: with output_dir deleted mid-run, `launcher: accelerate` failed every later
    trial on the missing accelerate config (in the driver's folder then; in the package now)."""
    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=1, study={"n_trials": 2})
    own = s.driver.own
    seen: list[bool] = []

    def removed(done: Any) -> None:
        if done.number == 0:
            shutil.rmtree(s.spec.output_dir)

    s.driver.events.finished = removed  # type: ignore[method-assign]
    s.driver.events.started = lambda st: seen.append(own.is_dir())  # type: ignore
    assert s.run() == 0
    assert s.states() == ["COMPLETE", "COMPLETE"]
    assert seen == [True, True]  # there when trial 1 started, as for trial 0
    assert folders.read_marker(s.spec.output_dir) == folders.owner_of(s.spec)


def test_an_output_dir_another_study_took_meanwhile_fails_the_trial_and_stops(tmp_path):
    s = Sweep(tmp_path, lambda p: Script(runs=1.0), gpus=1, study={"n_trials": 3})

    def taken(done: Any) -> None:
        if done.number == 0:
            shutil.rmtree(s.spec.output_dir)
            s.spec.output_dir.mkdir()
            (s.spec.output_dir / "study.json").write_text(
                json.dumps({"study": "other", "storage": "sqlite:///other.db"}))

    s.driver.events.finished = taken  # type: ignore[method-assign]
    assert s.run() == 1
    assert s.states() == ["COMPLETE", "FAIL", "WAITING"]  # its continuation, for a next run
    assert s.trials[1].user_attrs[names.FAIL_REASON] == (
        f"could not prepare the trial: {s.spec.output_dir} was removed during the run and "
        "now holds the trials of study 'other' (storage sqlite:///other.db)")


def test_the_monitor_warns_once_while_samples_cannot_be_written(tmp_path, caplog):
    """Item 10: the monitor logged a warning every second once its folder was gone."""
    pool = Pool(fake_devices("1"), 1)
    monitor = Monitor(NoReader(), pool, tmp_path / "gone" / "samples.csv", 0.0)
    calls = 0
    real = monitor.sample_once

    def sample(now: float | None = None) -> Any:
        nonlocal calls
        calls += 1
        if calls == 4:
            (tmp_path / "gone").mkdir()  # back: the next failure is said again
        if calls == 6:
            shutil.rmtree(tmp_path / "gone")
        if calls == 8:
            monitor._stop.set()
        return real(now)

    monitor.sample_once = sample  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="sweep"):
        monitor._run()
    assert calls == 8
    assert len([r for r in caplog.records if "GPU samples" in r.getMessage()]) == 2


def test_a_samples_file_made_again_gets_its_header(tmp_path):
    monitor = Monitor(NoReader(), Pool(fake_devices("1"), 1), tmp_path / "s.csv", 1.0)
    monitor.sample_once(1.0)
    assert (tmp_path / "s.csv").read_text().splitlines()[0] == ",".join(SAMPLE_COLUMNS)


def test_every_unsafe_path_is_an_oserror_that_names_it(tmp_path):
    e = UnsafePath(tmp_path / "x", "is a symbolic link")
    assert isinstance(e, OSError) and str(e) == f"{tmp_path}/x is a symbolic link"


def test_a_result_older_than_the_trial_never_counts_even_if_it_survived(tmp_path):
    """Item 1, the second guard: a result file last written before the trial was prepared
    (put back with its old time, say) is not the trial's."""
    old = tmp_path / "out" / "results" / "0.json"
    s = Sweep(tmp_path, lambda p: Script(result=None), gpus=1,
              study={"n_trials": 1, "max_consecutive_failures": 1,
                     "output_dir": str(tmp_path / "out")},
              trainer={"result": {"file": "{output_dir}/results/{trial_number}.json"}})

    def restored(plan: Any, grace: float, on_change: Any, hold: Any = ()) -> Any:
        old.parent.mkdir(parents=True, exist_ok=True)
        old.write_text(json.dumps({"score": 0.7524}))
        prepared = plan.paths.command.stat().st_mtime_ns
        os.utime(old, ns=(prepared - 2_000_000_000, prepared - 2_000_000_000))
        return spawn(plan, grace, on_change, hold)

    spawn = s.spawn
    s.driver.spawn = restored
    assert s.run() == 1
    [trial] = s.trials
    assert trial.user_attrs[names.FAIL_REASON] == (
        f"no result: {old} was last written before the trial started (left by an earlier "
        "run?)")
    (tmp_path / "b").mkdir()
    fresh = Sweep(tmp_path / "b", lambda p: Script(result={"score": 0.25}), gpus=1,
                  study={"n_trials": 1})
    assert fresh.run() == 0 and fresh.trials[0].value == 0.25  # one written now counts


# ---- the same storage however its URL is spelled (hostile pass, item 1) ----------------


@pytest.mark.parametrize("marked, given", [
    ("postgresql+psycopg://u:pw@db.example/s", "postgresql://u@db.example:5432/s"),
    ("postgresql://u:***@localhost/s", "postgresql://u:other@127.0.0.1:5432/s"),
    ("mysql+pymysql://u@DB/s?charset=utf8", "mysql://u@db:3306/s"),
    ("grpc://LocalHost:13000", "grpc://127.0.0.1:13000"),
])
def test_one_database_however_its_url_is_spelled_is_one_storage(marked, given):
    assert storageurl.storage_identity(marked) == storageurl.storage_identity(given)
    assert folders.same_owner(folders.OutputOwner("s", marked), folders.OutputOwner("s", given))


@pytest.mark.parametrize("one, other", [
    ("postgresql://u@db/s", "postgresql://u@db/t"),
    ("postgresql://u@db/s", "postgresql://u@db:5433/s"),
    ("postgresql://u@db/s", "mysql://u@db/s"),
    ("postgresql://u@db/s", "postgresql://v@db/s"),
    ("grpc://h:13000", "grpc://h:13001"),
])
def test_other_databases_stay_other_storages(one, other):
    assert storageurl.storage_identity(one) != storageurl.storage_identity(other)


def test_the_same_sqlite_file_through_a_link_or_a_double_slash_is_its_own_output_dir(
        tmp_path):
    """Hostile pass item 1: these were refused as "holds the trials of study 's'"."""
    out, real = tmp_path / "out", tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    first = load(tmp_path, "a.yaml", study={"name": "s", "output_dir": str(out),
                                              "storage": f"sqlite:///{real}/m.db"})
    folders.claim_output_dir(out, folders.owner_of(first), first.source)
    for storage in (f"sqlite:///{tmp_path}/link/m.db", f"sqlite:///{tmp_path}//real/m.db",
                    f"sqlite:///{tmp_path}/real/./m.db"):
        again = load(tmp_path, "b.yaml", study={"name": "s", "output_dir": str(out),
                                                  "storage": storage})
        folders.claim_output_dir(out, folders.owner_of(again), again.source)
        folders.check_belongs(out, folders.owner_of(again), again.source)
    # the marker keeps the URL it was written with, for the message
    assert json.loads((out / "study.json").read_text())["storage"] == f"sqlite:///{real}/m.db"
    other = load(tmp_path, "c.yaml", study={"name": "s", "output_dir": str(out),
                                              "storage": f"sqlite:///{real}/n.db"})
    with pytest.raises(UsageError, match=f"storage sqlite:///{real}/m.db"):
        folders.claim_output_dir(out, folders.owner_of(other), other.source)


def test_a_journal_file_through_a_link_is_one_storage(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path)
    assert storageurl.storage_identity(f"journal://{tmp_path}/link/j.log") == (
        storageurl.storage_identity(f"journal://{tmp_path}//j.log"))


def test_a_marker_of_this_mornings_code_still_names_its_study(tmp_path):
    """study.json as written before: {"study", "storage"} with the password hidden."""
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    (out / "study.json").write_text(json.dumps(
        {"study": "s", "storage": "postgresql+psycopg://me:***@LOCALHOST/db"}, indent=1))
    spec = load(tmp_path, study={"name": "s", "output_dir": str(out),
                                  "storage": "postgresql://me:hunter2@127.0.0.1:5432/db"})
    folders.claim_output_dir(out, folders.owner_of(spec), spec.source)
    folders.check_belongs(out, folders.owner_of(spec), spec.source)


# ---- nothing written when a folder of output_dir is a link (hostile pass, item 2) -------


@pytest.mark.parametrize("folder", ["drivers", "trials"])
def test_a_linked_drivers_or_trials_folder_is_refused_before_the_storage_is_made(
        tmp_path, folder):
    """Hostile pass item 2: with `drivers` a link, `run` exited 2 having made the .db and
    the study in it; with `trials` a link, each run burnt one FAIL trial (exit 1)."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    spec = load(tmp_path, study={"output_dir": str(out), "storage": f"sqlite:///{tmp_path}/s.db"})
    folders.claim_output_dir(out, folders.owner_of(spec), spec.source)
    (out / folder).symlink_to(victim)
    with pytest.raises(UsageError) as refused, find(spec) as found:
        execute(spec, fake_devices("1"), found)
    assert str(refused.value) == (f"{spec.source}: study.output_dir: {out}/{folder} is a "
                                  "symbolic link; use a folder of your own")
    assert not (tmp_path / "s.db").exists()
    assert list(victim.iterdir()) == []


# ---- a URL's password never lands in command.sh (hostile pass, item 5) -------------------


def test_a_password_inside_a_url_is_left_out_of_command_sh(tmp_path, monkeypatch):
    """Hostile pass item 5: `trainer.env: {DB_URL: "postgresql://u:pw_SECRET1@h/db"}` was
    written into command.sh with its password."""
    environ = {**os.environ, "OTHER_DB": "mysql://me:pw_SECRET3@db/x"}
    monkeypatch.setenv("OTHER_DB", "mysql://me:pw_SECRET3@db/x")
    spec = load(tmp_path, trainer={
        "env": {"DB_URL": "postgresql://u:pw_SECRET1@h/db", "HOME_URL": "https://h/x"},
        "args": ["--db", "postgresql://v:pw_SECRET2@h2/db", "--other=$OTHER_DB"]})
    plan = launch_plan.build_launch(spec.trainer, 0, {"x": 0.5}, 0,
                               TrialPaths.of(spec.output_dir, 0),
                               launch_plan.ACCELERATE_CONFIG_FILE,
                               places=launch_plan.spec_places(spec), environ=environ)
    folders.prepare_trial_dir(plan, {"x": 0.5},
                               command_script.arg_secrets(spec.trainer.args, environ))
    text = plan.paths.command.read_text()
    assert "pw_SECRET" not in text
    assert ("# left out (their values hold a password in a URL): DB_URL, OTHER_DB; set them "
            "in your environment to run this") in text
    assert ("# a password in a URL or a secret (a token, a webhook, a key) in the arguments "
            "is written as ***: put it back (edit this file) to run this") in text
    assert 'DB_URL="${DB_URL:?is left out of command.sh: set it}"' in text
    assert "HOME_URL=https://h/x" in text
    assert " --db 'postgresql://v:***@h2/db' " in text
    assert '--other="${OTHER_DB:?is left out of command.sh: set it}"' in text


def test_what_holds_a_urls_password():
    assert command_script.holds_password("postgresql://u:pw@h/db")
    assert command_script.holds_password("--db=redis://:pw@h:6379/0")
    assert not command_script.holds_password("postgresql://u@h/db")
    assert not command_script.holds_password("https://h:8080/x")
    assert not command_script.holds_password("user:pw@h")  # no scheme: not a URL


# ---- secrets by their form (issue 32) ------------------------------------------------------

GITHUB = "ghp_" + "a1B2c3D4e5" * 4  # the forms of real tokens; none of them is one
PAT = "github_pat_11ABCDEFG0" + "x" * 50
OAUTH = "gho_" + "Z9y8X7w6V5" * 4
SLACK = "https://hooks.slack.com/services/T0000000/B0000000/" + "Q" * 24
SENTRY = "https://0123456789abcdef0123456789abcdef@o123.ingest.sentry.io/4567"
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"


def test_values_that_are_secrets_by_their_form_stay_out_of_command_sh_and_env_json(
        tmp_path, monkeypatch):
    """Issue 32: GitHub tokens, Slack webhooks, Sentry DSNs and AWS keys passed the
    name-based masking into env.json and command.sh (`NOTIFY`, `GH`, `DSN` say nothing)."""
    from sweep.launch import provenance

    environ = {**os.environ, "UPLOAD": OAUTH}
    monkeypatch.setenv("UPLOAD", OAUTH)
    spec = load(tmp_path, trainer={
        "env": {"GH": GITHUB, "NOTIFY": SLACK, "DSN": SENTRY, "AWS_ID": AWS, "MODE": "fast"},
        "args": ["--pat", PAT, "--hook=" + SLACK.replace("Q", "R"), "--up", "$UPLOAD"]})
    plan = launch_plan.build_launch(spec.trainer, 0, {"x": 0.5}, 0,
                                    TrialPaths.of(spec.output_dir, 0),
                                    launch_plan.ACCELERATE_CONFIG_FILE,
                                    places=launch_plan.spec_places(spec), environ=environ)
    hidden = command_script.arg_secrets(spec.trainer.args, environ)
    assert hidden == {"UPLOAD": OAUTH}
    folders.prepare_trial_dir(plan, {"x": 0.5}, hidden)
    provenance.write_trial(provenance.RunRecord("h", None, None, "no probe"), plan, 0, [0],
                           hidden)
    for name in ("command.sh", "env.json"):
        text = (plan.paths.dir / name).read_text()
        for secret in (GITHUB, PAT, OAUTH, SLACK, SENTRY, AWS, "Q" * 24, "R" * 24):
            assert secret not in text, (name, secret)
        assert "MODE=fast" in text
    text = plan.paths.command.read_text()
    assert ("# left out (their values are secrets by their form: a token, a webhook, a key): "
            "AWS_ID, DSN, GH, NOTIFY, UPLOAD;") in text
    assert 'GH="${GH:?is left out of command.sh: set it}"' in text
    assert " --pat '***' '--hook=***' " in text


def test_what_is_a_secret_by_its_form():
    from sweep._core import secrets

    for value in (GITHUB, PAT, OAUTH, SLACK, SENTRY, AWS, f"--token={GITHUB}"):
        assert secrets.secret_form(value), value
    for value in ("ghp_short", "https://hooks.example.com/services/x", "AKIA-not-a-key",
                  "https://user@sentry.io/1", "https://0123456789abcdef@example.com/1",
                  "sha256:0123456789abcdef0123456789abcdef", "fast"):
        assert not secrets.secret_form(value), value
    assert secrets.starred(f"--dsn={SENTRY} --db=postgresql://u:pw@h/db") == (
        "--dsn=*** --db=postgresql://u:***@h/db")


def test_one_module_says_what_a_secret_is():
    """Two regexes of secret names (command.sh's, the storage URL's) had drifted apart."""
    from sweep._core import secrets
    from sweep.spec import storageurl

    assert command_script.secret_variable is secrets.secret_variable
    assert storageurl.shown_url("postgresql://u@h/db?auth_token=abc") == (
        "postgresql://u@h/db?auth_token=***")
    root = Path(folders.__file__).parents[1]
    owners = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
              if "pass|pwd" in p.read_text()]
    assert owners == ["_core/secrets.py"]


def test_a_dry_run_prints_no_password_nor_token(tmp_path, fake_gpus, capsys, monkeypatch):
    """Issue 32: `sweep run --dry-run` printed URL passwords (and would print tokens) in
    its command lines; it leaves them out as command.sh does, and its lines say so."""
    from conftest import run_cli

    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(study={"n_trials": 2}, trainer={
        "env": {"DB_URL": "postgresql://u:pw_SECRET1@h/db", "GH": GITHUB},
        "args": ["--db", "postgresql://v:pw_SECRET2@h2/db", "--token=$HF_TOKEN"]})))
    assert run_cli("run", str(path), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "pw_SECRET" not in out and GITHUB not in out and "hf_abcdefghijkl" not in out
    commands = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(commands) == 2
    assert all('DB_URL="${DB_URL:?' in c and "'postgresql://v:***@h2/db'" in c
               and '--token="${HF_TOKEN:?' in c for c in commands)
    assert out.count("# secrets are left out of these lines") == 1
