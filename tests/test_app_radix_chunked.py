"""The radix prefix cache and chunked prefill pages under AppTest (load, step, scrub back, compare),
and the record-only analysis behind them (tree layout, hit series, token gaps, worst stall).

Random weights keep the page tests independent of the GGUF; one test per page uses the real model.
"""
from __future__ import annotations

import html
import re

import pytest
from streamlit.testing.v1 import AppTest

from app.analysis.chunked import compare_chunking, step_splits, token_gaps, unchunked_budget, worst_stall
from app.analysis.radix import cache_series, compare_prefix_cache, tidy_layout, tree_graph
from app.charts.radix_tree import BOX_W, CHAR_PX, PLOT_PX, label_width, radix_tree_figure
from app.scenario_library import CHUNKED_PREFILL, RADIX_PREFIX_CACHE, chatml
from app.scenarios import scenario_from_json
from app.session import EngineSession
from tests.apptest_helpers import assert_clean, new_app, open_page, random_app  # noqa: F401 (fixture)

SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}

pytestmark = pytest.mark.slow


def _scenario_index(library, name: str) -> int:  # noqa: ANN001
    return next(i for i, s in enumerate(library) if s.name.startswith(name))


# ---- scenarios -----------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", RADIX_PREFIX_CACHE + CHUNKED_PREFILL, ids=lambda s: s.name)
def test_scenarios_round_trip(scenario) -> None:  # noqa: ANN001
    assert scenario_from_json(scenario.to_json()) == scenario
    scenario.engine_config(**SERVER)


def test_chatml_matches_the_tokenizer_template(random_weights) -> None:  # noqa: ANN001
    tok = random_weights.tokenizer
    assert chatml("hi") == tok.render_chat([{"role": "user", "content": "hi"}])
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert chatml("a", "b", "c") == tok.render_chat(msgs)


# ---- radix: records only -------------------------------------------------------------------------

def _run(scenario, weights, steps: int = 400) -> EngineSession:  # noqa: ANN001
    s = EngineSession.create(scenario, weights, SERVER)
    s.run(steps)
    assert not s.errors, s.errors
    return s


def test_few_shot_hits_and_tree_layout(random_weights) -> None:  # noqa: ANN001
    s = _run(RADIX_PREFIX_CACHE[0], random_weights)
    points = cache_series(s.records)
    last = points[-1]
    assert (last.hits, last.misses) == (3, 1)
    assert last.tokens_saved >= 3 * 128  # the ~150-token shared prefix, whole blocks of 8
    snap = s.records[-1].extra("radix")
    g = tree_graph(snap)
    pos = tidy_layout(g, 0)
    assert set(pos) == set(g.nodes)
    # A tidy tree: children one level below their parent, siblings at distinct x.
    for a, b in g.edges:
        assert pos[b][1] == pos[a][1] - 1
    xs = [pos[n] for n in g.nodes]
    assert len(set(xs)) == len(xs)
    fig = radix_tree_figure(snap, {}, s.records[-1].step)
    assert len(fig.layout.shapes) == g.number_of_nodes()
    _assert_labels_fit(fig)
    # The young tree of the second step (two leaves on a range of at least 3.5 slots): its lines ran past
    # their boxes and into each other at 1280 pixels when the line length counted the leaves alone.
    young = next(r for r in s.records if _leaves(r.extra("radix")) == 2)
    _assert_labels_fit(radix_tree_figure(young.extra("radix"), {}, young.step))


def _leaves(snapshot: dict) -> int:
    g = tree_graph(snapshot)
    return sum(1 for n in g if g.out_degree(n) == 0)


def _assert_labels_fit(fig) -> None:  # noqa: ANN001
    """Node labels at 13 px, and each line of token text inside its box on the narrowest page (1024 pixels,
    sidebar open: the plot width and character width app.charts.radix_tree measured in Chromium): a box is 0.9
    of the x range's slots. Fact lines ("3 blk = 24 tok", "last used at step 12") may take 22 characters."""
    labels = next(t for t in fig.data if t.mode == "markers+text")
    assert labels.textfont.size == 13
    lo, hi = fig.layout.xaxis.range
    box_px = BOX_W / (hi - lo) * PLOT_PX
    for text in labels.text:
        for line in text.split("<br>"):
            visible = html.unescape(re.sub(r"<[^>]+>", "", line))
            limit = box_px if visible.startswith(("“", "…")) else max(box_px, 22 * CHAR_PX)
            assert label_width(visible) * CHAR_PX <= limit, (line, box_px)  # "⏎" counts two


