"""The latency-SLO page: its table and rate parsing, charts of a small sweep, and the page under AppTest
(random weights, CPU, a small sweep put in place of the default): sections, goodput per configuration, targets
that re-read the runs without re-running them, and bad input as messages that keep the last results."""
from __future__ import annotations

import re
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from engine.serving_load import SLO, WORKLOADS, LoadConfig, SweepResult, WorkloadSpec, goodput_rate, run_sweep
from engine.serving_load import sweep as sweep_module

from app.analysis.slo_fit import fitted_targets, round_up
from app.analysis.slo_goodput import (PRESETS, SweepSettings, beside_target, faster_than, goal_in_requests,
                                      goodput_text, miss_reasons, parse_rates, passes_after_miss_text, preset_rows, requests_frame,
                                      rows_to_configs, runs_frame)
from app.charts.slo_goodput import attainment_figure, latency_figure, request_scatter_figure, timeline_figure
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)

PAGE, PREFIX = "14_slo_goodput.py", "slo"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Run the load test"
CPU = {"device": "cpu", "dtype": "float32", "weights": "random"}


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "latency-slo-goodput")
    assert spec.available and spec.section == "Serving"


def test_presets_and_rows_become_configs_or_sentences() -> None:
    for name in PRESETS:
        configs, errors = rows_to_configs(preset_rows(name))
        assert not errors and len(configs) == len(PRESETS[name]), name
    configs, _ = rows_to_configs(preset_rows("Token budget (chunked prefill)"))
    assert [(c.max_num_batched_tokens, c.chunked_prefill) for c in configs] == [(64, True), (256, True), (1024, False)]
    empty = dict(name=None, batch_cap=None, token_budget=None, chunked=None, output_cap=None)
    assert rows_to_configs([dict(name="a", batch_cap=2, token_budget=64, chunked=True, output_cap=None), empty]) == \
        ([LoadConfig("a", 2, 64, True, 0)], [])
    bad = [([dict(name="", batch_cap=2, token_budget=64, chunked=True, output_cap=0)], "Row 1: give the configuration a name"),
           ([dict(name="a", batch_cap=2.5, token_budget=64, chunked=True, output_cap=0)], "Row 1: the batch cap must be a whole"),
           ([dict(name="a", batch_cap=2, token_budget=None, chunked=True, output_cap=0)], "Row 1: the token budget is empty"),
           ([dict(name="a", batch_cap=99, token_budget=64, chunked=True, output_cap=0)], r"Row 1: batch cap must be an integer in \[1, 64\]"),
           ([dict(name="a", batch_cap=2, token_budget=64, chunked=True, output_cap=0)] * 2, "Row 2 has the same name"),
           ([dict(name=str(i), batch_cap=2, token_budget=64, chunked=True, output_cap=0) for i in range(5)], "at most 4"),
           ([], "at least one configuration")]
    for rows, match in bad:
        _, errors = rows_to_configs(rows)
        assert errors and any(re.search(match, e) for e in errors), (rows, errors)
        assert all("\n" not in e and "configuration '" not in e for e in errors)


def test_rates_parse_from_text() -> None:
    assert parse_rates("4, 1 2;0.5") == ((0.5, 1.0, 2.0, 4.0), None)
    assert parse_rates("1, 1, 2") == ((1.0, 2.0), None)
    for text, match in (("", "at least one"), ("1, fast", "'fast' is not"), ("0", "above 0 and at most 1000"),
                        ("nan", "above 0"), ("2000", "got 2000"), ("1 2 3 4 5 6 7", "at most 6")):
        rates, err = parse_rates(text)
        assert rates == () and err is not None and re.search(match, err), (text, err)


@pytest.fixture(scope="module")
def small_sweep(tiny_weights):  # noqa: ANN001, ANN201
    configs = [LoadConfig("one", 1, 64), LoadConfig("four", 4, 64)]
    return run_sweep(tiny_weights, CPU, configs, WorkloadSpec("chat", 5, (8, 30), (3, 8), seed=2), [2.0, 500.0])


def test_tables_and_charts_of_a_sweep(small_sweep) -> None:  # noqa: ANN001
    slo = SLO(ttft_s=0.05, tpot_s=0.05, goal=0.8)
    frame = runs_frame(small_sweep, slo)
    assert len(frame) == 4 and {"TTFT p80 (s)", "TPOT p80 (ms)", "SLO met"} <= set(frame.columns)
    run = small_sweep.run("one", 500.0)
    reqs = requests_frame(run, slo)
    assert list(reqs["request"]) == [f"q0{i}" for i in range(5)]
    assert sum(miss_reasons(run, slo).values()) == int((reqs["meets SLO"] != "met").sum())
    figs = [attainment_figure(small_sweep, slo), latency_figure(small_sweep, slo), request_scatter_figure(run, slo),
            timeline_figure(run, slo)]
    for fig in figs:
        assert isinstance(fig, go.Figure) and fig.layout.title.text
    # Two curves, and a goodput star for each configuration that has one.
    stars = sum(small_sweep.goodput(c.label, slo) is not None for c in small_sweep.configs)
    assert len(figs[0].data) == 2 + stars
    assert len(figs[1].data) == 6  # TTFT, TPOT, throughput for each configuration
    bars = [t for t in figs[3].data if isinstance(t, go.Bar) and t.orientation == "h"]
    assert [b.name for b in bars] == ["waiting", "prefill → first token", "decoding"] and len(bars[0].y) == 5
    assert goodput_text(None, (2.0, 500.0)) == "below 2 req/s" and goodput_text(500.0, (2.0, 500.0)).endswith("(or more)")
    # Each request's TTFT is written on the side of the target its verdict puts it.
    for t, text in zip(run.timings, reqs["TTFT (s)"]):
        assert (float(text) <= slo.ttft_s) == t.meets_ttft(slo) and abs(float(text) - t.ttft_s) < 5e-4
    # The scatter's hover writes the table's numbers.
    table = dict(zip(reqs["request"], zip(reqs["TTFT (s)"], reqs["TPOT (ms)"])))
    hovered = {tuple(c[4:]) for trace in figs[2].data for c in (trace.customdata or ())}
    assert hovered == set(table.values())


