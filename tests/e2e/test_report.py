"""Issue 24: `sweep report`, one offline HTML file of a study's figures, opened in a real
browser (headless Chromium, network off) for a finished, a running, a multi-objective, an
only-FAIL and a 10,000-trial study; the figures and tables it is made of."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from browser import Pages
from conftest import load_trials, run_cli, silent_panels

from sweep._core import names
from sweep.analysis import figures, report
from sweep.testing.studies import stored_study

CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    """One headless Chromium for this module's pages (`tests/browser.py`)."""
    assert CHROMIUM is not None
    pages = Pages(CHROMIUM, tmp_path_factory.mktemp("chromium"))
    yield pages
    pages.close()


def rendered(dom: str) -> dict[str, int]:
    """Per figure div of the report: how many plotly SVG roots were drawn in it."""
    found = {}
    parts = re.split(r'<div id="(fig-[a-z]+)"', dom)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        found[name] = body.split('<div id="fig-')[0].count('class="main-svg"')
    return found


FIGURES = ["fig-objective", "fig-intermediate", "fig-parallel", "fig-importances",
           "fig-timeline", "fig-costs"]


@pytest.fixture(scope="module")
def big_study(tmp_path_factory) -> Path:
    return stored_study(tmp_path_factory.mktemp("big"), "finished", n=10_000, gpus=8)


@pytest.mark.slow
@pytest.mark.xdist_group("chromium")
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.parametrize("kind", ["finished", "running", "multi", "only_fail", "10000",
                                  "simulated", "asha", "pbt"])
def test_the_report_renders_every_figure_in_a_browser_without_a_network(
        kind, tmp_path, request, chromium):
    study = (request.getfixturevalue("big_study") if kind == "10000"
             else stored_study(tmp_path, "finished", n=40, simulated=True)
             if kind == "simulated" else stored_study(tmp_path, kind, n=40))
    page = tmp_path / f"{kind}.html"
    assert run_cli("report", str(study), "-o", str(page)) == 0
    text = page.read_text()
    assert "<script src" not in text and text.count("plotly.js v") == 1  # inlined, once
    dom, logged = chromium.render(page, tmp_path / f"{kind}.png")
    assert logged == []  # no console line, uncaught error or refused request
    drawn = rendered(dom)
    expected = [f.replace("intermediate", "pareto") if kind == "multi" else f for f in FIGURES]
    if kind in ("asha", "pbt"):  # a scheduler's study: its lineages too (issue 31)
        expected.append("fig-lineages")
        assert 'id="savings"' in dom and 'id="fidelity"' in dom
        assert ('id="copies"' in dom) is (kind == "pbt")
        assert ">promoted<" in dom if kind == "asha" else ">exploited<" in dom  # legends
    assert list(drawn) == expected
    assert set(drawn.values()) == {3}, drawn  # each figure drew plotly 7's three SVG roots
    assert dom.count('class="plot-container plotly"') == len(expected)
    assert (tmp_path / f"{kind}.png").stat().st_size > 10_000
    if kind == "only_fail":
        assert "no trial has a value yet" in dom and 'id="failures"' in dom
    if kind == "simulated":  # each empty panel says why, where a user looks
        for said in ("no utilisation measured", "no memory use measured",
                     "no energy measured"):
            assert said in dom