def test_unrelated_prompts_never_hit(random_weights) -> None:  # noqa: ANN001
    s = _run(RADIX_PREFIX_CACHE[_scenario_index(RADIX_PREFIX_CACHE, "Unrelated")], random_weights)
    c = s.records[-1].extra("radix")["counters"]
    assert c["hits"] == 0 and c["misses"] == 4


def test_small_pool_evicts_and_ghosts_are_drawn(random_weights) -> None:  # noqa: ANN001
    s = _run(RADIX_PREFIX_CACHE[_scenario_index(RADIX_PREFIX_CACHE, "Small pool")], random_weights)
    with_ev = [r for r in s.records if r.extra("radix")["evicted_this_step"]]
    assert with_ev, "the 12-block pool must force at least one eviction"
    snap = with_ev[0].extra("radix")
    g = tree_graph(snap)
    ghosts = [n for n, d in g.nodes(data=True) if d["ghost"]]
    assert len(ghosts) == len(snap["evicted_this_step"])
    assert all(g.in_degree(n) == 1 for n in ghosts)
    fig = radix_tree_figure(snap, {}, with_ev[0].step)
    assert "evicted this step" in fig.layout.title.text
    _assert_labels_fit(fig)


def test_multi_turn_reuses_the_conversation(random_weights) -> None:  # noqa: ANN001
    s = _run(RADIX_PREFIX_CACHE[_scenario_index(RADIX_PREFIX_CACHE, "Multi-turn")], random_weights)
    first_chunk = {}
    for r in s.records:
        for b in r.batch:
            if b.phase == "prefill":
                first_chunk.setdefault(b.request_id, b.num_cached_tokens)
    # Random weights: the pre-written answers differ from the model's, so turn 2 hits at least the
    # whole turn-1 prompt (block-aligned); with the real model it reuses the answer too.
    assert first_chunk["A-turn2"] >= 40 and first_chunk["A-turn3"] >= first_chunk["A-turn2"]


def test_cache_on_off_comparison_counts_prefill(random_weights) -> None:  # noqa: ANN001
    runs = compare_prefix_cache(RADIX_PREFIX_CACHE[0], random_weights, SERVER)
    on, off = runs["cache on"], runs["cache off"]
    saved = on.records[-1].extra("radix")["counters"]["tokens_saved"]
    assert off.prefill_tokens - on.prefill_tokens == saved > 0
    assert on.prefill_seconds > 0 and off.prefill_seconds > 0


# ---- chunked: records only -----------------------------------------------------------------------

def test_chunked_budget_gaps_and_stall(random_weights) -> None:  # noqa: ANN001
    scenario = CHUNKED_PREFILL[0]
    runs = compare_chunking(scenario, random_weights, SERVER)
    on, off = runs["chunked"], runs["unchunked"]
    assert not on.errors and not off.errors
    assert on.budget == 64 and off.budget == unchunked_budget(scenario, random_weights) > 290
    assert all(s.prefill_tokens + s.decode_tokens <= 64 for s in step_splits(list(on.records)))
    # Chunked: the long prompt is split over several steps, each also carrying the decodes.
    chunk_steps = [r for r in on.records if any(b.request_id == "long" and b.phase == "prefill" for b in r.batch)]
    assert len(chunk_steps) >= 4 and all(r.num_decode_tokens > 0 for r in chunk_steps[:-1])
    # Prefill-first: one step runs the whole prompt and the decodes stall in it.
    big = [r for r in off.records if any(b.request_id == "long" and b.phase == "prefill" for b in r.batch)]
    assert len(big) == 1 and big[0].num_decode_tokens == 0
    gaps = token_gaps(list(off.records))
    assert {g.request_id for g in gaps} >= {"chat1", "chat2", "chat3"}
    w_off = worst_stall(list(off.records))
    assert w_off is not None and w_off.request_id != "long"
    # The stalled gap spans two steps (the prefill step and the next decode): it is the worst one.
    assert w_off.step == big[0].step + 1


# ---- pages ---------------------------------------------------------------------------------------

