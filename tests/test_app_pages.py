"""Every page under Streamlit's AppTest: it loads through the real navigation (app/main.py), steps
the engine, scrubs back, and raises nothing. Random weights (INFERSCOPE_WEIGHTS=random) keep the
tests independent of the GGUF; one test drives the real SmolLM2 weights.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.registry import available_pages
from tests.apptest_helpers import ENGINE_PAGES as ALL_ENGINE_PAGES
from tests.apptest_helpers import (TINY_SCENARIO, assert_clean, new_app, open_page, random_app,  # noqa: F401 (fixture)
                                   session_of, upload_scenario)

# The pages this module steps and scrubs (the others have their own modules).
ENGINE_PAGES = {f: ALL_ENGINE_PAGES[f] for f in ("01_kv_cache.py", "03_paged_attention.py", "04_continuous_batching.py")}


def test_engine_page_table_matches_the_pages() -> None:
    """apptest_helpers.ENGINE_PAGES (which the GPU AppTest steps) names every page with a live engine, by the
    session key prefix the page itself uses."""
    found = {}
    for spec in available_pages():
        text = spec.file.read_text()
        key = re.search(r'^PAGE = "([^"]+)"', text, re.M)
        if "engine_controls(" in text:
            assert key, spec.path
            found[Path(spec.path).name] = key.group(1)
    assert found == ALL_ENGINE_PAGES


def test_home_lists_every_page(random_app: AppTest) -> None:
    at = random_app.run()
    assert_clean(at)
    assert at.title[0].value == "InferScope"
    assert len(at.get("page_link")) == len(available_pages())
    text = " ".join(m.value for m in at.markdown)
    assert "torch reference path on the CPU" in text


@pytest.mark.parametrize("page_file", list(ENGINE_PAGES))
def test_page_steps_and_scrubs(random_app: AppTest, page_file: str) -> None:
    prefix = ENGINE_PAGES[page_file]
    at = open_page(random_app, page_file)
    assert_clean(at)
    for _ in range(3):
        at.button(key=f"{prefix}-btn-step").click().run()
        assert_clean(at)
    session = session_of(at, prefix)
    assert [r.step for r in session.records] == [0, 1, 2]
    assert at.slider(key=f"{prefix}-scrub").value == 2
    charts_live = len(at.get("plotly_chart"))
    assert charts_live >= 2

    # Scrub back: the page redraws step 0 from its record; nothing re-runs.
    at.slider(key=f"{prefix}-scrub").set_value(0).run()
    assert_clean(at)
    assert len(session.records) == 3
    assert len(at.get("plotly_chart")) >= 2

    # Reset: a fresh engine, empty timeline.
    at.button(key=f"{prefix}-btn-reset").click().run()
    assert_clean(at)
    assert session_of(at, prefix).records == []


def test_paged_attention_shows_copy_on_write(random_app: AppTest) -> None:
    at = open_page(random_app, "03_paged_attention.py")
    for _ in range(2):
        at.button(key="paged-btn-step").click().run()
    assert_clean(at)
    # The default scenario samples n = 2 from one prompt: the shared tail block is copied at step 1.
    assert any("Copy-on-write at step 1" in w.value for w in at.warning)
    assert at.metric[2].label.startswith("Shared blocks") and int(at.metric[2].value) >= 1


def test_paged_attention_after_run_to_end_points_at_the_fullest_step(random_app: AppTest) -> None:
    at = open_page(random_app, "03_paged_attention.py")
    at.button(key="paged-btn-end").click().run()
    assert_clean(at)
    records = session_of(at, "paged").records
    assert records[-1].pool.used_blocks == 0  # every request finished and freed its blocks
    peak = max(records, key=lambda r: r.pool.used_blocks)
    hint = [i.value for i in at.info if "fullest at step" in i.value]
    assert hint == [f"Every request has finished and returned its blocks to the free list. The pool was fullest at "
                    f"step {peak.step} ({peak.pool.used_blocks} of {peak.pool.num_blocks} blocks): drag the "
                    "timeline there to see the blocks and tables in use."]
    # Scrubbed to that step, the grid is in use and the hint is gone.
    at.slider(key="paged-scrub").set_value(peak.step).run()
    assert_clean(at)
    assert not any("fullest at step" in i.value for i in at.info)
    assert at.metric[0].value == f"{peak.pool.used_blocks} / {peak.pool.num_blocks}"


def test_kv_cache_after_run_to_end_points_at_the_fullest_step(random_app: AppTest) -> None:
    """The review's case: after Run to end the metrics read 0 tokens and 0 B; the page says where the cache held
    most (by tokens, which the metrics count) instead of leaving a student with zeros."""
    at = open_page(random_app, "01_kv_cache.py")
    at.button(key="kv-btn-end").click().run()
    assert_clean(at)
    records = session_of(at, "kv").records
    peak = max(records, key=lambda r: r.pool.filled_tokens)
    assert records[-1].pool.filled_tokens == 0 < peak.pool.filled_tokens
    (hint,) = [i.value for i in at.info if "held most at step" in i.value]
    assert f"It held most at step {peak.step}: {peak.pool.filled_tokens:,} tokens" in hint
    at.slider(key="kv-scrub").set_value(peak.step).run()
    assert_clean(at)
    assert not any("held most at step" in i.value for i in at.info)
    assert at.metric[0].value == f"{peak.pool.filled_tokens:,}"


def test_paged_charts_of_an_empty_pool_say_so(random_weights) -> None:  # noqa: ANN001
    from app.charts.block_pool import waste_over_time
    from app.charts.block_tables import block_table_grid, mapping_graph
    from app.scenario_library import PAGED_ATTENTION
    from app.session import EngineSession

    s = EngineSession.create(PAGED_ATTENTION[0], random_weights, {"device": "cpu", "dtype": "float32",
                                                                  "weights": "random"})
    s.run(400)
    last = s.records[-1]
    assert not last.block_tables and last.pool.allocated_tokens == 0
    for fig in (block_table_grid(last, s.request_order), mapping_graph(last, s.request_order)):
        assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False  # no bare axes
        assert any("no sequence holds blocks" in a.text or "free list" in a.text for a in fig.layout.annotations)
    # Both panels keep their titles and a subtitle line, so the two titles stand at one height.
    grid, graph = block_table_grid(last, s.request_order), mapping_graph(last, s.request_order)
    assert (grid.layout.title.text, graph.layout.title.text) == ("Block tables", "Logical → physical")
    assert grid.layout.title.subtitle.text
    assert graph.layout.title.subtitle.text == "no sequence holds blocks at this step"
    # Waste with nothing allocated is undefined: a gap in both lines (the metric shows "–"), not a drop to 0 %.
    contig, paged = waste_over_time(s.records).data[:2]
    assert contig.y[-1] is None and paged.y[-1] is None
    assert all(v is not None for v in paged.y[:-1]) and contig.y[0] > 50


def test_play_and_pause_toggle(random_app: AppTest) -> None:
    at = open_page(random_app, "01_kv_cache.py")
    at.button(key="kv-btn-play").click().run()
    assert at.session_state["kv-playing"] is True
    assert at.button(key="kv-btn-pause").disabled is False
    assert at.button(key="kv-btn-step").disabled is True
    at.button(key="kv-btn-pause").click().run()
    assert at.session_state["kv-playing"] is False
    assert_clean(at)


def test_bad_live_request_shows_error_and_keeps_records(random_app: AppTest) -> None:
    at = open_page(random_app, "04_continuous_batching.py")
    at.button(key="cb-btn-step").click().run()
    # 900 tokens do not fit max_model_len = 256 of the default scenario: add_request raises ValueError.
    at.number_input(key="cb-live-mt").set_value(500)
    at.text_input(key="cb-live-prompt").set_value("A request that is far too long")
    at.button(key="FormSubmitter:cb-live-form-Add (arrives at step 1)").click().run()
    assert not at.exception
    assert any("exceeds the context length" in e.value for e in at.error)
    assert len(session_of(at, "cb").records) == 1  # nothing computed was lost
    at.button(key="cb-btn-step").click().run()
    assert len(session_of(at, "cb").records) == 2  # and the engine keeps going


def test_malformed_scenario_upload_is_a_message(random_app: AppTest) -> None:
    at = open_page(random_app, "03_paged_attention.py")
    at.button(key="paged-btn-step").click().run()
    upload_scenario(at, "paged", b'{"requests": [ {"prompt": 1} ', "broken.json")
    assert not at.exception
    assert any("not valid JSON" in e.value for e in at.error)
    assert len(session_of(at, "paged").records) == 1

    upload_scenario(at, "paged", json.dumps(TINY_SCENARIO).encode(), "good.json")
    assert_clean(at)
    session = session_of(at, "paged")
    assert session.scenario.name == "Tiny" and session.records == []
    assert session.engine.config.block_size == 4


def test_scenario_picker_loads_another_scenario(random_app: AppTest) -> None:
    at = open_page(random_app, "04_continuous_batching.py")
    at.selectbox(key="cb-pick").set_value("Small KV pool: preemption").run()
    assert_clean(at)
    session = session_of(at, "cb")
    assert session.engine.config.num_blocks == 14 and len(session.request_order) == 3


def test_presentation_mode(random_app: AppTest) -> None:
    at = random_app.run()
    at.toggle(key="presentation").set_value(True).run()
    assert_clean(at)
    assert at.button(key="presentation-exit")
    at.button(key="presentation-exit").click().run()
    assert at.session_state["presentation"] is False


def test_kv_page_with_the_real_model(real_weights, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The real SmolLM2: two steps on the KV cache page produce real text and a growing cache."""
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "real")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    at = open_page(new_app(), "01_kv_cache.py")
    assert "SmolLM2-135M-Instruct" in " ".join(c.value for c in at.caption)
    at.button(key="kv-btn-step").click().run()
    at.button(key="kv-btn-step").click().run()
    assert_clean(at)
    session = session_of(at, "kv")
    first, second = session.records
    assert second.pool.filled_tokens == first.pool.filled_tokens + 1  # one token per decode step
    assert session.records[-1].requests[0].text.strip()


