"""Decoding in parallel (diffusion LLMs such as Inception's Mercury, LLaDA) on the roofline: a block of K positions
is written by T denoising passes over all K at once, so each pass does K rows of matmuls for one read of the weights
and commits K / T tokens. Where a pass over K rows is memory-bound it costs about what a one-row decode step costs,
and K / T tokens per pass is a K / T speedup; past the ridge the pass time grows with K and the gain fades.

The lines are arithmetic with the roofline's ceilings, not a run: SmolLM2 is autoregressive and cannot denoise a
block. What can be measured on the real model is the premise, a forward pass over K rows against a one-row pass
(`measure_passes`: the tree speculation pages' verification pass with K - 1 nodes)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.engine import LLMEngine
from kernels.ceilings import Ceilings

from app.analysis.kv_math import kv_bytes_per_token
from app.analysis.pass_timing import PassTiming
from app.analysis.roofline_math import DecodeStep, decode_step, smallest_reaching
from app.analysis.tree_spec import verify_cost_sweep

BLOCKS = (16, 32, 64, 128, 256, 512, 1024)  # block lengths K the section offers
TOKENS_PER_PASS = (1, 2, 4, 8, 16)  # K / T: how many positions each denoising pass commits


def block_pass(cfg: ModelConfig, rows: int, context: int, elem: int) -> DecodeStep:
    """One forward pass over `rows` positions of one sequence: every row attends to the `context` cached tokens and
    to the whole block (bidirectional, as a denoiser's block attends), the weights and the context's KV read once
    for all of them. (`DecodeStep.batch` holds the rows.) The FLOPs, weights and activations are a decode step's of
    `rows` sequences at `context + rows`; the KV is one sequence's, read once."""
    step = decode_step(cfg, rows, context + rows, elem)
    return dataclasses.replace(step, context=context, kv_bytes=(context + rows) * kv_bytes_per_token(cfg, elem))


@dataclass(frozen=True, slots=True)
class ParallelEstimate:
    """A block of `block` positions written `tokens_per_pass` at a time, against autoregressive decoding of one
    sequence."""

    block: int
    tokens_per_pass: int
    pass_seconds: float
    pass_bound: str  # "memory-bound" / "compute-bound"
    tokens_per_s: float
    autoregressive_tokens_per_s: float

    @property
    def passes(self) -> int:
        """T = K / (tokens per pass), rounded up (the last pass keeps what is left)."""
        return -(-self.block // self.tokens_per_pass)

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.autoregressive_tokens_per_s


def autoregressive_tokens_per_s(cfg: ModelConfig, c: Ceilings, context: int, elem: int) -> float:
    """One sequence decoding one token per step (batch 1), by the roofline."""
    return 1.0 / decode_step(cfg, 1, context, elem).seconds(c)


def parallel_tokens_per_s(cfg: ModelConfig, c: Ceilings, block: int, tokens_per_pass: float, context: int,
                          elem: int) -> float:
    """tokens per pass / the time of one pass over the block, by the roofline."""
    return tokens_per_pass / block_pass(cfg, block, context, elem).seconds(c)


def estimate(cfg: ModelConfig, c: Ceilings, block: int, tokens_per_pass: int, context: int,
             elem: int) -> ParallelEstimate:
    """The section's numbers for one choice. `tokens_per_pass` must divide into the block at least once."""
    if not 1 <= tokens_per_pass <= block:
        raise ValueError(f"tokens per pass must be between 1 and the block length ({block}), got {tokens_per_pass}")
    step = block_pass(cfg, block, context, elem)
    t = step.seconds(c)
    return ParallelEstimate(block, tokens_per_pass, t, step.bound(c), tokens_per_pass / t,
                            autoregressive_tokens_per_s(cfg, c, context, elem))


def compute_bound_block(cfg: ModelConfig, c: Ceilings, context: int, elem: int, limit: int = 1 << 16) -> int | None:
    """The smallest block whose pass is compute-bound (from there a pass costs more with every row), or None below
    `limit`."""
    return smallest_reaching(lambda rows: block_pass(cfg, rows, context, elem).intensity, c.ridge, limit)


MEASURED_ROWS = (1, 4, 8, 16, 32, 64, 128)  # rows of the timed passes (a one-row pass is a decode step)
MEASURE_CONTEXT_MAX = 2048  # cached tokens at most in front of them (a CPU prefills the context first)
MEASURE_REPEATS = 3  # timed passes per row count, the median kept


@dataclass(frozen=True, slots=True)
class MeasuredPass:
    """The median time of one forward pass over `rows` rows after `context` cached tokens, on the server's model."""

    rows: int
    context: int
    seconds: float
    timing: PassTiming = PassTiming.EAGER  # app/analysis/pass_timing.py


def measure_passes(engine: LLMEngine, context: int, rows: tuple[int, ...] = MEASURED_ROWS,
                   repeats: int = MEASURE_REPEATS) -> list[MeasuredPass]:
    """Time real forward passes over each row count in a scratch KV pool (the engine's own requests untouched):
    the tree speculation pages' verification pass with rows - 1 nodes, the sizes in turn so load falls on all.
    The context is cut to MEASURE_CONTEXT_MAX and to what the engine's positions reach (its max_model_len)."""
    room = engine.config.max_model_len - max(rows)
    if room < 1:
        raise ValueError(f"passes of {max(rows)} rows do not fit this engine's {engine.config.max_model_len} positions")
    context = max(1, min(context, MEASURE_CONTEXT_MAX, room))
    costs = verify_cost_sweep(engine, context_len=context, sizes=tuple(r - 1 for r in rows), repeats=repeats)
    return [MeasuredPass(c.nodes + 1, context, c.seconds, c.timing) for c in costs]


def measured_speedup(passes: list[MeasuredPass], block: int, tokens_per_pass: int) -> float | None:
    """tokens per pass x (one-row pass time / the block's pass time), where both were measured."""
    times = {p.rows: p.seconds for p in passes}
    if 1 not in times or block not in times:
        return None
    return tokens_per_pass * times[1] / times[block]
