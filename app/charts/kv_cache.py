"""KV-cache charts: the live cache growing, head-sharing variants, long-context sizing, and decoding
with versus without the cache."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.config import ModelConfig
from engine.trace import StepRecord

from app.analysis.cache_timing import CacheTiming
from app.analysis.kv_math import (DTYPE_BYTES, attention_variants, kv_bytes_per_token, variant_bytes_per_token,
                                  weights_bytes)
from app.analysis.trace_metrics import tokens_by_owner
from app.charts.axes import step_line_mode, step_range, step_ticks
from app.charts.colors import owner_color
from app.formatting import GIB, MIB
from app.theme import ACCENT, MUTED

VARIANT_COLORS = {"MHA": "#CC79A7", "GQA": "#0072B2", "MQA": "#009E73", "MLA": "#E69F00"}


def kv_growth(records: list[StepRecord], bytes_per_token: int, order: list[str]) -> go.Figure:
    """Stacked area: KV bytes held per request after every step, plus what the blocks reserve."""
    steps = [r.step for r in records]
    per_step = [tokens_by_owner(r) for r in records]
    owners = [o for o in order if any(o in d for d in per_step)]
    owners += sorted({o for d in per_step for o in d} - set(owners))
    fig = go.Figure()
    mode = step_line_mode(len(steps))
    for owner in owners:
        toks = [d.get(owner, 0) for d in per_step]
        fig.add_scatter(
            x=steps, y=[t * bytes_per_token / MIB for t in toks], name=owner, stackgroup="kv", mode=mode,
            # Steps, like the reserved line: a prompt lands in one prefill step, and a slope between two steps
            # drew more held than reserved.
            line=dict(width=0.5, color=owner_color(owner, order), shape="hv"), customdata=toks,
            hovertemplate="step %{x}: %{customdata} tokens = %{y:.2f} MiB<extra>%{fullData.name}</extra>",
        )
    allocated = [r.pool.used_blocks * r.pool.block_size for r in records]
    fig.add_scatter(
        x=steps, y=[a * bytes_per_token / MIB for a in allocated], name="reserved by blocks",
        mode=mode, line=dict(color=MUTED, dash="dash", width=2, shape="hv"), customdata=allocated,
        hovertemplate="step %{x}: %{customdata} slots in used blocks = %{y:.2f} MiB<extra></extra>",
    )
    fig.update_layout(title="KV cache held after each step", xaxis_title="engine step",
                      yaxis_title="MiB of K and V", hovermode="x unified")
    fig.update_xaxes(**step_ticks(records), **step_range(steps))
    return fig


def bytes_vs_tokens(records: list[StepRecord], bytes_per_token: int) -> go.Figure:
    """One marker per step at (tokens cached, bytes): every step lands on the line bytes = formula x tokens."""
    toks = [r.pool.filled_tokens for r in records]
    top = max(toks + [1])
    fig = go.Figure()
    fig.add_scatter(x=[0, top * 1.05], y=[0, top * 1.05 * bytes_per_token / MIB], mode="lines", name="formula",
                    line=dict(color=MUTED, dash="dot", width=2), hoverinfo="skip")
    fig.add_scatter(
        x=toks, y=[t * bytes_per_token / MIB for t in toks], mode="markers", name="after each step",
        marker=dict(size=9, color=[r.step for r in records], colorscale="Blues", cmin=-len(records) * 0.3,
                    line=dict(color="#0B3B60", width=1)),
        customdata=[r.step for r in records],
        hovertemplate="step %{customdata}: %{x} tokens → %{y:.2f} MiB<extra></extra>",
    )
    if records:
        # The label sits on the side with room: hung up and left of a point near the origin (the last step
        # after every request finished, or was preempted, and gave its blocks back) it ran off the chart.
        on_left = toks[-1] > top / 2
        freed = toks[-1] == 0 and top > 1
        fig.add_annotation(x=toks[-1], y=toks[-1] * bytes_per_token / MIB,
                           text=f"step {records[-1].step}" + (": every block freed" if freed else ""),
                           showarrow=True, arrowhead=2, ax=-40 if on_left else 40, ay=-30,
                           xanchor="right" if on_left else "left")
    fig.update_layout(title=dict(text="Bytes vs tokens", subtitle=dict(text=f"slope = {bytes_per_token / 1024:.1f} KiB per token")),
                      xaxis_title="tokens in the cache", yaxis_title="MiB of K and V", showlegend=False)
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig


def head_variants(cfg: ModelConfig) -> go.Figure:
    """KiB per token for MHA / GQA / MQA / MLA at the same query-head count, at fp32 and bf16/fp16."""
    fig = go.Figure()
    variants = attention_variants(cfg)
    for label, nbytes, color in (("fp32 (CPU path)", 4, "#4D4D4D"), ("bf16 / fp16", 2, ACCENT)):
        vals = [variant_bytes_per_token(cfg, v, nbytes) / 1024 for v in variants]
        fig.add_bar(
            x=[f"{v.name}<br><sub>{v.short}</sub>" for v in variants],
            # Numbers without the unit (the axis says KiB): "135.0 KiB" was shrunk to ~6 px to fit its bar.
            y=vals, name=label, marker_color=color, text=[f"{x:.3g}" for x in vals], textposition="outside",
            textfont_size=12, constraintext="none", cliponaxis=False,
            hovertemplate="%{x}: %{y:.2f} KiB per token<extra>%{fullData.name}</extra>",
        )
    top = kv_bytes_per_token(cfg, 4, cfg.num_heads) / 1024
    fig.update_layout(title=f"KV bytes per token, {cfg.num_heads} query heads", yaxis_title="KiB per token",
                      barmode="group", yaxis_range=[0, top * 1.2])
    return fig


def long_context(cfg: ModelConfig, contexts: list[int], batch: int, dtype: str) -> go.Figure:
    """GiB of KV cache for each context length and variant, with the model's own weights for scale."""
    nbytes = DTYPE_BYTES[dtype]
    labels = [f"{c // 1024}k tokens" for c in contexts]
    fig = go.Figure()
    lowest, highest = float("inf"), 0.0
    for v in attention_variants(cfg):
        vals = [variant_bytes_per_token(cfg, v, nbytes) * c * batch / GIB for c in contexts]
        lowest, highest = min(lowest, *vals), max(highest, *vals)
        # Short legend names, so the four fit on one line of a half-width column; the chart beside this one
        # names what each variant caches (and so does the hover).
        fig.add_bar(x=labels, y=vals, name=v.name, marker_color=VARIANT_COLORS[v.name],
                    text=[f"{x:,.1f}" if x >= 1 else f"{x:.2f}" for x in vals], textposition="outside",
                    textfont_size=10, cliponaxis=False, customdata=[v.short] * len(vals),
                    hovertemplate="%{x}, batch " + str(batch) + ": %{y:.2f} GiB<extra>%{fullData.name} "
                                  "(%{customdata})</extra>")
    w = weights_bytes(cfg, nbytes) / GIB
    # A line across the whole plot, over the bars (between the category centres and under them it was mostly
    # hidden), named in the subtitle: an annotation would sit on the bars, and as a fifth legend entry (a line
    # among bars) it made Plotly stack the legend one entry per row in a half-width column.
    fig.add_hline(y=w, line=dict(color="#111827", dash="dot", width=2), layer="above")
    fig.update_xaxes(range=[-0.5, len(labels) - 0.5])
    fig.update_layout(title=dict(text=f"KV cache for a batch of {batch} at {dtype}",
                                 subtitle_text=f"dotted: all the model's weights, {w:.2f} GiB"),
                      yaxis_title="GiB (log scale)", barmode="group", yaxis_type="log")
    # The range in decades, with room under the weights line and above the tallest bar for its label.
    bottom, top = np.log10(min(lowest, w) / 2), np.log10(highest * 4)
    fig.update_yaxes(dtick=1, exponentformat="none", tickformat=",~g", range=[bottom, top])  # ticks at powers of ten
    return fig


