"""Judging a finished trial process (pure)."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from sweep._core import names
from sweep.trial.outcome import judge, judge_files, split_launcher_traceback

COMPLETE, FAIL, PRUNED = TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED

ACCELERATE_TAIL = """some err
ValueError: boom
Traceback (most recent call last):
  File "/venv/bin/accelerate", line 6, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", line 999, in simple_launcher
    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
subprocess.CalledProcessError: Command '['/venv/bin/python3', '/tmp/t.py', '--lr', '0.1']' returned non-zero exit status 3.
"""


# accelerate 1.16: the launcher tees the child's stderr, and raises CalledProcessError from a
# RuntimeError holding the tail of it (verbatim, from tests/e2e/test_accelerate.py's probe)
ACCELERATE_116_TAIL = """Traceback (most recent call last):
  File "/tmp/probe.py", line 9, in <module>
    raise ValueError("boom")
ValueError: boom
RuntimeError: p/probe.py", line 9, in <module>
    raise ValueError("boom")
ValueError: boom


The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", line 1049, in _run_subprocess
    raise subprocess.CalledProcessError(
subprocess.CalledProcessError: Command '['/venv/bin/python', '/tmp/probe.py']' returned non-zero exit status 3.
"""


@pytest.mark.parametrize("tail", [ACCELERATE_TAIL, ACCELERATE_116_TAIL])
def test_the_launchers_traceback_is_removed_and_the_child_exit_code_recovered(tail):
    stderr, code = split_launcher_traceback(tail)
    assert code == 3
    assert stderr.splitlines()[-1] == "ValueError: boom"
    assert "RuntimeError" not in stderr and "direct cause" not in stderr
    assert judge(1, tail, None, ["m"]).fail_reason == "exit code 3: ValueError: boom"
    assert split_launcher_traceback("plain error\n") == ("plain error\n", None)


def test_a_trainers_own_chained_runtime_error_before_the_launchers_is_kept():
    """Only a RuntimeError that repeats the end of what precedes it is accelerate's copy: a
    trainer's own "direct cause" chain (not a copy) is the trainer's stderr."""
    own = ("RuntimeError: data loader died\n\n"
           "The above exception was the direct cause of the following exception:\n")
    tail = ACCELERATE_TAIL.replace("ValueError: boom\nTraceback", own + "Traceback")
    stderr, code = split_launcher_traceback(tail)
    assert code == 3 and stderr.rstrip().endswith("following exception:")
    # a child that wrote no stderr: accelerate's copy is empty too
    bare = "RuntimeError: \n\n\n" + ACCELERATE_116_TAIL.split("\n\n\n", 1)[1]
    assert split_launcher_traceback(bare) == ("", 3)


@pytest.mark.parametrize(("end", "code"), [
    ("died with <Signals.SIGKILL: 9>.", 137), ("died with <Signals.SIGSEGV: 11>.", 139),
    ("died with unknown signal 77.", 205),
])
def test_a_trainer_killed_by_a_signal_under_accelerate_gets_the_code_other_launchers_give(
        end, code):
    """CalledProcessError words a signal death its own way; the code is 128 + N, as the
    python launcher's guard reports it, and the launcher's traceback is not the reason."""
    tail = ACCELERATE_TAIL.replace("returned non-zero exit status 3.", end)
    stderr, got = split_launcher_traceback(tail)
    assert got == code and stderr.splitlines()[-1] == "ValueError: boom"
    verdict = judge(1, tail, None, ["m"])
    assert verdict.exit_code == code and verdict.fail_reason == f"exit code {code}: ValueError: boom"


@pytest.mark.parametrize((names.EXIT_CODE, "stderr", "result", "stopped", "state", "reason"), [
    (0, "", '{"m": 1.5}', None, COMPLETE, None),
    (1, ACCELERATE_TAIL, '{"m": 1}', None, FAIL, "exit code 3: ValueError: boom"),
    (2, "", None, None, FAIL, "exit code 2: no stderr"),
    (1, "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB\nmore\n", None, None,
     FAIL, "out of memory: RuntimeError: CUDA out of memory."),
    (0, "", None, None, FAIL, "no result: the trainer exited 0"),
    (0, "", "{", None, FAIL, "result file is not valid JSON"),
    (0, "", '{"m": NaN}', None, FAIL, "metric 'm' is not a finite number"),
    (143, "", None, "timeout", FAIL, "timeout after 60 s"),
    (0, "", '{"m": 1.5}', "timeout", FAIL, "timeout after 60 s"),
    (143, "", None, "interrupted", FAIL, "interrupted"),
    # issue 8, defect 3: a clean exit with a valid result is COMPLETE whatever stderr says
    (0, "CUDA out of memory. Tried to allocate 2 GiB; retrying with batch 16\n", '{"m": 1.5}',
     None, COMPLETE, None),
])
def test_judge(exit_code, stderr, result, stopped, state, reason):
    out = judge(exit_code, stderr, result, ["m"], stopped, timeout=60)
    assert out.state is state
    if reason is None:
        assert out.fail_reason is None and out.values == [1.5]
    else:
        assert out.fail_reason.startswith(reason)


def test_oom_is_flagged_for_the_retry_policy():
    assert judge(1, "torch.OutOfMemoryError: x", None, ["m"]).oom
    assert not judge(1, "ValueError", None, ["m"]).oom


def test_long_lines_are_cut():
    out = judge(1, "E" * 1000, None, ["m"])
    assert len(out.fail_reason) < 250


def test_a_pruned_trial_is_pruned_with_its_last_report_whatever_its_exit():
    for code in (0, 143, 137):
        out = judge(code, "Traceback ...\nKeyboardInterrupt", None, ["m"], "pruned",
                    last_report=(3, 0.25))
        assert (out.state, out.values, out.fail_reason) == (PRUNED, [0.25], None)
    assert not judge(0, "CUDA out of memory", '{"m": 1}', ["m"]).oom


# ---- a trial with no result: where sweep looked, and how to give one (issue 21, part 5) -----

def trial_files(tmp_path, stdout: str):
    (tmp_path / "stdout.log").write_text(stdout)
    (tmp_path / "stderr.log").write_text("")
    return tmp_path / "stderr.log", tmp_path / "stdout.log", tmp_path / "result.json"


def test_no_result_file_says_where_sweep_looked_and_the_two_ways_to_give_one(tmp_path):
    stderr, stdout, result = trial_files(tmp_path, "epoch 3: loss 0.25\n\n")
    out = judge_files(stderr, result, 0, ["loss"], stdout=stdout, env_result=result)
    assert (out.state, out.exit_code) == (FAIL, 0)
    assert out.fail_reason == (
        f"no result: nothing at {result}; last line of stdout: epoch 3: loss 0.25; write one "
        "with sweep.protocol.write_result (to $SWEEP_RESULT_FILE) or set trainer.result (a "
        "file or stdout patterns)")


def test_the_result_is_what_the_trainer_left_when_it_ended_not_what_came_after(tmp_path):
    """`at_end`: the result file as the trainer's guard saw it end (under `accelerate launch`,
    the script's end, a second or so before the launcher's): a leftover's later write to it,
    or its first write, does not count."""
    stderr, stdout, result = trial_files(tmp_path, "done\n")
    result.write_text('{"loss": 1.0}')  # a leftover overwrote the trainer's 2.0
    out = judge_files(stderr, result, 0, ["loss"], stdout=stdout, env_result=result,
                      at_end=('{"loss": 2.0}',))
    assert (out.state, out.values) == (COMPLETE, [2.0])
    out = judge_files(stderr, result, 0, ["loss"], stdout=stdout, env_result=result,
                      at_end=(None,))  # there was none when the trainer ended
    assert (out.state, out.fail_reason) == (FAIL, (
        f"no result: nothing at {result} when the trainer ended (it was written later, by a "
        "process the trainer left running?); last line of stdout: done"))


def test_no_result_in_the_file_trainer_result_names_says_so(tmp_path):
    stderr, stdout, result = trial_files(tmp_path, "")
    named = tmp_path / "out.json"
    out = judge_files(stderr, named, 0, ["loss"], stdout=stdout, env_result=result)
    assert out.fail_reason == f"no result: nothing at {named} (trainer.result.file); stdout is empty"


def test_no_line_matching_the_patterns_quotes_them_and_the_last_line(tmp_path):
    stderr, stdout, result = trial_files(tmp_path, "epoch 3: loss 0.25\n")
    out = judge_files(stderr, result, 0, ["loss"], stdout=stdout,
                      patterns=[r"loss=(?P<loss>\S+)"], env_result=result)
    assert out.fail_reason == (f"no result: no line of {stdout} matched 'loss=(?P<loss>\\S+)'; "
                               "last line of stdout: epoch 3: loss 0.25")


def test_patterns_out_of_time_fail_the_trial_saying_so(tmp_path, monkeypatch):
    from sweep._core import patterns
    from sweep.trial import outcome

    def ticking(*args, **kw):
        calls = iter(range(1000))
        return patterns.parse_stdout(*args, **kw, clock=lambda: float(next(calls)))

    monkeypatch.setattr(outcome, "parse_stdout", ticking)
    stderr, stdout, result = trial_files(tmp_path, ("x" * 1000 + "\n") * 200)
    out = judge_files(stderr, result, 0, ["loss"], stdout=stdout,
                      patterns=[r"loss=(?P<loss>\S+)"])
    assert (out.state, out.exit_code) == (FAIL, 0)
    assert out.fail_reason == (
        "stdout patterns ran out of time (1 s) after the last 34 of 200 lines, before "
        "'loss' matched: print it nearer the end, or simplify the pattern")
    crashed = judge_files(stderr, result, 3, ["loss"], stdout=stdout,
                          patterns=[r"loss=(?P<loss>\S+)"])
    assert crashed.fail_reason == "exit code 3: no stderr"  # a crash explains itself first


def test_a_result_file_too_large_to_read_says_so_with_the_bound(tmp_path):
    """Issue 32: a 300 MB result file was said to be "not valid JSON" (sweep reads 1 MiB of
    it); it is said to be too large, with the bound."""
    result = tmp_path / "result.json"
    result.write_text('{"score": 1.0, "padding": "')
    with result.open("r+b") as f:
        f.truncate(300 << 20)  # sparse: 300 MB that take no disk
    got = judge_files(tmp_path / "stderr.log", result, 0, ["score"])
    assert got.state == TrialState.FAIL
    assert got.fail_reason == (f"result file {result} is larger than 1048576 bytes, all "
                               "sweep reads: write only the metrics to it")
    from sweep.trial import outcome

    at_limit = tmp_path / "ok.json"
    at_limit.write_text('{"score": 1.0, "pad": "' + "x" * (outcome.MAX_RESULT - 25) + '"}')
    assert at_limit.stat().st_size == outcome.MAX_RESULT
    assert judge_files(tmp_path / "stderr.log", at_limit, 0, ["score"]).state == (
        TrialState.COMPLETE)
