"""benchmarks/schedulers.py replays LCDB's measured curves through the real driver (issue 40).

The fixture, data/lcdb_11_61_446.csv.gz, is LCDB 1.0's accuracy curves (`lcdb` 0.1.0 on PyPI,
its database-accuracy.csv) of OpenML datasets 11, 61 and 446 (10, 6 and 8 anchors, all 20
learners), each anchor's traintime and validation accuracy averaged over LCDB's seeds: 480
rows, 5 KB, written by `curves.read_lcdb` with the columns it reads. The benchmark itself is not
part of the suite; this keeps its replay working without LCDB installed (about 3 CPU-s).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "lcdb_11_61_446.csv.gz"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import curves
        import schedulers
        yield curves, schedulers
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_lcdb_curves_read_from_the_fixture(bench):
    curves, _ = bench
    table = curves.read_lcdb(FIXTURE)
    assert sorted(table, key=int) == ["11", "61", "446"]
    inst = curves.lcdb(table, "61", seed=0, exit_seconds=1.0)
    assert inst.steps == [16, 23, 32, 45, 64, 121]
    assert len(inst.configs) == 20
    assert sorted(c["learner"] for c in inst.configs) == sorted(table["61"])
    # every learner trained to the end costs, on average, 27 synthetic steps (+ its exit)
    assert inst.full_cost == pytest.approx(20 * (27 * curves.STEP_SECONDS + 1.0))
    assert inst.optimum == min(rows[-1][2] for rows in table["61"].values())


def test_three_lcdb_datasets_replay_through_the_driver(bench, tmp_path, capsys):
    _, schedulers = bench
    out = tmp_path / "regrets.json"
    assert schedulers.main([
        "--curves", "lcdb", "--lcdb-csv", str(FIXTURE), "--datasets", "11,61,446",
        "--seeds", "1", "--jobs", "1", "--json", str(out),
        "--methods", "optuna successive_halving"]) == 0
    records = json.loads(out.read_text())
    assert {tuple(sorted(r)) for r in records} == {
        ("budget_fraction", "curves", "dataset", "method", "regret", "seed")}
    assert sorted((r["dataset"], r["method"]) for r in records) == [
        (d, "optuna successive_halving") for d in ("11", "446", "61") for _ in range(8)]
    for d in ("11", "61", "446"):
        mine = [r for r in records if r["dataset"] == d]
        fractions = [r["budget_fraction"] for r in mine]
        assert fractions == sorted(fractions)
        assert fractions[0] == pytest.approx(1 / 20) and fractions[-1] == 1.0
        regrets = [r["regret"] for r in mine]
        assert all(a >= b for a, b in itertools.pairwise(regrets))  # anytime: never worse
        assert regrets[-1] >= 0.0
    printed = capsys.readouterr().out
    assert "Mean regret [95 % bootstrap interval], lcdb" in printed
    assert "| optuna successive_halving | " in printed


def test_with_no_pruning_the_best_learner_is_known_at_the_full_cost(bench):
    curves, schedulers = bench
    schedulers._TABLE = curves.read_lcdb(FIXTURE, {"61"})
    records = schedulers.run_one(("lcdb", "61", 0, "no pruning", 4))
    assert [r["budget_fraction"] for r in records][-1] == 1.0
    assert records[-1]["regret"] == 0.0  # every learner trained to the end
    assert records[0]["_cost"]["spent"] == pytest.approx(1.0)


def test_sweep_asha_replays_lcdb_pausing_and_spending_less(bench):
    curves, schedulers = bench
    schedulers._TABLE = curves.read_lcdb(FIXTURE, {"61"})
    records = schedulers.run_one(("lcdb", "61", 0, "sweep asha", 4))
    regrets = [r["regret"] for r in records]
    assert len(regrets) == 8 and all(a >= b for a, b in itertools.pairwise(regrets))
    assert regrets[-1] >= 0.0
    assert 0.0 < records[0]["_cost"]["spent"] < 1.0  # it paused or stopped learners