def test_round_targets() -> None:
    assert [round_up(x) for x in (0.0123, 0.1, 0.101, 0.55, 0.95, 1.0, 1.7, 7.2, 9.0, 42.0)] == \
        [0.015, 0.1, 0.12, 0.6, 1.0, 1.0, 2.0, 8.0, 10.0, 50.0]
    with pytest.raises(ValueError):
        round_up(0.0)


def test_fitted_targets_let_one_configuration_reach_the_goal(small_sweep) -> None:  # noqa: ANN001
    """Targets too tight for every configuration: the fitted ones are round, looser only where they must be,
    and a configuration then reaches the goal at the lowest rate."""
    tight = SLO(ttft_s=1e-4, tpot_s=1e-4, goal=0.8)
    assert small_sweep.leaders(tight) == ()
    fit = fitted_targets(small_sweep, tight)
    assert fit.goal == tight.goal and fit.ttft_s > tight.ttft_s and fit.tpot_s > tight.tpot_s
    assert small_sweep.leaders(fit) and any(small_sweep.goodput(c.label, fit) for c in small_sweep.configs)
    assert round_up(fit.ttft_s) == fit.ttft_s and round_up(fit.tpot_s) == fit.tpot_s
    # A target already met stays; only the missed one moves.
    loose_ttft = SLO(ttft_s=100.0, tpot_s=1e-4, goal=0.8)
    refit = fitted_targets(small_sweep, loose_ttft)
    assert refit.ttft_s == 100.0 and refit.tpot_s > 1e-4 and small_sweep.leaders(refit)
    # A TPOT target enough requests meet on their own stays exactly where it is (the page once moved a 100 ms
    # target that held to 120 ms: the headroom was added to every measured figure), and the slowest requests'
    # first tokens are waited for instead.
    run = small_sweep.run(small_sweep.configs[0].label, min(small_sweep.rates))
    held = SLO(ttft_s=1e-4, tpot_s=run.tpot_percentile(80), goal=0.8)
    refit = fitted_targets(small_sweep, held)
    assert refit.tpot_s == held.tpot_s and small_sweep.leaders(refit)


class _Curves:
    """A sweep's curves without runs: what `passes_after_miss_text` reads."""

    def __init__(self, curves: dict[str, list[tuple[float, float]]]) -> None:
        self.curves = curves
        self.configs = [LoadConfig(label, 2, 64) for label in curves]

    def curve(self, label: str, slo: SLO) -> list[tuple[float, float]]:
        return self.curves[label]


def test_a_pass_above_a_miss_is_named_and_not_goodput() -> None:
    """The review's case: 6 requests, batch cap 8 at 83 % / 100 % / 83 % for 1 / 2 / 4 req/s against a 90 % goal."""
    slo = SLO(ttft_s=1.0, tpot_s=0.1, goal=0.9)
    sweep = _Curves({"batch cap 2": [(1.0, 0.5), (2.0, 0.33), (4.0, 0.17)],
                     "batch cap 8": [(1.0, 5 / 6), (2.0, 1.0), (4.0, 5 / 6)]})
    assert goodput_rate(sweep.curve("batch cap 8", slo), slo.goal) is None
    text = passes_after_miss_text(sweep, slo, 6)
    assert text.startswith("batch cap 8 reaches the goal again at 2 req/s after missing it at 1 req/s. Goodput")
    assert "a 90% goal needs all 6 to meet both targets" in text and "batch cap 2" not in text
    assert "needs 44 of 48" in passes_after_miss_text(sweep, slo, 48)
    assert passes_after_miss_text(_Curves({"a": [(1.0, 1.0), (2.0, 0.5)]}), slo, 6) is None
    assert goal_in_requests(0.9, 6) == 6 and goal_in_requests(0.5, 6) == 3 and goal_in_requests(1.0, 7) == 7


