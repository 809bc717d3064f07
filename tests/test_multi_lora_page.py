"""The multi-LoRA page: registered; its analysis of step records (rows packed fresh-first, waits, slot
events); the comparison gives every request the same greedy tokens in mixed batches as in its own merged
deployment; and the page under AppTest (random weights, CPU) with every section, a bad scenario as a
message, and steps that keep running."""
from __future__ import annotations

import json

import pytest

import app.analysis.multi_lora as ml
from app.analysis.multi_lora import (compare_deployments, row_segments, slot_history, summarize, waiting_steps)
from app.charts.multi_lora import LOAD_LINE_GAP, adapter_timeline, batch_rows_figure, comparison_figure, slots_figure
from app.formatting import literal_markdown
from app.registry import PAGES
from app.scenario_library import MULTI_LORA
from app.scenarios import RequestSpec, Scenario, scenario_from_json
from app.session import EngineSession
from engine.lora import random_adapter
from tests.apptest_helpers import assert_clean, open_page, random_app, session_of, upload_scenario  # noqa: F401

PAGE, PREFIX = "17_multi_lora.py", "ml"
SERVER = {"device": "cpu", "dtype": "float32"}


def test_page_is_registered_and_the_adapters_ship() -> None:
    spec = next(p for p in PAGES if p.url_path == "multi-lora")
    assert spec.available and spec.section == "Serving post-trained models"
    assert set(ml.bundled()) == {"pirate", "terse", "bullets"}
    for a in ml.bundled().values():
        assert a.description and a.meta  # what it learned and how it was trained


@pytest.fixture()
def tiny_adapters(tiny_weights, monkeypatch):  # noqa: ANN001, ANN201
    cfg = tiny_weights.config
    adapters = {"pirate": random_adapter(cfg, "pirate", 4, seed=1, std=0.5),
                "terse": random_adapter(cfg, "terse", 2, targets=("q", "v"), seed=2, std=0.5)}
    monkeypatch.setattr(ml, "bundled", lambda: adapters)
    return adapters


def small_scenario(max_loras: int) -> Scenario:
    return Scenario("small", (
        RequestSpec("The cat sat", max_tokens=6, ignore_eos=True, chat=False, adapter="pirate"),
        RequestSpec("Numbers 1 2 3", max_tokens=8, ignore_eos=True, chat=False, adapter="terse"),
        RequestSpec("Hello there", max_tokens=5, ignore_eos=True, chat=False),
        RequestSpec("Once upon", max_tokens=6, ignore_eos=True, chat=False, adapter="pirate", arrival_step=1)),
        {"block_size": 4, "num_blocks": 64, "max_model_len": 64, "max_loras": max_loras, "max_lora_rank": 4})


def test_step_views_of_a_one_slot_run(tiny_weights, tiny_adapters) -> None:  # noqa: ANN001
    session = EngineSession.create(small_scenario(1), tiny_weights, SERVER, engine_factory=ml.lora_engine)
    session.run(100)
    assert not session.errors and not session.has_work
    adapter_for = lambda label: ml.adapter_of(session, label)  # noqa: E731
    first = row_segments(session.records[0], adapter_for)
    assert [s.start for s in first] == [0] + [sum(x.rows for x in first[:i]) for i in range(1, len(first))]
    assert {s.adapter for s in first} <= {"pirate", "terse", ml.BASE}
    waits = waiting_steps(session.records)
    assert waits  # one slot: one adapter's requests waited for the other's
    events = slot_history(session.records)
    assert [e["kind"] for e in events][:1] == ["load"] and any(e["kind"] == "evict" for e in events)
    names = ["pirate", "terse"]
    fig = batch_rows_figure(first, names)
    assert sum(b.x[0] for b in fig.data[1:]) == sum(s.rows for s in first)
    assert slots_figure(session.records[0], names).layout.shapes
    timeline = adapter_timeline(session.records, session.request_order, adapter_for, waits, events, names)
    assert any(t.name == "waiting for a slot" for t in timeline.data)
    # Two loads in one step are two dashed lines, side by side.
    both = [{"kind": "load", "step": 0, "adapter": "pirate", "slot": 0},
            {"kind": "load", "step": 0, "adapter": "terse", "slot": 1}]
    lines = adapter_timeline(session.records, session.request_order, adapter_for, waits, both, names).layout.shapes
    assert sorted(x.x0 for x in lines) == pytest.approx([-0.5 - LOAD_LINE_GAP / 2, -0.5 + LOAD_LINE_GAP / 2])


