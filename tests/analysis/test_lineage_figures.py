"""The report's panels of a scheduler's study (issue 31): the lineage tree, pauses and
promotions on the timeline, the device-hours saved, and the fidelity of each rung, on stored
studies (`sweep.testing.studies`: asha and pbt, one step 6 s)."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest
import yaml
from conftest import silent_panels, study_dict
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from sweep._core import names
from sweep.analysis import figures, lineage_figures, report, summary
from sweep.spec import config
from sweep.testing.studies import stored_study


@pytest.fixture(scope="module")
def asha(tmp_path_factory):
    return report.load(stored_study(tmp_path_factory.mktemp("asha"), "asha"))


@pytest.fixture(scope="module")
def pbt(tmp_path_factory):
    return report.load(stored_study(tmp_path_factory.mktemp("pbt"), "pbt"))


def test_the_tree_says_who_was_copied_from_whom_at_which_step(pbt):
    s, study = pbt
    tree = lineage_figures.tree(s, study)
    assert list(tree["origin"]) == [0, 1, 2, 3, 4, 5]
    assert tree["donor"].tolist() == [pd.NA] * 4 + [1, 1]
    assert tree["copied_at"].tolist() == [pd.NA] * 4 + [5, 10]
    assert tree["first_step"].tolist() == [0, 0, 0, 0, 6, 11]
    assert tree["last_step"].tolist() == [19, 19, 5, 10, 19, 19]
    assert list(tree["state"]) == ["COMPLETE", "COMPLETE", "PRUNED", "PRUNED", "COMPLETE",
                                   "COMPLETE"]
    donor = study.trials[1].params
    assert tree["params"][4] == (f"lr={donor['lr'] * 0.8:.4g}, layers={donor['layers']}, "
                                 f"optimizer={donor['optimizer']}")
    assert tree["value"].notna().tolist() == [True, True, False, False, True, True]


def test_the_tree_counts_attempts_and_pauses_of_each_lineage(asha):
    s, study = asha
    tree = lineage_figures.tree(s, study)
    top = study.trials[9].user_attrs[names.RETRY_OF]  # the best: promoted twice, then completed
    row = tree[tree["origin"] == top].iloc[0]
    assert (row["attempts"], row["pauses"], row["last_step"], row["state"]) == (
        3, 2, 17, "COMPLETE")
    assert sorted(tree["attempts"]) == [1] * 6 + [2, 2, 3]
    assert tree["donor"].isna().all()


def test_pauses_promotions_and_exploits_are_marked_where_they_happened(asha, pbt):
    marks = lineage_figures.timeline_marks(asha[0])
    assert marks["kind"].value_counts().to_dict() == {"paused": 12, "promoted": 4}
    promoted = marks[marks["kind"] == "promoted"]
    trials = asha[1].trials
    for r in promoted.itertuples():  # at the promoted attempt's start, on its device
        t = trials[r.number]
        assert (r.time, r.gpu) == (t.datetime_start, t.user_attrs[names.GPU])
        assert r.text == f"trial {r.number} continues paused trial {t.user_attrs[names.CONTINUES]}"
    paused = marks[marks["kind"] == "paused"]
    assert sorted(paused["step"].astype(int)) == [2] * 9 + [6] * 3
    assert all(r.time == trials[r.number].datetime_complete for r in paused.itertuples())
    marks = lineage_figures.timeline_marks(pbt[0])
    assert list(marks["text"]) == ["trial 4 copied from trial 1", "trial 5 copied from trial 1"]


def test_the_device_hours_saved_are_against_every_configuration_to_max_steps(asha, pbt):
    # asha: 9 configurations x 3 steps, 3 x 4 more, the best 11 more: 50 steps of 6 s
    assert figures.savings(*asha) == pytest.approx({
        "device_hours": 50 * 6 / 3600, "steps": 50, "pauses": 12, "stops": 12,
        "configurations": 9,
        "max_steps": 18,
        "full_device_hours": 9 * 18 * 6 / 3600, "saved_device_hours": (162 - 50) * 6 / 3600})
    # pbt: 20 + 20 + 6 + 11, and the exploits 14 + 9
    assert figures.savings(*pbt) == pytest.approx({
        "device_hours": 80 * 6 / 3600, "steps": 80, "pauses": 0, "stops": 2,
        "configurations": 6,
        "max_steps": 20,
        "full_device_hours": 6 * 20 * 6 / 3600, "saved_device_hours": 40 * 6 / 3600})


def pbt_study(tmp_path, population: int) -> tuple[config.Spec, optuna.Study]:
    """A pbt study file (interval 5, max_steps 20) and an empty study to add trials to."""
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_dict(study={
        "n_trials": population + 2, "scheduler": {"type": "pbt", "population": population,
                                                  "interval": 5, "max_steps": 20}}),
        sort_keys=False))
    return config.load(path, runnable=False), optuna.create_study()


def test_fidelity_is_the_rank_correlation_of_each_rung_with_the_final_values(tmp_path):
    spec, study = pbt_study(tmp_path, population=4)
    # at step 5 they rank 1 2 3 4, at step 10 as they end; they end ranked 1 3 2 4
    for at5, final in ((1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 4.0)):
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=final, params={"x": 0.5},
            distributions={"x": FloatDistribution(0.0, 1.0)},
            intermediate_values={5: at5, 10: final, 19: final},
            user_attrs={names.GPU: 0}))
    study.add_trial(optuna.trial.create_trial(  # paused: not a lineage that finished
        state=TrialState.PRUNED, value=9.0, params={"x": 0.5},
        distributions={"x": FloatDistribution(0.0, 1.0)}, intermediate_values={5: 0.1}))
    s = summary.Summary(spec, summary.trials_frame(study, spec), pd.DataFrame(), pd.DataFrame())
    got = lineage_figures.fidelity(s, study)
    assert got["step"].tolist() == [5, 10, 15]
    assert got["lineages"].tolist() == [4, 4, 4]
    assert got["rho"].tolist() == pytest.approx([1 - 6 * 2 / (4 * 15), 1.0, 1.0])


def test_fidelity_under_three_lineages_is_not_a_number(asha):
    got = lineage_figures.fidelity(*asha)
    assert got["step"].tolist() == [2, 6] and got["lineages"].tolist() == [1, 1]
    assert got["rho"].isna().all()



def test_no_lineage_panel_is_empty_without_a_sentence_saying_why(asha, pbt):
    from sweep.analysis import figures

    for s, study in (asha, pbt):
        tree = lineage_figures.tree(s, study)
        assert silent_panels(lineage_figures.tree_figure(tree)) == []
        marked = lineage_figures.mark_timeline(figures.timeline(s), s)
        assert silent_panels(marked) == []
        assert {t.name for t in marked.data} >= ({"paused", "promoted"} if s is asha[0]
                                                 else {"exploited"})
    nothing = lineage_figures.tree(*asha).iloc[:0]
    assert silent_panels(lineage_figures.tree_figure(nothing)) == []


def test_the_flagged_resumes_and_explores_are_listed(tmp_path):
    spec, study = pbt_study(tmp_path, population=2)
    for attrs in ({}, {names.RETRY_OF: 0, names.ATTEMPT: 1, names.CONTINUES: 0, names.RESUMED_AT: 0,
                       names.STEPS_REPEATED: 6},
                  {names.EXPLOIT_OF: 0, names.EXPLOIT_STEP: 5, names.REPLACES: 2,
                   names.RESTORED_PARAMS: {"x": 0.5}}):
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=1.0, params={"x": 0.5},
            distributions={"x": FloatDistribution(0.0, 1.0)}, user_attrs=attrs))
    s = summary.Summary(spec, summary.trials_frame(study, spec), pd.DataFrame(), pd.DataFrame())
    got = lineage_figures.flagged(s)
    assert got.to_dict("records") == [
        {"number": 1, "lineage": 0, "why": "did not resume: reported step 0 first, 6 steps "
                                           "repeated"},
        {"number": 2, "lineage": 2, "why": "ran with its donor's params restored from the "
                                           "checkpoint, not the perturbed ones: logged x=0.5"}]
    html = report.render(s, study)
    assert '<table id="flagged">' in html and "6 steps repeated" in html
    clean = summary.Summary(spec, s.trials[s.trials["number"] == 0], pd.DataFrame(),
                            pd.DataFrame())
    assert lineage_figures.flagged(clean).empty