@pytest.mark.slow
@pytest.mark.xdist_group("chromium")
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_browser_check_sees_an_error_a_console_line_and_a_request_off_the_network(
        tmp_path, chromium):
    """What the report's check above asserts is empty is not empty for a page that logs,
    throws (at once, and later on a timer inside the budget) and asks the network."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><head><script src="https://cdn.plot.ly/plotly-2.0.0.min.js"></script></head>'
        '<body><script>console.warn("said"); setTimeout(function () {'
        'document.body.append("late"); throw new Error("later"); }, 1000); no_such();'
        "</script></body></html>")
    dom, logged = chromium.render(page, tmp_path / "bad.png")
    assert "late" in dom  # the timer ran: virtual time went past it
    assert sorted(line.split("\n")[0] for line in logged) == [
        "console.warning: said",
        "network error: Failed to load resource: net::ERR_PROXY_CONNECTION_FAILED",
        "uncaught: Error: later",
        "uncaught: ReferenceError: no_such is not defined"]


@pytest.mark.parametrize("simulated", [True, False], ids=["simulated", "nvml"])
def test_no_panel_is_empty_without_a_sentence_saying_why(tmp_path, simulated):
    """Issue 32, the report as a user saw it: on a simulated pool the GPU utilisation and
    memory panels were empty without a note (its samples are rows of NaN, so the empty check
    never fired, and the legend listed lines that draw nothing), the energy panels were empty
    -1..1 axes; the "GPU utilisation (%)" title sat on the last device's bar; the worst trials
    of the parallel coordinates were drawn near white on white."""
    import optuna
    from plotly.colors import convert_colors_to_same_type

    from sweep.analysis import report as report_module

    s, study = report_module.load(stored_study(tmp_path, "running", n=30, simulated=simulated))
    assert isinstance(study, optuna.Study)
    figs = figures.all_figures(s, study)
    assert {name: silent_panels(fig) for name, fig in figs.items()} == {n: [] for n in figs}
    rows = figs["timeline"].layout.yaxis
    assert rows.range[0] <= min(rows.tickvals) - 0.5  # the bars clear of the titles
    assert rows.range[1] >= max(rows.tickvals) + 0.3
    lines = [t.line.color for t in figs["parallel"].data if t.mode == "lines"]
    assert len(lines) == sum(1 for t in study.trials if t.state.name == "COMPLETE")
    for colour in lines:  # the palest line is still a visible blue on the white page
        (rgb,), _ = convert_colors_to_same_type([colour], colortype="tuple")
        assert sum(rgb) / 3 < 0.75, colour


def summary_of(rows: list[dict]) -> report.Summary:
    from sweep.spec import schema

    spec = schema.Spec.model_validate({
        "study": {"name": "s", "metric": "loss", "n_trials": 9},
        "trainer": {"script": "t.py"}})
    start = datetime(2026, 1, 1, 12, 0, 0)
    frame = pd.DataFrame([{
        "number": i, "state": r["state"], "value": r.get("value"), names.GPU: 0,
        names.GPUS: r.get("gpus"), names.HOST: "h", names.ENERGY_J: r.get(names.ENERGY_J),
        names.FAIL_REASON: r.get("reason"),
        "datetime_start": start + timedelta(hours=r["at"]),
        "datetime_complete": start + timedelta(hours=r["at"] + r["hours"])}
        for i, r in enumerate(rows)])
    return report.Summary(spec, frame, pd.DataFrame(), pd.DataFrame())


def test_costs_are_device_hours_and_energy_by_state_and_until_the_best():
    s = summary_of([
        {"state": "COMPLETE", "value": 0.5, "at": 0, "hours": 1, names.ENERGY_J: 3.6e6},
        {"state": "FAIL", "at": 0, "hours": 0.5, "gpus": "0,1", "reason": "exit code 1: x"},
        {"state": "COMPLETE", "value": 0.2, "at": 1, "hours": 2, names.ENERGY_J: 7.2e6},
        {"state": "PRUNED", "value": 0.9, "at": 1, "hours": 0.25},
        {"state": "COMPLETE", "value": 0.3, "at": 3, "hours": 1},
    ])
    assert figures.cost_figures(s) == {
        "device_hours": 5.25, "energy_kwh": 3.0, "fail_device_hours": 1.0,
        "pruned_device_hours": 0.25, "best_trial": 2, "best_value": 0.2,
        "device_hours_to_best": 4.25}  # trials 1, 3, 0 then 2 ended before it


def test_failures_are_grouped_by_reason_with_their_trial_numbers():
    rows = [{"state": "FAIL", "at": i, "hours": 1, "reason": "timeout after 5 s"}
            for i in range(3)]
    rows += [{"state": "FAIL", "at": 0, "hours": 1, "reason": "out of memory: x"},
             {"state": "COMPLETE", "value": 1.0, "at": 0, "hours": 1}]
    got = figures.failures(summary_of(rows), most=2)
    assert got.to_dict("records") == [
        {"reason": "timeout after 5 s", "count": 3, "trials": "0, 1, … (1 more)"},
        {"reason": "out of memory: x", "count": 1, "trials": "3"}]


def test_report_of_a_study_not_run_yet_is_one_line_and_writes_nothing(write_study, capsys):
    study = write_study()
    assert run_cli("report", str(study)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sweep: error: ")
    assert "no study named 'probe'" in err[0] and not (study.parent / "probe").exists()


@pytest.mark.slow
def test_run_with_report_refreshes_the_report_at_the_end(write_study, fake_gpus, capsys):
    study = write_study(study={"n_trials": 2})
    assert run_cli("run", str(study), "--report") == 0
    page = study.parent / "probe" / report.REPORT_NAME
    assert f"report: {page}" in capsys.readouterr().err
    assert "2 COMPLETE" in page.read_text() and len(load_trials(study)) == 2
    keyed = write_study(study={"n_trials": 1, "name": "keyed", "report": True},
                        name="keyed.yaml")
    assert run_cli("run", str(keyed)) == 0
    assert (study.parent / "keyed" / report.REPORT_NAME).is_file()


def test_report_while_every_trial_is_running(write_study, capsys):
    """Issue 32: with no trial finished, `sweep report` failed with `TypeError: cannot
    subtract DatetimeArray` (exit 1): the end times were all missing, of no time type."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    study_file = write_study()
    study = optuna.create_study(study_name="probe",
                                storage=f"sqlite:///{study_file.parent / 'probe.db'}")
    for gpu in range(2):
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.RUNNING, params={"x": 0.5},
            distributions={"x": FloatDistribution(0.0, 1.0)},
            user_attrs={names.GPU: gpu, names.HOST: "node1", names.ATTEMPT: 0}))
    page = study_file.parent / "report.html"
    capsys.readouterr()
    assert run_cli("report", str(study_file), "-o", str(page)) == 0, capsys.readouterr().err
    assert "no trial has a value yet" in page.read_text()
    assert run_cli("summary", str(study_file)) == 0
    assert "probe: 2 RUNNING" in capsys.readouterr().out


