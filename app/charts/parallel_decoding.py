"""The roofline page's parallel-decoding chart: predicted tokens/s of a diffusion-style decoder against the block
length, one line per tokens-per-pass, beside autoregressive decoding of one sequence."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from engine.config import ModelConfig
from kernels.ceilings import Ceilings

from app.analysis.parallel_decoding import (TOKENS_PER_PASS, MeasuredPass, autoregressive_tokens_per_s,
                                            compute_bound_block, parallel_tokens_per_s)
from app.analysis.roofline_math import log_integers
from app.charts.axes import log_axis
from app.formatting import fmt_duration
from app.theme import MUTED, titled_top_margin

BLOCK_AXIS = (1, 4096)
# Okabe-Ito, one per tokens-per-pass, light to dark reads as "more per pass".
PER_PASS_COLORS = dict(zip(TOKENS_PER_PASS, ("#56B4E9", "#0072B2", "#009E73", "#E69F00", "#D55E00")))


def _blocks(start: int) -> list[int]:
    return log_integers(start, BLOCK_AXIS[1], 100)


def parallel_decoding_chart(cfg: ModelConfig, elem: int, c: Ceilings, context: int, block: int,
                            tokens_per_pass: int, measured: list[MeasuredPass] | None = None) -> go.Figure:
    """tokens/s = (K / T) / pass time(K) for each K / T (a line starts where the block holds that many tokens),
    autoregressive batch-1 decoding as a flat line, the chosen block marked, and where a pass turns compute-bound.
    `measured`: the server's timed passes, drawn for the chosen tokens per pass (and its one-row pass as the
    measured autoregressive speed)."""
    fig = go.Figure()
    ar = autoregressive_tokens_per_s(cfg, c, context, elem)
    fig.add_scatter(x=list(BLOCK_AXIS), y=[ar, ar], mode="lines", name="autoregressive: 1 token per one-row pass",
                    line=dict(color="#111827", width=2, dash="dot"),
                    hovertemplate=f"autoregressive, batch 1: {ar:,.0f} tokens/s<extra></extra>")
    for r in TOKENS_PER_PASS:
        blocks = _blocks(r)
        fig.add_scatter(x=blocks, y=[parallel_tokens_per_s(cfg, c, k, r, context, elem) for k in blocks],
                        mode="lines", name=f"{r} token{'s' if r > 1 else ''} per pass",
                        line=dict(color=PER_PASS_COLORS[r], width=3 if r == tokens_per_pass else 2),
                        opacity=1.0 if r == tokens_per_pass else 0.55,
                        hovertemplate=f"block %{{x}}, {r} per pass: %{{y:,.0f}} tokens/s<extra></extra>")
    here = parallel_tokens_per_s(cfg, c, block, tokens_per_pass, context, elem)
    fig.add_scatter(x=[block], y=[here], mode="markers", name=f"block {block}, {tokens_per_pass} per pass: "
                                                                 f"{here:,.0f} tokens/s",
                    marker=dict(size=14, color=PER_PASS_COLORS[tokens_per_pass], line=dict(color="#111827", width=2)),
                    hovertemplate="block %{x}: %{y:,.0f} tokens/s<extra></extra>")
    if measured:
        one = next((m.seconds for m in measured if m.rows == 1), None)
        if one:
            fig.add_scatter(x=list(BLOCK_AXIS), y=[1 / one, 1 / one], mode="lines", name="measured: autoregressive",
                            line=dict(color="#6B7280", width=1.5, dash="dash"),
                            hovertemplate=f"measured one-row pass: {1 / one:,.1f} tokens/s<extra></extra>")
        rows = [m for m in measured if m.rows >= tokens_per_pass]
        fig.add_scatter(x=[m.rows for m in rows], y=[tokens_per_pass / m.seconds for m in rows], mode="markers+lines",
                        name=f"measured: {tokens_per_pass} per pass ({measured[0].context:,}-token context)",
                        line=dict(color="#111827", width=1.5), marker=dict(symbol="x", size=9, color="#111827"),
                        customdata=[fmt_duration(m.seconds) for m in rows],
                        hovertemplate="%{x} rows: pass %{customdata}, %{y:,.1f} tokens/s<extra>measured</extra>")
    turn = compute_bound_block(cfg, c, context, elem)
    if turn is not None and turn <= BLOCK_AXIS[1]:
        fig.add_vline(x=turn, line=dict(color=MUTED, dash="dash", width=1.5))
        fig.add_annotation(x=math.log10(turn), y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                           text=f"compute-bound from {turn} rows", font=dict(size=12, color=MUTED))
    fig.update_xaxes(**log_axis(), title_text="block length K (positions denoised together in each pass)",
                     range=[math.log10(BLOCK_AXIS[0]), math.log10(BLOCK_AXIS[1])])
    fig.update_yaxes(**log_axis(si=True), title_text="tokens/s, one sequence")
    fig.update_layout(
        title=dict(text="Predicted decoding speed of one sequence: K positions per pass, K / T kept",
                   subtitle=dict(text="max(FLOPs/π, bytes/β) per pass, with the ceilings chosen above")),
        legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0),
        margin=dict(t=titled_top_margin(), b=150))
    return fig
