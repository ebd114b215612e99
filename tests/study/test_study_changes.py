"""The study file and the stored study agree, or nothing runs: exit 2, one line naming the key,
storage and output_dir untouched, no trial created (issue 9, part 2)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import load_trials, run_cli, spawn_cli, study_dict

from sweep._core import names

FLOAT_X = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
QUICK = {"args": ["--sleep", "0"]}  # the trainer of a first run whose trial only has to exist


def snapshot(tmp_path: Path) -> dict[str, tuple[int, int]]:
    """Every file under tmp_path but the study files: size and mtime."""
    return {str(p.relative_to(tmp_path)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".yaml"}


def edit(**sections: Any) -> dict[str, Any]:
    return study_dict(**sections)


def raw(text: str) -> Callable[[dict[str, Any]], str]:
    return lambda base: text


CHANGES: list[tuple[str, Any, str]] = [
    ("float to categorical",
     edit(params={"x": {"type": "categorical", "choices": [0.1, 0.2]}}), "params.x"),
    ("float to int", edit(params={"x": {"type": "int", "low": 0, "high": 1}}), "params.x"),
    ("float to log float", edit(params={"x": {"type": "float", "low": 0.1, "high": 1.0,
                                              "log": True}}), "params.x"),
    ("metric changed", edit(study={"metric": "size"}), "study.metric"),
    ("direction changed", edit(study={"direction": "maximize"}), "study.direction"),
    ("enqueue of the wrong type", edit(study={"enqueue": [{"x": "abc"}]}),
     "study.enqueue.0.x: 'abc' is not a number"),
    ("enqueue out of range", edit(study={"enqueue": [{"x": 7}]}),
     "study.enqueue.0.x: 7 is outside [0.0, 1.0]"),
    ("enqueue not a choice", edit(params={"c": {"type": "categorical", "choices": ["a"]},
                                          **FLOAT_X},
                                  study={"enqueue": [{"x": 0.5, "c": "b"}]}),
     "study.enqueue.0.c: 'b' is not one of the choices"),
    ("duplicate key", "study: {name: probe}\nstudy: {name: other}\n",
     "line 2: duplicate key 'study' (first on line 1)"),
    ("alias bomb as a fixed value", "BOMB", "expands to more than"),
    ("recursive alias", "study: {name: probe}\ntrainer: {script: t.py, args: &a [*a]}\n",
     "line 2: an alias refers to the value that contains it"),
    ("output_dir is a file", edit(study={"output_dir": "afile"}), "study.output_dir: not a folder"),
    ("output_dir under a file", edit(study={"output_dir": "afile/sub"}),
     "study.output_dir: cannot create"),
    ("env key that is a command", edit(trainer={"env": {"X;touch pwned;Y": "1"}}),
     "trainer.env.X;touch pwned;Y: not an environment variable name"),
    ("env key with =", edit(trainer={"env": {"A=B": "1"}}), "trainer.env.A=B"),
    ("NUL in args", edit(trainer={"args": ["--a\x00b"]}), "trainer.args.0: contains a NUL byte"),
    ("NUL in a choice", edit(params={"x": {"type": "categorical", "choices": ["a\x00"]}}),
     "params.x.choices.0: contains a NUL byte"),
]


def bomb() -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    body = "\n".join(f"  {line}" for line in lines)
    base = yaml.safe_dump(study_dict(params={**FLOAT_X, "big": {"type": "fixed", "value": 0}}),
                          sort_keys=False)
    return "anchors:\n" + body + "\n" + base.replace("value: 0", "value: *i")


def test_an_edited_study_file_is_refused_and_nothing_is_written(write_study, fake_gpus,
                                                                tmp_path, capsys):
    """Each of CHANGES, made to the file of one study that ran a trial: exit 2, one line
    naming the key, nothing written, the stored trial as it was. One first run carries every
    case (each assertion names its case): a refusal writes nothing, so the next case starts
    from the same files, which the snapshot checks."""
    study = write_study(study={"n_trials": 1}, trainer=QUICK)
    assert run_cli("run", str(study)) == 0
    (tmp_path / "afile").write_text("not a folder")
    before = snapshot(tmp_path)
    for case, change, key in CHANGES:
        text = bomb() if change == "BOMB" else (
            change if isinstance(change, str) else yaml.safe_dump(change, sort_keys=False))
        edited = write_study(text, name="edited.yaml")
        capsys.readouterr()
        assert run_cli("run", str(edited)) == 2, case
        err = capsys.readouterr().err
        assert key in err and err.count("\n") == 1 and len(err) < 400, (case, err)
        assert snapshot(tmp_path) == before, case
    # read once all were refused (reading the storage leaves its -wal and -shm files): no
    # case made a trial
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE"]


def test_a_wider_range_and_a_new_param_are_allowed_and_said(write_study, fake_gpus, capsys):
    study = write_study(study={"n_trials": 1})
    assert run_cli("run", str(study)) == 0
    refined = write_study(edit(study={"n_trials": 2},
                               params={"x": {"type": "float", "low": 0.0, "high": 2.0},
                                       "y": {"type": "float", "low": 0.0, "high": 0.1}}))
    capsys.readouterr()
    assert run_cli("run", str(refined)) == 0
    err = capsys.readouterr().err
    assert "params.x: range changed from [0.0, 1.0] to [0.0, 2.0]" in err
    assert "params.y: new in this run" in err
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE", "COMPLETE"]


def test_a_password_in_the_query_string_is_never_printed(write_study, fake_gpus, capsys):
    study = write_study(study={
        "storage": "postgresql://sweep@127.0.0.1:1/db?password=hunter2&sslmode=disable"})
    assert run_cli("run", str(study)) == 2
    err = capsys.readouterr().err
    assert "study.storage" in err and "hunter2" not in err and "password=***" in err


def test_no_simulated_gpu_says_so(write_study, fake_gpus, capsys):
    fake_gpus(0)
    assert run_cli("run", str(write_study())) == 2
    err = capsys.readouterr().err
    assert "SWEEP_FAKE_GPUS=0 simulates no device" in err and "CUDA_VISIBLE" not in err


def test_status_and_summary_of_trials_running_without_a_gpu_yet(write_study, fake_gpus,
                                                                 capsys):
    study = write_study()
    storage = f"sqlite:///{study.parent / 'probe.db'}"
    optuna.create_study(study_name="probe", storage=storage).ask()  # no owner, no gpu
    assert run_cli("status", str(study)) == 0
    assert "RUNNING" in capsys.readouterr().out
    assert run_cli("summary", str(study)) == 0


def test_an_unreachable_database_is_exit_2_in_every_verb(write_study, capsys):
    study = write_study(study={"storage": "postgresql://u:pw@127.0.0.1:1/db"})
    os.environ["SWEEP_FAKE_GPUS"] = "1"
    try:
        for verb in ("run", "status", "summary"):
            assert run_cli(verb, str(study)) == 2, verb
            err = capsys.readouterr().err
            assert "study.storage: cannot" in err and ":pw@" not in err, err
    finally:
        del os.environ["SWEEP_FAKE_GPUS"]


@pytest.mark.parametrize(("case", "content", "key"), [
    ("a NUL byte", b"study: {name: ab}\x00\n", "YAML error: unacceptable character"),
    ("not UTF-8", b"\xff\xfestudy: {}\n", "not UTF-8 text"),
    ("a port that is no number",
     yaml.safe_dump(edit(study={"storage": "postgresql://u:pw@h:x/db"})).encode(),
     "study.storage: not a database URL"),
    ("choices equal to Optuna",
     yaml.safe_dump(edit(params={"mp": {"type": "categorical", "choices": [True, 1]}})).encode(),
     "choices True and 1 are the same to Optuna"),
    ("a param named on",  # else a whole study file: every mistake of a file is one line
     yaml.safe_dump(edit(params={True: {"type": "float", "low": 0, "high": 1}})).encode(),
     "params.True: a param name must be text"),
    ("a metric no pattern captures",
     yaml.safe_dump(edit(trainer={"result": {"stdout": "acc (?P<acc>[0-9.]+)"}})).encode(),
     "trainer.result.stdout: no named group for the metric 'score'"),
])
def test_unreadable_or_ambiguous_study_files_are_exit_2(write_study, fake_gpus, tmp_path,
                                                         capsys, case, content, key):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    assert run_cli("run", str(path)) == 2
    err = capsys.readouterr().err
    assert key in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "locks"] or sorted(
        p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_study_file_that_is_a_fifo_or_an_output_dir_that_cannot_be_made(write_study,
                                                                           fake_gpus, tmp_path,
                                                                           capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert run_cli("run", str(fifo)) == 2
    assert "not a regular file" in capsys.readouterr().err
    study = write_study(study={"output_dir": "/proc/sweep-cannot"})
    assert run_cli("run", str(study)) == 2
    assert "study.output_dir: cannot create /proc/sweep-cannot" in capsys.readouterr().err
    assert not (tmp_path / "probe.db").exists()  # the study was not created


def test_a_changed_step_is_said_as_such():
    """Removing a float's step used to read "range changed from [0.0, 0.5] to [0.0, 0.5]"."""
    from optuna.distributions import FloatDistribution, IntDistribution

    from sweep.study import opening

    assert opening._range(FloatDistribution(0.0, 0.5, step=0.1)) == "[0.0, 0.5] step 0.1"
    assert opening._range(FloatDistribution(0.0, 0.5)) == "[0.0, 0.5]"
    assert opening._range(IntDistribution(1, 9)) == "[1, 9]"
    assert opening._range(IntDistribution(1, 9, step=2)) == "[1, 9] step 2"


