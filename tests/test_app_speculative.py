"""The speculative decoding page under AppTest (load, step, scrub back, controls, drafter comparison),
and the record-only analysis behind it (rounds, rollback, acceptance series, closed form, benchmark).

Random weights keep most tests independent of the GGUF; one test uses the real model, where prompt
lookup must really accept drafts on the copy-edit scenario.
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.analysis.speculative import (ALL_DRAFTERS_BENCH, BENCH_C, LIVE_C, bench_c, bench_rows, bench_setup,
                                      closed_form_caption, compare_drafters, cost_options, cost_text,
                                      expected_tokens_per_pass, largest_gap, load_bench, measured_c, other_bench_note,
                                      predicted_speedup, round_sentence, spec_series, speedup_vs_plain, step_rounds)
from app.charts.speculative import bench_figure, closed_form_figure, compare_figure, round_figure
from app.registry import PAGES
from app.scenario_library import SPECULATIVE
from app.scenarios import ScenarioError, scenario_from_dict, scenario_from_json
from app.session import EngineSession
from tests.apptest_helpers import assert_clean, new_app, open_page, random_app  # noqa: F401 (fixture)

PAGE_FILE = "07_speculative_decoding.py"
SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}

pytestmark = pytest.mark.slow


# ---- scenarios and the closed form ---------------------------------------------------------------

def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.title == "Speculative decoding")
    assert spec.available and spec.url_path == "speculative-decoding"


@pytest.mark.parametrize("scenario", SPECULATIVE, ids=lambda s: s.name)
def test_scenarios_round_trip(scenario) -> None:  # noqa: ANN001
    assert scenario_from_json(scenario.to_json()) == scenario
    assert scenario.engine_config(**SERVER).spec_drafter in ("ngram", "early_exit")


def test_scenario_engine_spec_fields_are_checked() -> None:
    ok = {"requests": [{"prompt": "hi"}], "engine": {"spec_drafter": "ngram", "spec_gamma": 3}}
    assert scenario_from_dict(ok).engine_config().spec_gamma == 3
    with pytest.raises(ScenarioError, match="spec_drafter"):
        scenario_from_dict({"requests": [{"prompt": "hi"}], "engine": {"spec_drafter": "lookahead"}})
    with pytest.raises(ScenarioError, match="spec_gamma"):
        scenario_from_dict({"requests": [{"prompt": "hi"}], "engine": {"spec_gamma": 99}})


def test_closed_form() -> None:
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert predicted_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert predicted_speedup(0.8, 4, 0.5) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 3))


def test_bench_file_matches_its_own_closed_form() -> None:
    bench = load_bench()
    assert bench is not None
    rows = bench_rows(bench)
    assert {"copy", "chat"} <= {r["workload"] for r in rows}
    assert not any(r["drafter"] in ("Medusa heads", "EAGLE layer") for r in rows)  # trees: page 08
    # c in one notation per magnitude: powers of ten below 0.001, two figures above
    assert (cost_text(4.2e-5), cost_text(1.4e-4), cost_text(0.523), cost_text(0.0)) == ("4.2e-05", "1.4e-04", "0.52", "0")
    assert (cost_text(0.6), cost_text(0.61), cost_text(1.0)) == ("0.60", "0.61", "1.0")
    assert all(r["c"] == cost_text(raw["c"]) for r, raw in zip(rows, [x for x in bench["rows"]
                                                                     if x["drafter"] not in ("plain", "medusa", "eagle")]))
    for raw in bench["rows"]:
        if raw["drafter"] != "plain":
            predicted = expected_tokens_per_pass(raw["alpha"], raw["gamma"])
            assert raw["predicted_tokens_per_pass"] == pytest.approx(predicted)
    fig = bench_figure(bench)
    chains = {(r["workload"], r["drafter"]) for r in bench["rows"] if r["drafter"] in ("ngram", "early_exit", "draft_model")}
    assert len(fig.data) == 2 * len(chains)  # (measured, predicted) per workload and chain drafter
    assert len(closed_form_figure(0.8, 4, 0.1, 3.0, 2.0).data) >= 6


def test_closed_form_labels_stay_inside_their_panels() -> None:
    """The α labels end at their lines' last γ, inside the plot (hung off the end they ran into the next
    panel's y-axis title), and a prompt-lookup c of 9e-05 reads as "< 0.001" in the title."""
    fig = closed_form_figure(0.75, 4, 9e-5)
    labels = [a for a in fig.layout.annotations if a.text.startswith("α=")]
    assert len(labels) == 8 and all(a.x == 10 and a.xanchor == "right" for a in labels)
    assert fig.layout.xaxis.range[1] < 11 and fig.layout.xaxis2.range[1] < 11
    titles = [a.text for a in fig.layout.annotations]
    assert "predicted speedup vs γ (c < 0.001)" in titles
    costly = closed_form_figure(0.75, 4, 0.12)
    assert "predicted speedup vs γ (c = 0.12)" in [a.text for a in costly.layout.annotations]