def test_mixed_batches_and_merged_deployments_write_the_same_tokens(tiny_weights, tiny_adapters) -> None:  # noqa: ANN001
    runs = compare_deployments(small_scenario(2), tiny_weights, SERVER)
    (mixed,) = runs["multi-LoRA"]
    per = runs["one merged deployment per fine-tune"]
    assert [r.name for r in per] == ["pirate", "terse", ml.BASE]

    def tokens(run) -> dict[str, list[int]]:  # noqa: ANN001
        out: dict[str, list[int]] = {}
        for r in run.records:
            for e in r.emitted:
                out.setdefault(e.request_id, []).append(e.token_id)
        return out

    mixed_tokens = tokens(mixed)
    adapters_of = [r.adapter for r in small_scenario(2).requests]
    for run in per:
        mine = [f"r{i}" for i, a in enumerate(adapters_of) if (a or ml.BASE) == run.name]
        # The merged deployment names its requests r0, r1, ... in its own order.
        assert list(tokens(run).values()) == [mixed_tokens[label] for label in mine]
    a, b = summarize("multi-LoRA", [mixed]), summarize("merged", per)
    assert a.output_tokens == b.output_tokens == 6 + 8 + 5 + 6
    assert a.forward_passes < b.forward_passes  # mixed batches need fewer passes for the same queue
    assert b.weights_bytes > a.weights_bytes  # three checkpoints vs one plus two adapters
    fig = comparison_figure([a, b])
    assert len(fig.data) == 6 and sum(bool(t.showlegend) for t in fig.data) == 2  # 3 panels x 2 set-ups
    # Whole passes; times to three figures, trailing zeros kept ("7" beside "4.58" read as a count).
    from app.analysis.multi_lora import ComparisonSummary
    fig = comparison_figure([ComparisonSummary("x", 135, 7.0, 10, 1.0, 10.3, 1),
                             ComparisonSummary("y", 55, 17.04, 10, 1.0, 4.58, 1)])
    assert [t.text[0] for t in fig.data] == ["135", "55", "7.00", "17.0", "10.3", "4.58"]


def test_scenarios_with_adapters_round_trip_and_refuse_bad_ones() -> None:
    s = MULTI_LORA[0]
    again = scenario_from_json(s.to_json())
    assert [r.adapter for r in again.requests] == [r.adapter for r in s.requests]
    assert again.engine["max_loras"] == 2
    bad = {"requests": [{"prompt": "hi", "adapter": 3}]}
    with pytest.raises(ValueError, match="adapter"):
        scenario_from_json(json.dumps(bad))
    with pytest.raises(ValueError, match="max_loras"):
        scenario_from_json(json.dumps({"engine": {"max_loras": 99}, "requests": [{"prompt": "hi"}]}))


def test_page_under_apptest(random_app) -> None:  # noqa: ANN001
    at = open_page(random_app, PAGE)
    assert_clean(at)
    for _ in range(3):
        at.button(key=f"{PREFIX}-btn-step").click().run()
    assert_clean(at)
    session = session_of(at, PREFIX)
    assert len(session.records) == 3
    assert any("Adapters in the batch" in m.label for m in at.metric)
    # Every request's answer so far, whole, in a static table (a grid cut long answers at its edge).
    answers = next(t.value for t in at.table if "answer so far" in t.value.columns)
    assert list(answers.index) == [q.request_id for q in session.records[-1].requests]
    assert all(text == literal_markdown(q.text)
               for text, q in zip(answers["answer so far"], session.records[-1].requests))
    # A scenario naming an adapter the engine does not have: a message, and the run on screen stays and goes on
    # (not traded for the scenario without that request); the corrected file then runs.
    data = {"name": "Unknown adapter", "engine": {"max_loras": 1, "max_lora_rank": 8},
            "requests": [{"prompt": "Hi", "max_tokens": 3, "adapter": "nope"},
                         {"prompt": "Hello", "max_tokens": 3, "adapter": "pirate"}]}
    before = session.scenario.name
    upload_scenario(at, PREFIX, json.dumps(data).encode())
    assert not at.exception
    assert any("not applied" in e.value and "not registered" in e.value for e in at.error)
    at.button(key=f"{PREFIX}-btn-step").click().run()
    assert not at.exception and len(session_of(at, PREFIX).records) == 4
    assert session_of(at, PREFIX).scenario.name == before != "Unknown adapter"
    data["requests"] = data["requests"][1:]
    upload_scenario(at, PREFIX, json.dumps(data).encode(), "fixed.json")
    at.button(key=f"{PREFIX}-btn-step").click().run()
    assert not at.exception and len(session_of(at, PREFIX).records) == 1
    assert session_of(at, PREFIX).scenario.name == "Unknown adapter"
