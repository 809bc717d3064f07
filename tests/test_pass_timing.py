"""Timing one forward pass of the live model (app/analysis/pass_timing.py): eager on the wall clock on a CPU,
replayed from a CUDA graph on a GPU, where an eager pass would time Python's kernel launches instead."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.forward_batch import build_forward_batch
from engine.kv_pool import KVPool

from app.analysis.parallel_decoding import MEASURED_ROWS, measure_passes
from app.analysis.pass_timing import PassTiming, pass_timers, timing_note
from app.analysis.tree_spec import VerifyCost, cost_caption


def _engine_and_batches(weights, device: str, dtype: str, context: int = 64):  # noqa: ANN001, ANN202
    engine = LLMEngine(EngineConfig(device=device, dtype=dtype, num_blocks=16, block_size=16, max_model_len=1024),
                       weights)
    cfg, bs = engine.model_config, engine.config.block_size
    blocks = (context + 16 + bs - 1) // bs
    pool = KVPool(cfg, blocks, bs, engine.dtype, engine.device, head_major=engine.pool.head_major)
    table = list(range(blocks))
    ctx = list(range(10, 10 + context))
    with torch.inference_mode():
        engine.model.forward(build_forward_batch([(ctx, 0, list(range(context)))], [], [], engine.device), pool)
    batches = [build_forward_batch([], [(list(range(20, 20 + rows)), context, list(range(context, context + rows)),
                                         table)], list(range(rows)), engine.device) for rows in (1, 8)]
    return engine, batches, pool


def test_cpu_passes_are_timed_eagerly(tiny_weights) -> None:  # noqa: ANN001
    engine, batches, pool = _engine_and_batches(tiny_weights, "cpu", "float32")
    with torch.inference_mode():
        timers, timing = pass_timers(engine, batches, pool)
        assert timing is PassTiming.EAGER and len(timers) == 2 and all(t() > 0 for t in timers)


def test_captions_say_how_the_passes_were_timed() -> None:
    """A CPU's eager passes need no word; graph replays say so; eager passes on a GPU (no graph could be
    captured while another session held it) warn that the times are mostly Python's launches."""
    assert timing_note(PassTiming.EAGER) == ""
    costs = {t: [VerifyCost(0, 0.0006, timing=t), VerifyCost(64, 0.0012, timing=t)] for t in PassTiming}
    assert "CUDA graph" not in cost_caption(costs[PassTiming.EAGER])
    assert "replayed from a CUDA graph" in cost_caption(costs[PassTiming.GRAPH])
    text = cost_caption(costs[PassTiming.EAGER_ON_GPU])
    assert "no CUDA graph could be captured" in text and "measure again once the GPU is free" in text
    assert "(0.6 ms → 1.2 ms)" in text  # sub-millisecond passes keep their figures (was "1 → 1 ms")


@pytest.mark.gpu
def test_gpu_passes_replay_cuda_graphs(random_weights) -> None:  # noqa: ANN001
    """Replayed from graphs, a pass costs what the GPU does: a 128-row pass a small multiple of a one-row pass
    (the weights are read once for every row), and far below an eager pass's ~400 launches from Python."""
    engine, batches, pool = _engine_and_batches(random_weights, "cuda", "bfloat16")
    with torch.inference_mode():
        timers, timing = pass_timers(engine, batches, pool)
        assert timing is PassTiming.GRAPH and all(0 < t() < 0.02 for t in timers)
    passes = measure_passes(engine, 512)
    assert [p.rows for p in passes] == list(MEASURED_ROWS) and all(p.timing is PassTiming.GRAPH for p in passes)
    assert passes[-1].seconds < 3 * passes[0].seconds, passes