def test_the_right_panels_axis_title_has_room() -> None:
    """"× plain decoding" was squeezed between the panels: a short title, the unit on the ticks, a wider gap."""
    fig = closed_form_figure(0.6, 8, 0.635)
    assert fig.layout.yaxis2.title.text == "speedup" and fig.layout.yaxis2.ticksuffix == "×"
    assert fig.layout.xaxis2.domain[0] - fig.layout.xaxis.domain[1] >= 0.12


def test_c_is_this_drafters_and_says_whose() -> None:
    """The benchmark ran early exit with its own number of layers: its c stands in for another early exit only
    until this run has measured one, labelled so; for the same drafter it is offered after this run's own."""
    bench = load_bench()
    layers = int(bench["draft_layers"])
    c_bench = bench_c(bench, "early_exit")
    (only,) = cost_options(None, bench, "early_exit", 1)
    assert (only.source, only.value) == (BENCH_C, c_bench)
    assert "stand-in" in only.why and f"{layers} layers, this run's with 1" in only.why
    assert [o.source for o in cost_options(0.05, bench, "early_exit", 1)] == [LIVE_C]  # the 16-layer c: not this one
    same = cost_options(0.6, bench, "early_exit", layers)
    assert [o.source for o in same] == [LIVE_C, BENCH_C] and "the same drafter" in same[1].why
    assert f"{layers} of 30 layers" in same[1].why
    assert [o.source for o in cost_options(None, bench, "ngram", 1)] == [BENCH_C]  # layers do not touch lookup
    assert cost_options(None, None, "early_exit", 1) == ()


def test_closed_form_caption_names_only_this_drafters_causes() -> None:
    assert "prompt lookup found no match" in closed_form_caption("ngram")
    for drafter in ("early_exit", "draft_model"):
        text = closed_form_caption(drafter)
        assert "lookup" not in text and "fewer than γ" in text


def test_each_benchmark_table_says_what_it_ran_and_that_the_other_differs() -> None:
    """Pages 07 and 08 tabulate two benchmark files run on different prompts and lengths: each says what it
    ran, read from its file, and gives the row whose τ differs most between the two."""
    chain, trees = load_bench(), load_bench(ALL_DRAFTERS_BENCH)
    for bench in (chain, trees):
        text = bench_setup(bench)
        prompts = sorted(set(bench["workloads"].values()))
        assert text.startswith(f"{prompts[0]} prompts in each of ") and f"{bench['max_tokens']} new tokens" in text
        assert ("the fastest of" in text) == (bench["repeats"] > 1)
    a, b = largest_gap(chain, trees)
    assert (a["workload"], a["drafter"], a["gamma"]) == (b["workload"], b["drafter"], b["gamma"])
    note = other_bench_note(chain, trees, "Page 08's table")
    assert note.startswith(" Page 08's table ran a different set: " + bench_setup(trees))
    assert f"τ {a['tokens_per_pass']:.2f} and {a['speedup']:.2f}× here" in note
    assert f"τ {b['tokens_per_pass']:.2f} and {b['speedup']:.2f}× there" in note
    assert other_bench_note(chain, None, "x") == ""