XK = {"x": {"type": "float", "low": 0.1, "high": 1.0}, "k": {"type": "int", "low": 1, "high": 8}}
STORED_CHANGES: list[tuple[str, dict[str, Any], str]] = [
    ("direction changed", edit(study={"direction": "maximize"}, params=XK), "study.direction"),
    ("metric changed", edit(study={"metric": "size"}, params=XK), "study.metric"),
    ("float to int", edit(params={**XK, "x": {"type": "int", "low": 0, "high": 1}}),
     "params.x"),
    ("float to categorical",
     edit(params={**XK, "x": {"type": "categorical", "choices": [0.1, 0.2]}}), "params.x"),
    ("int log changed", edit(params={**XK, "k": {"type": "int", "low": 1, "high": 8,
                                                 "log": True}}), "params.k"),
]


def test_a_dry_run_refuses_what_run_refuses(write_study, fake_gpus, tmp_path, capsys):
    """Hostile pass: `run --dry-run` printed commands (exit 0) for a file the stored study
    refuses. It reads the stored study and refuses it as `run` does: exit 2, one line naming
    the key, nothing written. One first run carries each of STORED_CHANGES with the budget
    left and spent (each assertion names its case): a refusal writes nothing, so the next
    case starts from the same files, which the snapshot checks."""
    study = write_study(edit(study={"n_trials": 1}, params=XK, trainer=QUICK))
    assert run_cli("run", str(study)) == 0
    before = snapshot(tmp_path)
    for case, change, key in STORED_CHANGES:
        for spent in (False, True):
            said = (case, "budget spent" if spent else "budget left")
            edited = write_study(
                {**change, "study": {**change["study"], "n_trials": 1 if spent else 4}},
                name="edited.yaml")
            capsys.readouterr()
            assert run_cli("run", str(edited), "--dry-run") == 2, said
            captured = capsys.readouterr()
            assert captured.out == "" and key in captured.err and \
                captured.err.count("\n") == 1, (said, captured)
            assert run_cli("run", str(edited)) == 2, said
            assert capsys.readouterr().err == captured.err, said  # the same refusal, word for word
            assert snapshot(tmp_path) == before, said
    # read once all were refused (reading the storage leaves its -wal and -shm files): no
    # case made a trial
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE"]


