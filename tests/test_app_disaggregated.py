"""The disaggregated prefill/decode page under AppTest (random weights, CPU): it steps the two-worker
engine, scrubs back, keeps its records through bad input, and on the small-pool scenario shows handoffs
waiting for room and runs the three-way comparison (same tokens every way)."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from engine.config import EngineConfig
from engine.disaggregated import ClusterStepRecord
from engine.disaggregated.side_by_side import RequestInput
from engine.sampling_params import SamplingParams

from app.analysis.disaggregated import unchunked_config
from tests.apptest_helpers import assert_clean, open_page, random_app, session_of, upload_scenario  # noqa: F401

PAGE, PREFIX = "10_disaggregated.py", "disagg"


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_page_steps_scrubs_and_resets(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    assert_clean(at)
    for _ in range(6):
        at.button(key=f"{PREFIX}-btn-step").click().run()
        assert_clean(at)
    session = session_of(at, PREFIX)
    assert [r.step for r in session.records] == list(range(6))
    assert all(isinstance(r, ClusterStepRecord) for r in session.records)
    metrics = _metrics(at)
    assert metrics["Still decoding"] == "3" and metrics["Prefill on decode"] == "0" and metrics["KV in flight"] == "0"
    # The timeline, both pools and the first-moments chart.
    assert len(at.get("plotly_chart")) >= 4
    text = " ".join(m.value for m in at.markdown)
    assert "decode worker: step" in text
    at.slider(key=f"{PREFIX}-scrub").set_value(0).run()
    assert_clean(at)
    assert len(session.records) == 6
    # At tick 0 only the three chats have arrived (the long prompt comes at tick 4): none is still prefilling.
    here = [q for q in session.records[0].requests if q.arrival_time >= 0]
    assert _metrics(at)["Prefilling"] == str(sum(q.stage in ("waiting", "prefill") for q in here))
    assert len(here) < len(session.records[0].requests)
    at.button(key=f"{PREFIX}-btn-reset").click().run()
    assert_clean(at)
    assert session_of(at, PREFIX).records == []


def test_bad_input_is_a_message_and_keeps_the_records(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    at.button(key=f"{PREFIX}-btn-step").click().run()
    # The form offers one sample a request, all this engine serves (it offered 8, then refused n = 2).
    n = at.number_input(key=f"{PREFIX}-live-n")
    assert n.max == 1 and n.disabled
    at.text_input(key=f"{PREFIX}-live-prompt").set_value("   ")
    at.button(key=f"FormSubmitter:{PREFIX}-live-form-Add (arrives at step 1)").click().run()
    assert not at.exception
    assert any("the prompt must not be empty" in e.value for e in at.error)
    assert len(session_of(at, PREFIX).records) == 1
    # A scenario with speculative decoding is refused by the two-worker engine; the old one keeps running.
    bad = {"name": "spec", "engine": {"spec_drafter": "ngram"}, "requests": [{"prompt": "Hi", "max_tokens": 3}]}
    upload_scenario(at, PREFIX, json.dumps(bad).encode(), "spec.json")
    assert not at.exception
    assert any("speculative decoding" in e.value for e in at.error)
    assert len(session_of(at, PREFIX).records) == 1
    at.button(key=f"{PREFIX}-btn-step").click().run()
    assert len(session_of(at, PREFIX).records) == 2


def test_small_decode_pool_scenario_shows_handoffs_waiting(random_app: AppTest) -> None:
    at = open_page(random_app, PAGE)
    at.selectbox(key=f"{PREFIX}-pick").set_value("A small decode pool: handoffs wait for room").run()
    assert_clean(at)
    at.button(key=f"{PREFIX}-btn-end").click().run()
    assert_clean(at)
    records = session_of(at, PREFIX).records
    assert max(len(r.in_flight) for r in records) >= 2
    waited = [h.taken_at - h.sent_at for r in records for h in r.taken]
    assert len(waited) == 5 and max(waited) > 0
    assert all(q.stage == "finished" for q in records[-1].requests)
    # They waited for room, not for a recompute: the decode worker never preempted one.
    assert session_of(at, PREFIX).engine.decode.counters["prefill_tokens_computed"] == 0
    # The three ways of serving this (short) scenario: the same tokens every way.
    at.button(key="disagg-compare").click().run()
    assert_clean(at)
    metrics = _metrics(at)
    assert metrics["Same tokens all three ways"] == "yes"
    assert {"Worst stall: colocated", "Worst stall: chunked", "Worst stall: disaggregated"} <= set(metrics)
    assert len(at.get("plotly_chart")) >= 6  # + the time-between-tokens panels and the TTFT bars


def test_the_colocated_baseline_prefills_each_prompt_in_one_step(random_weights) -> None:  # noqa: ANN001
    """The scenario's engine chunks by default, so under a 64-token budget "colocated" and "chunked" were one run:
    the baseline turns chunking off and raises the budget to the longest request, never lowers it."""
    inputs = [RequestInput("long", "word " * 100, SamplingParams(max_tokens=8)),
              RequestInput("short", "Hi", SamplingParams(max_tokens=4))]
    need = len(random_weights.tokenizer.encode("word " * 100)) + 8
    small = unchunked_config(EngineConfig(max_num_batched_tokens=64, chunked_prefill=True), inputs, random_weights)
    assert not small.chunked_prefill and small.max_num_batched_tokens == need > 64
    big = unchunked_config(EngineConfig(max_num_batched_tokens=512), inputs, random_weights)
    assert not big.chunked_prefill and big.max_num_batched_tokens == 512