def _trend(xs: list[int], ys: tuple[float, ...]) -> tuple[list[float], str] | None:
    """Least-squares line through the decode tokens (token 1 is the shared prefill), and its legend name: the
    slope, or "flat" when the line moves less over the run than the points scatter around it (a fitted
    "-1.1 ms per token" through noise said decoding got faster as the context grew)."""
    if len(xs) < 4:
        return None
    slope, intercept = np.polyfit(xs[1:], ys[1:], 1)
    line = [slope * x + intercept for x in xs[1:]]
    scatter = float(np.std(np.asarray(ys[1:]) - np.asarray(line)))
    drift = abs(slope) * (xs[-1] - xs[1])
    name = f"trend {slope:+.2g} ms per token" if drift > scatter else "trend: flat (drift within the noise)"
    return line, name


def cache_timing(t: CacheTiming) -> go.Figure:
    """Per-token latency both ways (left) and the tokens each output token costs to compute (right).

    Shared CPUs produce the odd huge spike; the y range is set from the typical values so spikes do
    not flatten the picture, and a fitted trend line carries the message through the noise."""
    idx = list(range(1, len(t.with_cache_ms) + 1))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1,
                        subplot_titles=("Time to produce each token (measured)", "Tokens pushed through the model"))
    hover = "token %{x} (context %{customdata} tokens): %{y:.0f} ms<extra>%{fullData.name}</extra>"
    series = (("without cache: recompute the prefix", t.without_cache_ms, ACCENT),
              ("with KV cache: one new token", t.with_cache_ms, "#0072B2"))
    for name, ys, color in series:
        fig.add_scatter(x=idx, y=ys, name=name, mode="lines+markers", line=dict(color=color, width=2),
                        marker=dict(size=6), customdata=t.context_lens, hovertemplate=hover, row=1, col=1)
        fit = _trend(idx, ys)
        if fit:
            line, name = fit
            fig.add_scatter(x=idx[1:], y=line, mode="lines", name=name,
                            line=dict(color=color, width=3, dash="dash"), hoverinfo="skip", row=1, col=1)
    typical = float(np.percentile(t.without_cache_ms, 90)) if t.without_cache_ms else 1.0
    clipped = sum(1 for y in (*t.with_cache_ms, *t.without_cache_ms) if y > typical * 1.6)
    fig.update_yaxes(range=[0, typical * 1.6], row=1, col=1)
    if clipped:
        fig.add_annotation(text=f"{clipped} spike{'s' * (clipped > 1)} from background load above the chart",
                           xref="x domain", yref="y domain", x=0.01, y=0.99, showarrow=False,
                           font=dict(color=MUTED), row=1, col=1)
    fig.add_scatter(x=idx, y=t.without_cache_tokens, showlegend=False, mode="lines", line=dict(color=ACCENT, width=3),
                    hovertemplate="token %{x}: %{y} tokens computed<extra>without cache</extra>", row=1, col=2)
    fig.add_scatter(x=idx, y=t.with_cache_tokens, showlegend=False, mode="lines", line=dict(color="#0072B2", width=3),
                    hovertemplate="token %{x}: %{y} tokens computed<extra>with cache</extra>", row=1, col=2)
    fig.update_xaxes(title_text="output token #", row=1, col=1)
    fig.update_xaxes(title_text="output token #", row=1, col=2)
    fig.update_yaxes(title_text="ms per token", row=1, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=2)
    # Subplot titles sit where a top legend would go: put the legend under the plots instead.
    fig.update_layout(legend=dict(yanchor="top", y=-0.2, xanchor="left", x=0.0), margin=dict(t=60, b=110))
    return fig