def test_every_stored_study_mismatch_is_said_at_once(write_study, fake_gpus, tmp_path, capsys):
    """Hostile pass: a file with its direction, metric, x's type and y's log scale all changed
    was told only `study.direction`. Every mismatch is one line, all at once, exit 2, in
    `run` and `run --dry-run`, nothing written."""
    xy = {"x": {"type": "float", "low": 0.0, "high": 1.0},
          "y": {"type": "float", "low": 0.1, "high": 1.0}}
    study = write_study(edit(study={"n_trials": 1}, params=xy, trainer=QUICK))
    assert run_cli("run", str(study)) == 0
    before = snapshot(tmp_path)
    edited = write_study(edit(study={"direction": "maximize", "metric": "size"},
                              params={"x": {"type": "int", "low": 0, "high": 1},
                                      "y": {"type": "float", "low": 0.1, "high": 1.0,
                                            "log": True}}), name="edited.yaml")
    capsys.readouterr()
    for dry in ([], ["--dry-run"]):
        assert run_cli("run", str(edited), *dry) == 2
        lines = [line.removeprefix(f"sweep: error: {edited}: ")
                 for line in capsys.readouterr().err.splitlines()]
        assert [line.split(": ")[0] for line in lines] == [
            "study.direction", "study.metric", "params.x", "params.y"], lines
        assert "the file says int" in lines[2] and "the file says float (log)" in lines[3]
    assert snapshot(tmp_path) == before
    assert [t.state.name for t in load_trials(study)] == ["COMPLETE"]