def test_the_timeline_without_any_sample_says_so_in_both_rows():
    s = summary_of([{"state": "COMPLETE", "value": 0.5, "at": 0, "hours": 1}])
    fig = figures.timeline(s)
    assert silent_panels(fig) == []
    notes = [a.text for a in fig.layout.annotations if a.xref.endswith(" domain")]
    assert notes == [figures.NO_SAMPLES, figures.NO_SAMPLES]


@pytest.mark.parametrize("energy", [True, False], ids=["energy", "energy-still"])
def test_no_panel_is_empty_without_a_sentence_after_a_real_sweep_on_fake_nvml(
        monkeypatch, write_study, energy):
    """The samples of a real run through the fake NVML (not written by a test): each panel
    draws, or says why not, also where the cards' energy counters do not move."""
    from sweep.analysis import report as report_module
    from sweep.testing import fake_pynvml
    from sweep.testing.fake_pynvml import FakeGpu

    monkeypatch.delenv("SWEEP_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(uuid="GPU-a", util_gpu=40, memory_used=2**30),
            FakeGpu(uuid="GPU-b", util_gpu=80, memory_used=2 * 2**30)]
    fake_pynvml.install(monkeypatch, gpus)
    if energy:  # each reading of the counter is 50 J on
        counter = fake_pynvml.nvmlDeviceGetTotalEnergyConsumption

        def moving(handle: Any) -> int:
            handle.energy_mj += 50_000
            return counter(handle)

        monkeypatch.setattr(fake_pynvml, "nvmlDeviceGetTotalEnergyConsumption", moving)
    study = write_study(study={"n_trials": 4}, trainer={"args": ["--sleep", "0.8"]},
                        gpus={"sample_interval": 0.1, "skip_busy": False})
    assert run_cli("run", str(study)) == 0
    s, loaded = report_module.load(study)
    assert loaded is not None
    figs = figures.all_figures(s, loaded)
    assert {name: silent_panels(fig) for name, fig in figs.items()} == {n: [] for n in figs}
    notes = [a.text for a in figs["costs"].layout.annotations]
    assert (figures.STILL_ENERGY in notes) is not energy
    assert not any(a.text.startswith("no ") for a in figs["timeline"].layout.annotations)