# ---- records only --------------------------------------------------------------------------------

def test_rounds_rollback_and_series(random_weights) -> None:  # noqa: ANN001
    # Random weights repeat themselves, so prompt lookup finds matches; greedy keeps every check exact.
    s = EngineSession.create(SPECULATIVE[0].with_engine(spec_drafter="early_exit", spec_gamma=3, spec_draft_layers=4),
                             random_weights, SERVER)
    s.run(400)
    assert not s.errors, s.errors
    rounds = [r for rec in s.records for r in step_rounds(rec)]
    assert rounds
    for r in rounds:
        n = int(r["num_accepted"])
        assert r.written_slots == 1 + r.g and r.rolled_back == r.g - n and 1 <= r.emitted <= r.g + 1
        assert all(0 <= x <= 1 for x in r.ratios)
        assert r["verdicts"][:n] == ["accepted"] * n
        assert ("**" + r.request_id) in round_sentence(r)
        fig = round_figure(r)
        assert len(fig.data) >= 2
    series = spec_series(s.records)
    last = series[-1]
    assert last.rounds == len(rounds) and last.drafted == sum(r.g for r in rounds)
    assert last.tokens_per_pass is not None and last.tokens_per_pass >= 1.0
    assert measured_c(s.records) is not None
    # A step's time shows once: as drafting + verification when it ran a round, else as a plain decode.
    for p, rec in zip(series, s.records):
        if step_rounds(rec):
            assert p.plain_seconds == 0 and p.verify_seconds > 0
        elif any(b.phase == "decode" for b in rec.batch):
            assert p.plain_seconds == pytest.approx(rec.wall_seconds)


def test_compare_drafters_greedy_matches_plain(random_weights) -> None:  # noqa: ANN001
    scenario = SPECULATIVE[0].with_requests([SPECULATIVE[0].requests[0].__class__(
        SPECULATIVE[0].requests[0].prompt, max_tokens=12, ignore_eos=True, request_id="copy")]).with_engine(
        spec_draft_layers=4)
    runs = compare_drafters(scenario, random_weights, SERVER)
    assert {"plain", "ngram", "early_exit"} <= set(runs)
    assert all(not r.errors for r in runs.values())
    plain = dict(runs["plain"].texts)
    for k in set(runs) - {"plain"}:
        assert dict(runs[k].texts) == plain  # greedy speculation emits exactly plain greedy's tokens
    assert speedup_vs_plain(runs, "plain") == pytest.approx(1.0)
    assert runs["plain"].tokens_per_pass == pytest.approx(1.0)
    fig = compare_figure(runs)
    assert len(fig.data) == 3  # one bar trace per panel
    # A row per drafter, named once on the shared y axis (slanted column names ran into the next panel's).
    assert all(t.orientation == "h" and list(t.y) == [runs[k].label for k in runs] for t in fig.data)
    assert fig.layout.yaxis2.matches == "y" and fig.layout.yaxis3.matches == "y"


# ---- the page ------------------------------------------------------------------------------------

