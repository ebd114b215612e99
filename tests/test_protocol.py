"""The trial contract's files: result (atomic JSON), reports (JSON lines), stop requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sweep import protocol
from sweep._core import patterns
from sweep.trial import _results
from sweep.trial._results import ResultError, parse_result


def test_write_result_is_atomic_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "result.json"
    protocol.write_result({"val_loss": 0.5, "acc": 1}, target)
    protocol.write_result({"val_loss": 0.25}, target)
    assert json.loads(target.read_text()) == {"val_loss": 0.25}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_helpers_do_nothing_outside_a_sweep(monkeypatch, tmp_path):
    monkeypatch.delenv("SWEEP_RESULT_FILE", raising=False)
    monkeypatch.delenv("SWEEP_REPORT_FILE", raising=False)
    monkeypatch.delenv("SWEEP_PARAMS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    protocol.write_result({"a": 1})
    protocol.report(0, 1.0)
    assert protocol.params() == {}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("text", "metrics", "reason"), [
    ("{oops", ["m"], "result file is not valid JSON"),
    ("[1, 2]", ["m"], "must hold a JSON object, not list"),
    ('{"other": 1}', ["m"], "metric 'm' missing from the result file (keys: other)"),
    ('{"m": "0.3"}', ["m"], "metric 'm' is not a number: '0.3'"),
    ('{"m": true}', ["m"], "is not a number"),
    ('{"m": NaN}', ["m"], "metric 'm' is not a finite number: nan"),
    ('{"m": Infinity}', ["m"], "not a finite number: inf"),
    ('{"a": 1}', ["a", "b"], "metric 'b' missing"),
])
def test_bad_results_have_their_own_reasons(text, metrics, reason):
    with pytest.raises(ResultError) as e:
        parse_result(text, metrics)
    assert reason in str(e.value)


def test_result_values_follow_metric_order_and_numeric_extras_are_kept():
    values, extras = parse_result('{"acc": 0.9, "loss": 0.3, "n": 7, "tag": "x", "ok": true}',
                                  ["loss", "acc"])
    assert values == [0.3, 0.9]
    assert extras == {"n": 7.0}


def test_report_lines_partial_last_line_and_duplicates(tmp_path):
    path = tmp_path / "reports.jsonl"
    reader = _results.ReportReader(path)
    assert reader.read() == []
    protocol.report(0, 1.5, path)
    with open(path, "a") as f:
        f.write('{"step": 1, "value": 1.0}\n{"step": 0, "value": 9}\n{"step": 2, "va')
    assert reader.read() == [(0, 1.5), (1, 1.0)]
    with open(path, "a") as f:
        f.write('lue": 0.5}\n{"step": 2, "value": 7}\n')
    assert reader.read() == [(2, 0.5)]
    assert reader.read() == [] and reader.error is None


@pytest.mark.parametrize(("line", "reason"), [
    ("not json", "report line 2 is not JSON: not json"),
    ('{"step": 1}', 'report line 2 must be {"step": N, "value": X}'),
    ('{"step": -1, "value": 0.9}', "report line 2: step must be a whole number from 0 to"),
    ('{"step": 99999999999999999999, "value": 0.9}', "(got 99999999999999999999)"),
    ('{"step": "3", "value": 1}', "(got '3')"),
    ('{"step": 1.5, "value": 1}', "(got 1.5)"),
    ('{"step": 1, "value": ' + "9" * 400 + "}", "value must be a finite number (got 9999"),
    ('{"step": 1, "value": NaN}', "value must be a finite number (got nan)"),
    ('{"step": 1, "value": "x"}', "value must be a finite number (got 'x')"),
])
def test_a_bad_report_line_stops_reading_with_a_one_line_reason(tmp_path, line, reason):
    path = tmp_path / "reports.jsonl"
    path.write_text('{"step": 0, "value": 1}\n' + line + '\n{"step": 5, "value": 1}\n')
    reader = _results.ReportReader(path)
    assert reader.read() == [(0, 1.0)]
    assert reader.error is not None and reason in reader.error
    assert len(reader.error) < 200 and "\n" not in reader.error
    assert reader.read() == []


def test_reports_are_read_in_bounded_batches_and_never_block(tmp_path):
    path = tmp_path / "reports.jsonl"
    path.write_text("".join(f'{{"step": {i}, "value": 1}}\n' for i in range(250)))
    reader = _results.ReportReader(path, batch=100)
    assert len(reader.read()) == 100 and reader.more
    assert len(reader.read()) == 100 and reader.more
    assert len(reader.read()) == 50 and not reader.more
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    reader = _results.ReportReader(fifo)
    assert reader.read() == [] and reader.error == "the report file is not a regular file"


@pytest.mark.parametrize(("text", "reason"), [
    ('{"m": ' + "9" * 400 + "}", "metric 'm' is not a finite number: 999"),
    ('{"m": ' + "9" * 5000 + "}", "metric 'm' is not a finite number: inf"),
])
def test_huge_numbers_in_a_result_are_a_reason_not_a_crash(text, reason):
    with pytest.raises(ResultError) as e:
        parse_result(text, ["m"])
    assert str(e.value).startswith(reason) and len(str(e.value)) < 200


def test_result_keys_that_are_not_finite_numbers_are_not_kept():
    _, extras = parse_result('{"m": 1, "big": ' + "9" * 400 + ', "n": 2, "inf": Infinity}',
                             ["m"])
    assert extras == {"n": 2.0}


def test_result_keys_no_storage_takes_as_a_name_are_not_kept():
    """PostgreSQL refuses a NUL in a name, and an attribute name over 512 characters."""
    _, extras = parse_result(json.dumps(
        {"m": 1, "k" * 101: 1, "nul\u0000": 2, "tab\t": 3, "k" * 100: 4, "ünï": 5}), ["m"])
    assert extras == {"k" * 100: 4.0, "ünï": 5.0}


def test_should_stop_turns_sigterm_into_a_flag(tmp_path):
    code = (
        "import os, signal, time\n"
        "from sweep.protocol import should_stop\n"
        "assert not should_stop()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.1)\n"
        "print(should_stop())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_the_protocol_module_imports_no_heavy_dependency():
    code = ("import sys, sweep.protocol\n"
            "print(sorted(m for m in ('torch', 'optuna', 'accelerate', 'pandas') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert signal.SIGTERM and os.name


def test_a_dotted_metric_reads_a_nested_key_and_stdout_patterns_keep_the_last_match():
    values, _ = parse_result('{"eval": {"accuracy": 0.9, "loss": 0.3}, "eval.loss": 7}',
                             ["eval.accuracy", "eval.loss"])
    assert values == [0.9, 7.0]  # a flat key with the dotted name wins
    text = "epoch 1 loss: 0.9 acc: 50\nepoch 2 loss: 0.4 acc: 70\nloss: nan\n"
    assert patterns.parse_stdout(text, [r"loss: (?P<loss>\S+)", r"acc: (?P<acc>\d+)"]) == {
        "acc": 70.0}  # the last loss diverged: 0.4 is stale (issue 24)


# ---- stdout patterns: a cost bounded whatever the pattern and the output (issue 26, item 5) --

def run_parse_stdout(make_text: str, pattern: str, timeout: float = 60) -> str:
    """`parse_stdout` in a child process on the text `make_text` builds; what it returns.
    The timeout is generous: the work takes well under a second, and hours on `re`."""
    code = ("import sys\nfrom sweep._core import patterns\n"
            f"text = {make_text}\n"
            f"print(patterns.parse_stdout(text, [{pattern!r}]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout, check=True)
    return out.stdout.strip()


def test_a_nested_quantifier_on_one_short_line_does_not_hang():
    """`(d+)+` over 36 digits backtracks 2**36 ways in a backtracking engine."""
    assert run_parse_stdout("'1' * 36 + '\\n'", r"(?P<loss>([0-9]+)+)s") == "{}"
    assert run_parse_stdout("'1' * 36 + 's\\n'", r"(?P<loss>([0-9]+)+)s") == (
        "{'loss': 1.1111111111111111e+35}")


def test_a_leading_dot_star_costs_time_linear_in_the_output_not_in_its_line_length():
    """The same 4 MB searched in long lines costs no more than in short ones (a backtracking
    `.*loss=` retries from every position of a long line: 12 s on 2,000-character lines)."""
    pattern = [r".*loss=(?P<loss>[0-9.]+)"]
    long_lines = "\n".join([("lr=0.001 grad=1.25 " * 120)[:2000]] * 2000) + "\n"
    short_lines = "\n".join([("lr=0.001 grad=1.25 " * 6)[:100]] * 40_000) + "\n"
    costs = []
    for text in (short_lines, long_lines):
        start = time.thread_time()
        assert patterns.parse_stdout(text, pattern) == {}
        costs.append(time.thread_time() - start)
    assert costs[1] < 3 * costs[0], costs


def test_the_last_lines_are_searched_first_and_the_search_stops_when_every_group_is_found():
    clock = FakeClock()
    text = "loss=9 acc=1\n" + "noise " * 700_000 + "\nloss=0.5\nacc=0.75\n"
    found = patterns.parse_stdout(text, [r"loss=(?P<loss>\S+)", r"acc=(?P<acc>\S+)"],
                                  clock=clock)
    assert found == {"loss": 0.5, "acc": 0.75}
    assert clock.calls == 1  # the start: no line past the last two was searched


def test_a_flood_of_line_ends_is_no_lines_to_search():
    clock = FakeClock()
    text = "loss=0.5" + "\r" * (4 << 20)
    assert patterns.parse_stdout(text, [r"(?P<loss>[0-9.]+)"], clock=clock) == {"loss": 0.5}
    assert clock.calls == 1


class FakeClock:
    """A CPU clock that advances one second each time it is read."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls - 1)