def test_request_table_ttft_is_a_number_that_sorts(random_app: AppTest) -> None:
    """TTFT in the request table is milliseconds as a number (sorts by value), empty before the first token."""
    at = open_page(random_app, "04_continuous_batching.py")
    for _ in range(2):
        at.button(key="cb-btn-step").click().run()
    assert_clean(at)
    table = next(d for d in at.dataframe if "text so far" in d.value.columns)
    frame = table.value
    assert pd.api.types.is_float_dtype(frame["TTFT"])
    record = session_of(at, "cb").records[-1]
    for q, ttft in zip(record.requests, frame["TTFT"]):
        if q.ttft_seconds >= 0:
            assert ttft == pytest.approx(q.ttft_seconds * 1e3)
        else:
            assert pd.isna(ttft)
    assert frame["TTFT"].notna().any() and frame["TTFT"].isna().any()  # one has its first token, one waits


def test_request_editor_pins_name_and_prompt(random_app: AppTest) -> None:
    """Twelve request fields scroll sideways at 1280 pixels: the name and prompt stay pinned beside the
    sampling fields, so a row's temperature is never read without its prompt."""
    at = open_page(random_app, "04_continuous_batching.py")
    editor = next(d for d in at.dataframe if "prompt" in d.value.columns and d.proto.editing_mode)
    config = json.loads(editor.proto.columns)
    assert {c for c, v in config.items() if v.get("pinned")} == {"request_id", "prompt"}


def test_a_half_full_blocks_number_gets_a_halo(tiny_weights) -> None:  # noqa: ANN001
    """A number across a tile's fill line had white ink, half of it on the pale empty part: unreadable."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    from app.charts.block_pool import block_pool_grid
    from app.charts.colors import HALO, INK

    engine = LLMEngine(EngineConfig(weights="random", num_blocks=8, block_size=8), tiny_weights)
    engine.add_request(list(range(100, 112)), SamplingParams(max_tokens=4, ignore_eos=True))  # blocks 8/8 and 4/8
    record = engine.step()
    texts = [t for t in block_pool_grid(record, ["req-0"]).data if t.mode == "text"]
    plain, halo = texts
    assert list(halo.text) == ["1"] and halo.textfont.color == INK and halo.textfont.shadow == HALO
    assert len(plain.text) == 7 and "1" not in plain.text
