"""Decoding in parallel on the roofline (app/analysis/parallel_decoding.py): a pass over K rows costs about one
decode step while it is memory-bound, so K / T tokens per pass is nearly a K / T speedup there and fades past the
ridge; one token per pass never beats autoregressive decoding; the chart and the roofline page's section."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from kernels.ceilings import REFERENCE_CEILINGS, Ceilings

from app.analysis.parallel_decoding import (MEASURE_CONTEXT_MAX, TOKENS_PER_PASS, MeasuredPass,
                                            autoregressive_tokens_per_s, block_pass, compute_bound_block, estimate,
                                            measure_passes, measured_speedup, parallel_tokens_per_s)
from app.analysis.pass_timing import PassTiming
from app.charts.parallel_decoding import parallel_decoding_chart

CFG = ModelConfig()
H200 = REFERENCE_CEILINGS["NVIDIA H200"].ceilings
CPU_LIKE = Ceilings(75e9, 14e9, "a 2-core CPU", "float32")  # ridge ~5 FLOP/B, like this project's CI machine


def test_memory_bound_blocks_give_nearly_tokens_per_pass_times_the_speed() -> None:
    for r in TOKENS_PER_PASS:
        e = estimate(CFG, H200, 16, r, 1024, 2)
        assert e.pass_bound == "memory-bound" and e.speedup == pytest.approx(r, rel=0.05), e
        assert e.passes * r == 16 and e.tokens_per_pass == r


def test_past_the_ridge_every_row_costs_time() -> None:
    turn = compute_bound_block(CFG, H200, 1024, 2)
    assert turn is not None and 100 < turn < 1000  # bf16 linears reach a ridge of ~185 FLOP/B near 200 rows
    assert block_pass(CFG, turn, 1024, 2).intensity >= H200.ridge > block_pass(CFG, turn - 1, 1024, 2).intensity
    far = 8 * turn
    assert block_pass(CFG, 2 * far, 1024, 2).seconds(H200) > 1.8 * block_pass(CFG, far, 1024, 2).seconds(H200)
    # On a CPU's low ridge the same block that is nearly free on a GPU is slower than decoding token by token.
    assert (compute_bound_block(CFG, CPU_LIKE, 1024, 4) or 0) < 32
    assert estimate(CFG, CPU_LIKE, 256, 4, 1024, 4).speedup < 1 < estimate(CFG, H200, 256, 4, 1024, 2).speedup


@settings(max_examples=60, deadline=None)
@given(flops=st.floats(1e10, 1e16), bandwidth=st.floats(1e9, 1e13), context=st.integers(0, 8192),
       elem=st.sampled_from([2, 4]), blocks=st.lists(st.integers(1, 4096), min_size=2, max_size=2, unique=True))
def test_one_token_per_pass_never_beats_autoregressive_and_longer_blocks_are_never_faster(
        flops: float, bandwidth: float, context: int, elem: int, blocks: list[int]) -> None:
    c = Ceilings(flops, bandwidth, "hypothesis", "x")
    short, long = sorted(blocks)
    assert parallel_tokens_per_s(CFG, c, long, 1, context, elem) <= autoregressive_tokens_per_s(CFG, c, context, elem)
    assert parallel_tokens_per_s(CFG, c, long, 1, context, elem) <= parallel_tokens_per_s(CFG, c, short, 1, context,
                                                                                            elem)


@pytest.mark.parametrize("per_pass", [0, 17])
def test_tokens_per_pass_must_fit_the_block(per_pass: int) -> None:
    with pytest.raises(ValueError, match="between 1 and the block length"):
        estimate(CFG, H200, 16, per_pass, 0, 2)


def test_chart_marks_the_choice_and_where_passes_turn_compute_bound() -> None:
    fig = parallel_decoding_chart(CFG, 2, H200, 1024, 64, 4)
    names = [t.name for t in fig.data]
    assert names[0].startswith("autoregressive") and len(fig.data) == 2 + len(TOKENS_PER_PASS)
    for r, trace in zip(TOKENS_PER_PASS, fig.data[1:]):
        assert trace.x[0] == r  # a block holds at least the tokens one pass keeps
    marker = fig.data[-1]
    assert marker.x == (64,) and marker.y[0] == pytest.approx(estimate(CFG, H200, 64, 4, 1024, 2).tokens_per_s)
    turn = compute_bound_block(CFG, H200, 1024, 2)
    assert [s.x0 for s in fig.layout.shapes] == [turn]
    assert any(f"compute-bound from {turn} rows" in a.text for a in fig.layout.annotations)


def test_measured_passes_time_the_real_forward_over_each_row_count(tiny_weights) -> None:  # noqa: ANN001
    engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", num_blocks=16, block_size=16, max_model_len=4096),
                       tiny_weights)
    before = engine.pool_summary()
    passes = measure_passes(engine, 48, rows=(1, 4, 16), repeats=2)
    assert [p.rows for p in passes] == [1, 4, 16] and all(p.context == 48 and p.seconds > 0 for p in passes)
    assert all(p.timing is PassTiming.EAGER for p in passes)  # a CPU's passes: eager (app/analysis/pass_timing.py)
    assert engine.pool_summary() == before and not engine.has_work()  # a scratch pool: the engine's is untouched
    # A long calculator context is cut to what a CPU prefills in seconds, and to the positions the engine has.
    assert measure_passes(engine, 10 ** 6, rows=(1,), repeats=1)[0].context == MEASURE_CONTEXT_MAX
    short = LLMEngine(EngineConfig(device="cpu", dtype="float32", num_blocks=16, block_size=16, max_model_len=256),
                      tiny_weights)
    assert measure_passes(short, 1024, rows=(1, 16), repeats=1)[0].context == 240
    with pytest.raises(ValueError, match="do not fit this engine's 256 positions"):
        measure_passes(short, 1024, rows=(1, 512), repeats=1)


def test_measured_speedup_needs_both_passes_timed() -> None:
    passes = [MeasuredPass(1, 128, 0.010), MeasuredPass(16, 128, 0.020)]
    assert measured_speedup(passes, 16, 4) == pytest.approx(2.0)  # 4 tokens for twice the time of one
    assert measured_speedup(passes, 64, 4) is None and measured_speedup(passes[1:], 16, 4) is None


def test_chart_draws_the_measured_passes_for_the_chosen_tokens_per_pass() -> None:
    passes = [MeasuredPass(r, 128, 0.01 * max(1, r / 4)) for r in (1, 4, 8, 16)]  # memory-bound up to 4 rows
    fig = parallel_decoding_chart(CFG, 4, CPU_LIKE, 128, 16, 4, passes)
    ar, kept = fig.data[-2], fig.data[-1]
    assert ar.name == "measured: autoregressive" and ar.y[0] == pytest.approx(100)
    assert kept.x == (4, 8, 16) and kept.y == pytest.approx((400, 200, 100))  # rows below 4 cannot keep 4 tokens