def test_an_output_dir_changed_in_the_file_but_not_moved_is_refused_and_a_moved_one_runs(
        write_study, fake_gpus, tmp_path, capsys):
    """Changed by hand, a study's lineages would start over without their checkpoints (they
    stay in the old folder): refused in one line, nothing written. Moved there, it runs."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    from sweep.spec import config
    from sweep.study.attrs import Owner, OwnerRecord
    from sweep.study.ownership import host_name
    from sweep.trial import folders

    old, new, url = tmp_path / "old", tmp_path / "new", f"sqlite:///{tmp_path}/s.db"
    first = config.load(write_study(study={"output_dir": str(old), "storage": url,
                                           "n_trials": 1}, trainer=QUICK))
    folders.claim_output_dir(old, folders.owner_of(first), first.source)
    study = optuna.create_study(study_name="probe", storage=url)
    record = OwnerRecord(Owner(host_name(), 1, 0.0), 0, str(old / "trials" / "0"))
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
        user_attrs={names.OWNER: record.to_attr(), names.FAIL_REASON: "interrupted"}))
    path = write_study(study={"output_dir": str(new), "storage": url, "n_trials": 1},
                       trainer=QUICK)
    capsys.readouterr()
    assert run_cli("run", str(path)) == 2
    err = capsys.readouterr().err
    assert err == (f"sweep: error: {path}: study.output_dir: {new} is not where this study's "
                   f"trials ran ({old}, which still holds their folders and checkpoints): set it "
                   f"back, or move {old} to {new}, then run again\n")
    assert len(study.get_trials()) == 1
    os.rename(old, new)
    assert run_cli("run", str(path)) == 0
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "COMPLETE"]


def test_a_narrowed_range_is_said_once_in_sweeps_words_and_optunas_warning_never(
        write_study, fake_gpus, tmp_path):
    """Stored trials sampled from [0, 1], the file now [0.2, 0.6], a rerun of one outside it
    queued: Optuna's suggest warns of the queued value (`UserWarning: Fixed parameter x with
    value 0.95 is out of range ...`); sweep says it once, as the run starts."""
    from optuna.distributions import FloatDistribution

    study = write_study(study={"n_trials": 5}, trainer=QUICK,
                        params={"x": {"type": "float", "low": 0.2, "high": 0.6}})
    stored = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path}/probe.db")
    for x in (0.1, 0.3, 0.9):
        stored.add_trial(optuna.trial.create_trial(
            params={"x": x}, distributions={"x": FloatDistribution(0.0, 1.0)}, value=x))
    stored.enqueue_trial({"x": 0.95}, user_attrs={names.RERUN_OF: 2})
    driver = spawn_cli("run", str(study))
    _, err = driver.communicate()
    assert driver.returncode == 0, err
    assert "Warning" not in err and "optuna" not in err, err
    said = [line for line in err.splitlines() if line.startswith("params.x")]
    assert said == [
        "params.x: range changed from [0.0, 1.0] to [0.2, 0.6]; the earlier trials outside it "
        "(2) are kept, and the sampler is given them as they are, but new values are sampled "
        "only inside it (a queued continuation or rerun keeps its own)"]
    trials = load_trials(study)
    assert [(t.state.name, t.params["x"]) for t in trials[:4]] == [
        ("COMPLETE", 0.1), ("COMPLETE", 0.3), ("COMPLETE", 0.9), ("COMPLETE", 0.95)]
    assert all(0.2 <= t.params["x"] <= 0.6 for t in trials[4:]) and len(trials) == 5


def test_a_value_is_inside_a_range_within_its_ends_and_on_its_step():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from sweep.study import opening

    assert [opening._holds(FloatDistribution(0.2, 0.6), v) for v in (0.1, 0.2, 0.6, 0.61)] == [
        False, True, True, False]
    assert [opening._holds(FloatDistribution(0.0, 1.0, step=0.25), v)
            for v in (0.5, 0.3, 0.75)] == [True, False, True]
    assert [opening._holds(IntDistribution(2, 8, step=2), v) for v in (4, 5, 10)] == [
        True, False, False]
    assert opening._holds(CategoricalDistribution(["a"]), "b")  # its choices cannot change


def test_a_narrowed_range_is_not_said_again_once_a_trial_ran_in_it(write_study, tmp_path):
    """Item 7 (review): the note compared the file with the first trial's range, so every
    later run said the same change again; it compares with the latest trial's now."""
    from optuna.distributions import FloatDistribution

    from sweep.spec import config
    from sweep.study import opening

    study = write_study(params={"x": {"type": "float", "low": 0.2, "high": 0.6}})
    stored = optuna.create_study(study_name="probe", storage=f"sqlite:///{tmp_path}/probe.db")
    for x in (0.1, 0.9):
        stored.add_trial(optuna.trial.create_trial(
            params={"x": x}, distributions={"x": FloatDistribution(0.0, 1.0)}, value=x))
    spec = config.load(study, runnable=False)
    assert opening.check_params(spec, stored) == [
        "params.x: range changed from [0.0, 1.0] to [0.2, 0.6]; the earlier trials outside it "
        "(2) are kept, and the sampler is given them as they are, but new values are sampled "
        "only inside it (a queued continuation or rerun keeps its own)"]
    stored.add_trial(optuna.trial.create_trial(  # the run that said it
        params={"x": 0.3}, distributions={"x": FloatDistribution(0.2, 0.6)}, value=0.3))
    assert opening.check_params(spec, stored) == []