LONG_LINE = "x" * (patterns.CHECK_WORK // 8)  # the clock is read every 8 such lines


def test_patterns_that_run_out_of_time_fail_the_trial_with_a_reason_that_says_so():
    text = "loss=0.5\n" + (LONG_LINE + "\n") * 100
    with pytest.raises(patterns.PatternTimeout) as e:
        patterns.parse_stdout(text, [r"loss=(?P<loss>\S+)"], needed=["loss"], budget=2.5,
                              clock=FakeClock())
    assert str(e.value) == (
        "stdout patterns ran out of time (2.5 s) after the last 24 of 101 lines, before 'loss' "
        "matched: print it nearer the end, or simplify the pattern")


def test_out_of_time_with_every_metric_found_keeps_the_metrics_found():
    """The values found are the last ones in the output; only a group found nowhere near the
    end (here `lr`, never printed) is left out."""
    text = (LONG_LINE + "\n") * 100 + "loss=0.5\n"
    found = patterns.parse_stdout(text, [r"loss=(?P<loss>\S+)", r"lr=(?P<lr>\S+)"],
                                  needed=["loss"], budget=2.5, clock=FakeClock())
    assert found == {"loss": 0.5}


def test_the_last_match_of_a_group_decides_whether_it_is_rejected():
    rejected: dict[str, str] = {}
    text = "loss: 0.9\nloss: nan\nacc: 97.5%\nacc: 90\n"
    found = patterns.parse_stdout(text, [r"loss: (?P<loss>\S+)", r"acc: (?P<acc>\S+)"],
                                  rejected)
    assert found == {"acc": 90.0}  # loss's last match diverged: 0.9 is not its value
    assert rejected == {"loss": "nan"}  # acc's last match is a number


@pytest.mark.parametrize(("pattern", "message"), [
    (r"(?P<a>x)\1", r"a backreference \1 is not supported (sweep matches with RE2, in time "
     r"linear in the output: no backreferences or lookaround): (?P<a>x)\1"),
    (r"(?P<a>x)(?P=a)", "a backreference (?P=name) is not supported"),
    (r"(?=a)(?P<a>x)", "lookahead (?=...) is not supported"),
    (r"(?<!a)(?P<a>x)", "lookbehind (?<!...) is not supported"),
    (r"(?>a)(?P<a>x)", "an atomic group (?>...) is not supported"),
    (r"a*+(?P<a>x)", "a possessive quantifier is not supported"),
    (r"(?P<a>x)\Z", r"\Z (write $: a pattern sees one line) is not supported"),
    (r"(?P<a>x{,3})", r"write {0,n} for up to n repeats ({,n} reads as text): (?P<a>x{,3})"),
    (r"(?P<a>(?:a|b|aa|ab|ba|bb){1,300})", "too complex to match in bounded time ("),
    (r"(?P<a>x{1001})", "RE2, which sweep matches with, cannot read it (invalid repetition "
     "size: {1001}): (?P<a>x{1001})"),
    (r"(?P<a>[0-9", "not a regular expression (unterminated character set at position 6)"),
    (r"(?P<a>[[:digit:]]+)", "Possible nested set at position 7 (RE2 and Python read it "
     "differently: escape the [ or the -/&/~/|): (?P<a>[[:digit:]]+)"),
    (r"loss: [0-9.]+", "a stdout pattern needs named groups, e.g. 'loss: (?P<loss>[0-9.]+)'"),
])
def test_a_pattern_re2_cannot_match_in_linear_time_is_refused_saying_why(pattern, message):
    with pytest.raises(patterns.PatternError) as e:
        patterns.compile_pattern(pattern)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)
    if message.startswith("too complex"):
        assert str(e.value).endswith(" RE2 instructions, at most 1000; large {m,n} repeats cost "
                                     "most): (?P<a>(?:a|b|aa|ab|ba|bb){1,300})")


def test_the_trainers_files_are_private_and_reports_never_follow_a_link(tmp_path):
    """Hostile pass item 4: reports.jsonl was 0644 (every other trial file 0600)."""
    os.umask(old := os.umask(0o022))
    try:
        protocol.report(1, 0.5, tmp_path / "reports.jsonl")
        protocol.report(2, 0.25, tmp_path / "reports.jsonl")
        protocol.write_result({"val_loss": 0.5}, tmp_path / "result.json")
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "reports.jsonl": 0o600, "result.json": 0o600}
    assert (tmp_path / "reports.jsonl").read_text() == (
        '{"step": 1, "value": 0.5}\n{"step": 2, "value": 0.25}\n')
    victim = tmp_path / "victim"
    (tmp_path / "planted.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        protocol.report(1, 0.5, tmp_path / "planted.jsonl")
    assert not victim.exists()