def test_radix_page_steps_scrubs_and_compares(random_app: AppTest) -> None:
    at = open_page(random_app, "06_radix_prefix_cache.py")
    assert_clean(at)
    for _ in range(4):
        at.button(key="radix-btn-step").click().run()
        assert_clean(at)
    session = at.session_state["engine-session:radix"]
    assert [r.step for r in session.records] == [0, 1, 2, 3]
    assert len(at.get("plotly_chart")) >= 2
    assert any("hit" in m.label.lower() for m in at.metric)
    at.slider(key="radix-scrub").set_value(0).run()
    assert_clean(at)
    assert len(session.records) == 4 and len(at.get("plotly_chart")) >= 2
    # The small-pool scenario, run to the end: evictions appear and scrubbing to them redraws.
    at.selectbox(key="radix-pick").set_value(RADIX_PREFIX_CACHE[3].name).run()
    at.button(key="radix-btn-end").click().run()
    assert_clean(at)
    session = at.session_state["engine-session:radix"]
    ev_step = next(r.step for r in session.records if r.extra("radix")["evicted_this_step"])
    at.slider(key="radix-scrub").set_value(ev_step).run()
    assert_clean(at)
    assert any("evicted" in m.value for m in at.markdown)
    at.button(key="radix-compare").click().run()
    assert_clean(at)
    assert any(m.label == "Prefill tokens computed" for m in at.metric)


def test_radix_follow_up_turn(random_app: AppTest) -> None:
    at = open_page(random_app, "06_radix_prefix_cache.py")
    at.button(key="radix-btn-end").click().run()
    session = at.session_state["engine-session:radix"]
    n = len(session.records)
    # The newest finished conversation is picked first (the oldest was, so a three-turn chat went on from turn 1).
    picker = at.selectbox(key="radix-follow-id")
    assert picker.value == picker.options[-1]
    follow = f"{picker.value}+1"
    at.button(key="FormSubmitter:radix-follow-form-Send (arrives at step %d)" % n).click().run()
    assert_clean(at)
    assert follow in session.specs
    at.button(key="radix-btn-end").click().run()
    assert_clean(at)
    first = next(b for r in session.records[n:] for b in r.batch if b.request_id == follow)
    assert first.num_cached_tokens >= 150  # prompt + answer of that conversation came from the tree
    # An empty message is a message on the page, not a silent no-op.
    sent = len(session.specs)
    at.text_input(key="radix-follow-msg").set_value("  ")
    at.button(key="FormSubmitter:radix-follow-form-Send (arrives at step %d)" % len(session.records)).click().run()
    assert not at.exception and len(session.specs) == sent
    assert any("next user message is empty" in e.value for e in at.error)


def test_chunked_page_steps_scrubs_and_compares(random_app: AppTest) -> None:
    at = open_page(random_app, "09_chunked_prefill.py")
    assert_clean(at)
    for _ in range(6):
        at.button(key="chunked-btn-step").click().run()
        assert_clean(at)
    session = at.session_state["engine-session:chunked"]
    assert len(session.records) == 6
    assert len(at.get("plotly_chart")) >= 3
    at.slider(key="chunked-scrub").set_value(1).run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) >= 3
    at.button(key="chunked-compare").click().run()
    assert_clean(at)
    assert any(m.label == "Worst stall, prefill-first" for m in at.metric)
    assert len(at.get("plotly_chart")) >= 5
    # Chunked prefill off under the scenario's 64-token budget: the long prompt cannot be prefilled in one step,
    # so the edit is refused with why, and the six steps on screen stay (not traded for a run without it).
    at.checkbox(key="chunked-ed0-cp").uncheck()
    at.button(key="FormSubmitter:chunked-ed0-form-Apply and restart the engine").click().run()
    assert not at.exception
    (error,) = [e.value for e in at.error]
    assert error.startswith("The scenario was not applied, so the run below is the one before. Request long")
    assert "cannot be prefilled in one step" in error and "raise max_num_batched_tokens" in error
    assert session.records is at.session_state["engine-session:chunked"].records and len(session.records) == 6
    assert session.scenario.engine.get("chunked_prefill", True) is True


@pytest.mark.parametrize("page_file,prefix", [("06_radix_prefix_cache.py", "radix"),
                                              ("09_chunked_prefill.py", "chunked")])
def test_pages_with_the_real_model(real_weights, monkeypatch: pytest.MonkeyPatch, page_file: str,  # noqa: ANN001
                                   prefix: str) -> None:
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "real")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    at = open_page(new_app(), page_file)
    assert "SmolLM2-135M-Instruct" in " ".join(c.value for c in at.caption)
    for _ in range(3):
        at.button(key=f"{prefix}-btn-step").click().run()
    assert_clean(at)
    session = at.session_state[f"engine-session:{prefix}"]
    assert len(session.records) == 3
    if prefix == "radix":
        assert session.records[-1].extra("radix")["counters"]["hits"] >= 1  # shot1 arrives at step 2
