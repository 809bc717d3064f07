"""The physical KV block pool as a grid of tiles, and paged vs contiguous waste over time.

Each tile is one physical block: its colour says who owns it (a request, "shared" for
copy-on-write sharing, or free), and the solid part rising from the bottom says how many of its
slots hold a token; the pale rest is allocated-but-empty (the only waste paging leaves).
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from engine.trace import StepRecord

from app.analysis.trace_metrics import block_fills
from app.charts.axes import step_range, step_ticks
from app.charts.colors import HALO, INK, ink_on, owner_color, tint
from app.theme import BASELINE_COLOR, FREE_COLOR, MUTED, SHARED_COLOR, TECHNIQUE_COLOR

GAP = 0.08
STRADDLE = (0.3, 0.7)  # fill fractions at which a mid-tile number crosses the fill line


def grid_columns(num_blocks: int) -> int:
    """A wide grid (about 2:1) that fits a slide."""
    return max(4, min(16, math.ceil(math.sqrt(num_blocks * 2))))


def block_pool_grid(record: StepRecord, order: list[str], highlight: set[int] | None = None) -> go.Figure:
    pool = record.pool
    cols = grid_columns(pool.num_blocks)
    rows = math.ceil(pool.num_blocks / cols)
    fills = block_fills(record)
    highlight = highlight or set()
    fig = go.Figure()
    xs, ys, texts, hovers, inks, straddles = [], [], [], [], [], []
    for b in range(pool.num_blocks):
        col, row = b % cols, b // cols
        x0, y0 = col + GAP, rows - 1 - row + GAP  # block 0 top-left, reading order
        x1, y1 = col + 1 - GAP, rows - row - GAP
        owner, refs = pool.owners[b], pool.ref_counts[b]
        color = owner_color(owner, order)
        fill = fills.get(b, 0) if refs else 0
        frac = fill / pool.block_size
        line = dict(color="#111827", width=3) if b in highlight else dict(color="#D1D5DB" if not refs else color, width=1)
        pale = tint(color, 0.28) if refs else FREE_COLOR
        fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, fillcolor=pale, line=line, layer="below")
        if frac > 0:
            fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y0 + (y1 - y0) * frac, fillcolor=color,
                          line=dict(width=0), layer="below")
        inks.append(ink_on(color if frac >= 0.5 else pale))  # the number sits mid-tile: on the solid part or not
        straddles.append(STRADDLE[0] < frac < STRADDLE[1])
        xs.append(col + 0.5)
        ys.append(rows - row - 0.5)
        texts.append(f"{b}" + (f"<br>×{refs}" if refs > 1 else ""))
        who = owner if owner else "free"
        hovers.append(f"<b>block {b}</b><br>owner: {who}<br>ref count: {refs}<br>"
                      f"filled: {fill}/{pool.block_size} slots")
    # A number across the fill line (a half-full block) has one half on the pale part and one on the solid part,
    # so no single colour reads on both: those get near-black with a white halo, in a trace of their own because
    # a text shadow cannot vary per point.
    for halo in (False, True):
        idx = [i for i, s in enumerate(straddles) if s == halo]
        if idx:
            fig.add_scatter(x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="text", text=[texts[i] for i in idx],
                            hovertext=[hovers[i] for i in idx], hoverinfo="text", showlegend=False,
                            textfont=dict(color=INK, shadow=HALO) if halo else dict(color=[inks[i] for i in idx]))
    # Legend entries (tiles are shapes, which have no legend of their own).
    present = [o for o in order if o in set(pool.owners)]
    for label, color in [(o, owner_color(o, order)) for o in present] + [("shared (copy-on-write)", SHARED_COLOR),
                                                                          ("free", FREE_COLOR)]:
        if label.startswith("shared") and "shared" not in pool.owners:
            continue
        fig.add_scatter(x=[None], y=[None], mode="markers", name=label,
                        marker=dict(symbol="square", size=14, color=color, line=dict(color="#9CA3AF", width=1)))
    fig.update_xaxes(visible=False, range=[-0.05, cols + 0.05], fixedrange=True)
    fig.update_yaxes(visible=False, range=[-0.05, rows + 0.05], fixedrange=True, scaleanchor="x", scaleratio=1)
    fig.update_layout(title=f"Physical KV blocks after step {record.step}: {pool.used_blocks} used, "
                            f"{pool.free_blocks} free (block size {pool.block_size} tokens)",
                      margin=dict(l=10, r=10, t=80, b=10), plot_bgcolor="white")
    return fig


def waste_over_time(records: list[StepRecord]) -> go.Figure:
    steps = [r.step for r in records]
    # With nothing allocated (every request finished) waste is undefined, not 0 %: a gap, like the metric's "–".
    paged = [100 * r.pool.paged_waste_fraction if r.pool.allocated_tokens else None for r in records]
    contig = [100 * r.pool.contiguous_waste_fraction if r.pool.contiguous_reserved_tokens else None for r in records]
    fig = go.Figure()
    fig.add_scatter(x=steps, y=contig, name="contiguous: reserve max_model_len per request", mode="lines+markers",
                    line=dict(color=BASELINE_COLOR, width=3),
                    customdata=[(r.pool.contiguous_waste_tokens, r.pool.contiguous_reserved_tokens) for r in records],
                    hovertemplate="step %{x}: %{y:.1f}% wasted (%{customdata[0]} of %{customdata[1]} slots)<extra></extra>")
    fig.add_scatter(x=steps, y=paged, name="paged: only the tail block's empty slots", mode="lines+markers",
                    line=dict(color=TECHNIQUE_COLOR, width=3),
                    customdata=[(r.pool.internal_waste_tokens, r.pool.allocated_tokens) for r in records],
                    hovertemplate="step %{x}: %{y:.1f}% wasted (%{customdata[0]} of %{customdata[1]} slots)<extra></extra>")
    fig.update_layout(title="Reserved but unused KV slots (measured each step)", xaxis_title="engine step",
                      yaxis_title="% of reserved slots wasted", yaxis_range=[0, 105], hovermode="x unified")
    fig.add_hline(y=0, line=dict(color=MUTED, width=1))
    fig.update_xaxes(**step_ticks(records), **step_range(r.step for r in records))
    return fig
