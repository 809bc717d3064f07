"""The app's engine session and the facts it derives from StepRecords, on small real runs
(random weights: the same code path and shapes as the real model, no GGUF needed)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.analysis.cache_timing import measure_cache_vs_recompute
from app.analysis.kv_math import attention_variants, kv_bytes_per_token, kv_cache_bytes
from app.analysis.policy_compare import compare_policies
from app.analysis.trace_metrics import cow_events, gantt_segments, request_latencies, status_at, throughput
from app.scenarios import RequestSpec, Scenario
from app.session import EngineSession

SERVER = {"device": "cpu", "dtype": "float32", "weights": "random"}


def tiny(requests: list[RequestSpec], **engine) -> Scenario:  # noqa: ANN003
    return Scenario("tiny", tuple(requests), {"block_size": 4, "num_blocks": 32, "max_model_len": 128, **engine})


def test_kv_formula_for_smollm2(random_weights) -> None:  # noqa: ANN001
    cfg = random_weights.config
    assert kv_bytes_per_token(cfg, 4) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert [v.kv_heads for v in attention_variants(cfg)] == [9, 3, 1, None]
    assert kv_cache_bytes(cfg, 2, 8192, 8, kv_heads=9) == 2 * 30 * 9 * 64 * 2 * 8192 * 8


def test_session_keeps_records_through_errors(random_weights) -> None:  # noqa: ANN001
    s = EngineSession.create(tiny([RequestSpec("Hi", max_tokens=3, chat=False)]), random_weights, SERVER)
    s.step()
    assert s.add_live_request(RequestSpec("x", max_tokens=500, chat=False)) is None
    assert "exceeds the context length" in s.errors[-1].message
    bad = tiny([RequestSpec("Hi")], block_size=0)
    assert s.reset(bad) is False and "block_size" in s.errors[-1].message
    assert len(s.records) == 1 and s.engine is not None  # nothing computed was lost
    assert s.run(10) == 2 and not s.has_work and s.step() is None


def test_a_scenario_with_a_request_that_does_not_fit_keeps_the_run(random_weights) -> None:  # noqa: ANN001
    """The new scenario's engine refuses one of its requests (the pool is too small for it): the old run, its
    engine and its requests stay, and the message says the scenario was not applied and why."""
    s = EngineSession.create(tiny([RequestSpec("Hi", max_tokens=3, chat=False)]), random_weights, SERVER)
    s.step()
    engine, records = s.engine, list(s.records)
    small_pool = tiny([RequestSpec("Hi", max_tokens=3, chat=False),
                       RequestSpec("word " * 20, max_tokens=8, chat=False)], num_blocks=2)
    assert s.reset(small_pool) is False
    assert s.engine is engine and s.records == records and s.request_order == ["r0"] and s.scenario.name == "tiny"
    assert s.scenario.engine["num_blocks"] == 32
    (error,) = s.errors
    assert error.message.startswith("The scenario was not applied, so the run below is the one before. Request")
    assert "more KV blocks than the whole pool" in error.message and "raise num_blocks" in error.message
    assert s.run(10) == 2 and not s.has_work  # and the old run goes on
    # Restarting the current scenario, or one whose requests all fit, still starts afresh.
    assert s.reset() is True and s.records == [] and s.request_order == ["r0"]
    assert s.reset(tiny([RequestSpec("Bye", max_tokens=2, chat=False)], num_blocks=8)) is True
    assert s.scenario.engine["num_blocks"] == 8 and not s.errors


def test_cow_and_gantt_from_records(random_weights) -> None:  # noqa: ANN001
    sc = tiny([RequestSpec("One two three four five six", chat=False, max_tokens=4, temperature=0.9, seed=1, n=2,
                           ignore_eos=True),
               RequestSpec("Later", chat=False, max_tokens=2, arrival_step=2, ignore_eos=True)])
    s = EngineSession.create(sc, random_weights, SERVER)
    s.run(20)
    events = cow_events(s.records)
    assert len(events) == 1 and events[0].step == 1  # the shared, partly filled tail block is copied once
    assert s.records[0].pool.ref_counts[events[0].shared_block] == 2
    assert status_at(s.records[0], "r0#0") == "prefill"
    assert status_at(s.records[1], "r0#0") == "decode"
    assert status_at(s.records[0], "r1") == "not arrived"
    segs = {(g.request_id, g.status) for g in gantt_segments(s.records)}
    assert {("r1", "prefill"), ("r1", "decode"), ("r0#1", "prefill"), ("r0#1", "decode")} <= segs
    lat = {x.request_id: x for x in request_latencies(s.records)}
    assert lat["r1"].arrival_step == 2 and lat["r1"].output_tokens == 2 and lat["r1"].e2e_s > 0


def test_preemption_shows_in_the_gantt(random_weights) -> None:  # noqa: ANN001
    reqs = [RequestSpec(f"Request number {i} says hello", chat=False, max_tokens=10, ignore_eos=True) for i in range(3)]
    s = EngineSession.create(tiny(reqs, num_blocks=8), random_weights, SERVER)
    s.run(200)
    assert not s.has_work and not s.errors
    assert any(r.preempted for r in s.records)
    assert any(g.status == "preempted" for g in gantt_segments(s.records))


def test_static_vs_continuous(random_weights) -> None:  # noqa: ANN001
    reqs = [RequestSpec("Long one", chat=False, max_tokens=6, ignore_eos=True),
            RequestSpec("Short", chat=False, max_tokens=1, ignore_eos=True),
            RequestSpec("Late", chat=False, max_tokens=1, arrival_step=1, ignore_eos=True)]
    runs = compare_policies(tiny(reqs), random_weights, SERVER)
    static, cont = runs["static"].records, runs["continuous"].records
    assert len(cont) < len(static)  # the late request joins the running batch instead of waiting for it
    assert sum(len(r.emitted) for r in static) == sum(len(r.emitted) for r in cont) == 8
    assert throughput(cont) > 0 and throughput(static) > 0


def test_cache_vs_recompute_same_tokens(random_weights) -> None:  # noqa: ANN001
    t = measure_cache_vs_recompute(random_weights, SERVER, "The quick brown fox", num_tokens=4)
    assert t.same_tokens
    assert t.with_cache_tokens == (t.prompt_len, 1, 1, 1)
    assert t.without_cache_tokens == tuple(t.prompt_len + i for i in range(4))
    assert t.context_lens == t.without_cache_tokens
    assert len(t.with_cache_ms) == len(t.without_cache_ms) == 4


@pytest.mark.parametrize("n", [1, 16, 64])
def test_step_ticks_are_integers(n: int) -> None:
    from app.charts.axes import step_ticks
    ticks = step_ticks(n)
    assert isinstance(ticks["dtick"], int) and ticks["dtick"] >= 1


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_nice_at_least_is_the_next_one_two_five(x: float) -> None:
    from app.charts.axes import nice_at_least
    n = nice_at_least(x)
    mantissa = n / 10 ** math.floor(math.log10(n) + 1e-9)
    assert n >= x * (1 - 1e-9) and round(mantissa, 6) in (1, 2, 5)
    assert n < 2.5 * x * (1 + 1e-9)  # never more than one 1-2-5 step above


@given(st.floats(min_value=1e-2, max_value=1e6, allow_nan=False), st.floats(min_value=1.5, max_value=10 ** 2.5))
def test_a_short_log_axis_gets_at_least_two_round_ticks(lo: float, span: float) -> None:
    """The eviction chart's axis (2,800 to 19,000 KiB) once had the single tick 10000."""
    from app.charts.axes import one_two_five_ticks
    ticks = one_two_five_ticks(lo, lo * span)
    if span >= 4:  # consecutive 1-2-3-5 values are at most 2x apart, so two of them fit in any 4x span
        assert ticks
    if ticks:
        vals = ticks["tickvals"]
        assert all(lo * (1 - 1e-9) <= v <= lo * span * (1 + 1e-9) for v in vals) and vals == sorted(vals)
        assert len(vals) >= 2 and len(ticks["ticktext"]) == len(vals)
    assert one_two_five_ticks(lo, lo * 10 ** 2.6) == {}  # wider: one tick per decade, as log_axis has


@given(st.floats(min_value=1e-2, max_value=1e6, allow_nan=False))
def test_ticks_up_to_are_two_or_three_round_ones_below_the_top(top: float) -> None:
    """A worst stall of 464 ms once got the single tick 0 (a step of 500)."""
    from app.charts.axes import nice_at_least, ticks_up_to
    ticks = ticks_up_to(top)
    assert ticks[0] == 0 and 2 <= len(ticks) <= 3 and ticks[-1] <= top
    assert nice_at_least(ticks[1]) == ticks[1] and all(t == ticks[1] * i for i, t in enumerate(ticks))


def test_decade_ticks_write_small_powers_as_powers_and_an_exact_zero_as_0() -> None:
    from app.charts.axes import decade_ticks
    t = decade_ticks(3e-7, 5, zero_at=1e-6)
    assert t["tickvals"] == pytest.approx([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0])
    assert t["ticktext"] == ["0", "10⁻⁵", "10⁻⁴", "0.001", "0.01", "0.1", "1"]
    assert decade_ticks(20, 30000)["ticktext"] == ["100", "1000", "10⁴"]