def test_times_are_written_on_their_side_of_the_target() -> None:
    """Three decimals called a 1.0004 s TTFT "1.000" beside "✗ TTFT" for a 1 s target: digits are added
    until the written number agrees with the verdict, and only then."""
    assert beside_target(1.0004, 1.0, False, 3) == "1.0004"
    assert beside_target(0.99996, 1.0, True, 3) == "1.000"  # at the target is within it
    assert beside_target(1.2346, 1.0, False, 3) == "1.235"
    assert beside_target(100.3, 100.0, False, 0) == "100.3" and beside_target(99.6, 100.0, True, 0) == "100"
    assert beside_target(72.4, 100.0, True, 0) == "72"


def _small_settings(requests: int = 2) -> SweepSettings:
    configs, _ = rows_to_configs(preset_rows("Batch cap: 2 vs 8"))
    return SweepSettings(next(iter(WORKLOADS)), requests, 0, (2.0, 50.0), tuple(configs))


def test_page_runs_rereads_targets_and_keeps_results_on_bad_input(random_app: AppTest,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One AppTest with a small sweep in place of the default (the default takes ~30 s on this CPU)."""
    random_app.session_state[f"{PREFIX}-settings"] = _small_settings()
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert [s.value for s in at.subheader] == ["Goodput of each configuration", "One run up close", "Every run"]
    assert [m.label for m in at.metric] == ["batch cap 2", "batch cap 8"]
    assert len(at.get("plotly_chart")) == 4
    assert "CPU" in " ".join(c.value for c in at.caption)
    # New targets re-read the runs: nothing may run again (a run now would fail loudly).
    def no_rerun(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the sweep ran again")

    monkeypatch.setattr(sweep_module, "run_load", no_rerun)
    at.number_input(key=f"{PREFIX}-ttft").set_value(120.0).run()
    at.number_input(key=f"{PREFIX}-tpot").set_value(10000.0).run()
    assert_clean(at)
    assert [m.value for m in at.metric] == ["50 req/s (or more)"] * 2
    at.number_input(key=f"{PREFIX}-ttft").set_value(0.001).run()
    assert [m.value for m in at.metric] == ["below 2 req/s"] * 2
    assert any("No configuration reaches" in w.value for w in at.warning)
    # One click fits the targets to this machine: a configuration then reaches the goal at the lowest rate.
    fit = at.button(key=f"{PREFIX}-fit")
    assert fit.label.startswith("Fit the targets to this machine: TTFT ")
    fit.click().run()
    assert_clean(at)
    assert not at.warning and any("Highest goodput" in m.value for m in at.markdown)
    # Only the missed target moved (TPOT was met at 10 s).
    targets = at.number_input(key=f"{PREFIX}-ttft").value, at.number_input(key=f"{PREFIX}-tpot").value
    assert targets[0] > 0.001 and targets[1] == 10000.0
    # Bad input: messages, and the results stay.
    at.text_input(key=f"{PREFIX}-rates").set_value("1, fast")
    at.button(key=SUBMIT).click().run()
    assert not at.exception and [e.value for e in at.error] == ["Request rates must be numbers (requests per second); 'fast' is not."]
    assert len(at.metric) == 2
    # A failing run is a message; the last results stay on screen.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(sweep_module, "run_load", broken)
    at.text_input(key=f"{PREFIX}-rates").set_value("3")
    at.number_input(key=f"{PREFIX}-requests").set_value(2)
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The load test failed: out of memory (simulated)"]
    assert len(at.metric) == 2 and len(at.get("plotly_chart")) == 4


class _Scored(_Curves):
    """Curves plus each configuration's throughput at every rate: what `leaders` and `faster_than` read."""

    def __init__(self, curves: dict[str, list[tuple[float, float]]], tok_s: dict[str, float]) -> None:
        super().__init__(curves)
        self.tok_s = tok_s

    def goodput(self, label: str, slo: SLO) -> float | None:
        return goodput_rate(self.curve(label, slo), slo.goal)

    def run(self, label: str, rate: float) -> SimpleNamespace:
        return SimpleNamespace(throughput_tok_s=self.tok_s[label])


def test_a_tie_is_a_tie_and_noise_is_not_a_different_winner() -> None:
    """The review's case: one request, both caps meet the goal at 1000 req/s; "batch cap 8" won on its name and
    14 against 13 tok/s read as "throughput and goodput pick different winners"."""
    slo = SLO(ttft_s=1.0, tpot_s=0.1, goal=0.9)
    same = [(1000.0, 1.0)]
    tie = _Scored({"batch cap 2": same, "batch cap 8": same}, {"batch cap 2": 14.0, "batch cap 8": 13.0})
    assert SweepResult.leaders(tie, slo) == ("batch cap 2", "batch cap 8")
    # One leader: another configuration is "faster" only beyond the margin.
    lead = _Scored({"a": [(1.0, 1.0), (2.0, 1.0)], "b": [(1.0, 1.0), (2.0, 0.5)]}, {"a": 100.0, "b": 104.0})
    assert SweepResult.leaders(lead, slo) == ("a",) and faster_than(lead, "a", 2.0) is None
    lead.tok_s["b"] = 130.0
    assert faster_than(lead, "a", 2.0) == "b"
    assert SweepResult.leaders(_Scored({"a": [(1.0, 0.5)]}, {"a": 1.0}), slo) == ()