def test_page_steps_scrubs_controls_and_compares(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE_FILE)
    assert_clean(at)
    for _ in range(5):
        at.button(key="spec-btn-step").click().run()
        assert_clean(at)
    session = at.session_state["engine-session:spec"]
    assert [r.step for r in session.records] == [0, 1, 2, 3, 4]
    assert len(at.get("plotly_chart")) >= 4
    assert any(m.label == "α so far" for m in at.metric)
    # The bench table's v below 1 (the chat rows of prompt lookup) is called noise where "with v" beats the formula.
    below = [r["v"] for r in load_bench()["rows"] if r.get("v", 1) < 1 and r["drafter"] not in ("plain", "medusa", "eagle")]
    assert below and any(f"v is below 1 ({min(below):.2f} to {max(below):.2f})" in c.value and "timing noise" in c.value
                         for c in at.caption)
    # Scrub back to the prefill step (no round) and forward again: redrawn from records, nothing re-runs.
    at.slider(key="spec-scrub").set_value(0).run()
    assert_clean(at)
    at.slider(key="spec-scrub").set_value(3).run()
    assert_clean(at)
    assert len(session.records) == 5
    # Controls: early exit, γ 2, sampled at T = 1.0, applied through a restart.
    at.selectbox(key="spec-spec-drafter").set_value("early_exit")
    at.slider(key="spec-spec-gamma").set_value(2)
    at.number_input(key="spec-spec-layers").set_value(4)
    at.selectbox(key="spec-spec-mode").set_value("sampled, T = 1.0")
    at.button(key="FormSubmitter:spec-spec-form-Apply and restart").click().run()
    assert_clean(at)
    session = at.session_state["engine-session:spec"]
    assert session.engine.config.spec_drafter == "early_exit" and session.engine.config.spec_gamma == 2
    assert all(r.temperature == 1.0 for r in session.scenario.requests)
    for _ in range(3):
        at.button(key="spec-btn-step").click().run()
        assert_clean(at)
    rounds = [r for rec in session.records for r in step_rounds(rec)]
    assert rounds and all(r["mode"] == "sampled" for r in rounds)
    assert rounds[0]["uniforms"][0] is not None
    # A 4-layer early exit has its own c now: the closed form uses it and says so, not the 16-layer benchmark's;
    # and the caption under the chart does not blame prompt lookup.
    assert any(m.value.startswith("**c = ") and "(measured in this run: " in m.value for m in at.markdown)
    captions = " ".join(c.value for c in at.caption)
    assert "lookup found no match" not in captions and "fewer than γ" in captions
    assert "ran a different set: " in captions  # the benchmark table names the other page's
    # Another scenario from the library, then the three-way comparison on a short version of it.
    at.selectbox(key="spec-pick").set_value(SPECULATIVE[1].name).run()
    assert_clean(at)
    at.button(key="spec-btn-end").click().run()
    assert_clean(at)
    at.button(key="spec-compare").click().run()
    assert_clean(at)
    assert any(m.label.startswith("plain decoding") for m in at.metric)


def test_page_with_the_real_model(real_weights, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "real")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    at = open_page(new_app(), PAGE_FILE)
    assert "SmolLM2-135M-Instruct" in " ".join(c.value for c in at.caption)
    for _ in range(8):
        at.button(key="spec-btn-step").click().run()
    assert_clean(at)
    session = at.session_state["engine-session:spec"]
    assert len(session.records) == 8
    totals = session.records[-1].extra("spec")["totals"]
    # The copy-edit prompt: the answer repeats the paragraph, so lookup's drafts are mostly accepted.
    assert totals["accepted_tokens"] >= 8 and spec_series(session.records)[-1].tokens_per_pass > 1.5
    at.slider(key="spec-scrub").set_value(1).run()  # step 1: the first decode, a lookup round
    assert_clean(at)
    assert any("from one target pass" in m.value for m in at.markdown)


def test_a_step_without_decodes_is_named_in_the_time_split() -> None:
    """The prefill step has no draft, verify or plain bar: it is labelled, not left to read as 0 ms."""
    from app.analysis.speculative import SpecPoint
    from app.charts.speculative import time_split_figure

    series = [SpecPoint(0, 0, 0, 0, 0, 1, 0.0, 0.0, 0, 0), SpecPoint(1, 1, 4, 3, 1, 4, 0.002, 0.030, 1, 4)]
    labels = [a for a in time_split_figure(series).layout.annotations if a.text == "prefill only"]
    assert [a.x for a in labels] == [0]
