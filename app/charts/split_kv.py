"""Split-KV decoding charts: one decode row's keys dealt to S programs, the merge of their partials, the
engine's split plan over batch and context, and what the split bought on the H200."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from kernels.split_kv_trace import SplitKVTrace

from app.analysis.split_kv import PlanCell, SplitBench
from app.charts.colors import tint
from app.formatting import plural
from app.theme import BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

# Okabe-Ito without black and without the tile chart's blue/orange pair doing other work: eight splits
# at most on the page, each its own hue.
SPLIT_COLORS: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0C808",
                                 "#6B7280")


def split_color(split: int) -> str:
    return SPLIT_COLORS[split % len(SPLIT_COLORS)]


def split_scores_chart(trace: SplitKVTrace) -> go.Figure:
    """The decode row's scaled scores over key position, each key coloured by the split (program) that
    streams its tile; every split's own max m_s marked where it occurs, and the global max M."""
    fig = go.Figure()
    n, bn = trace.seq_len, trace.block_n
    for t, owner in enumerate(trace.owner):
        fig.add_vrect(x0=t * bn - 0.5, x1=min((t + 1) * bn, n) - 0.5, fillcolor=tint(split_color(owner), 0.16),
                      line_width=0, layer="below")
    scores = trace.scores.tolist()
    dot = 6 if n <= 400 else 4
    for p in trace.partials:
        keys = [i for i in range(n) if trace.owner[i // bn] == p.split]
        if not keys:
            continue
        fig.add_scatter(x=keys, y=[scores[i] for i in keys], mode="markers", name=f"split {p.split}",
                        marker=dict(size=dot, color=split_color(p.split)),
                        hovertemplate=f"key %{{x}}: score %{{y:.3f}}<br>split {p.split} (tiles "
                                      f"{_tiles_text(p.tiles)})<extra></extra>")
        top = max(keys, key=lambda i: scores[i])
        fig.add_scatter(x=[top], y=[p.m], mode="markers", showlegend=False,
                        marker=dict(size=14, symbol="diamond", color=split_color(p.split),
                                    line=dict(color="white", width=1.5)),
                        hovertemplate=f"split {p.split}'s own max m_{p.split} = {p.m:.3f} (key {top})<extra></extra>")
    fig.add_hline(y=trace.m, line=dict(color=MUTED, dash="dot"))
    fig.add_annotation(x=0, y=trace.m, xanchor="left", yanchor="bottom", showarrow=False,
                       text=f"M = max over splits of m_s = {trace.m:.3f}", font=dict(color=MUTED))
    fig.add_scatter(x=[None], y=[None], mode="markers", name="each split's max m_s",
                    marker=dict(size=12, symbol="diamond", color=MUTED))
    # The splits that run, as the engine's launcher counts them; the S asked for when the tiles fill fewer.
    asked = f" (S = {trace.asked})" if trace.asked != trace.splits else ""
    fig.update_layout(title=f"Head {trace.head}: {plural(n, 'key')} in {plural(trace.num_tiles, 'tile')} of {bn}, "
                            f"dealt to {plural(trace.splits, 'split')}{asked}",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0))
    pad = max(1.0, 0.02 * n)  # room for a diamond on the first or last key
    lo = min(scores)
    span = max(trace.m - lo, 1.0)
    # Short enough for a half-width chart at 1280 pixels (the longer title lost its closing parenthesis).
    fig.update_xaxes(title_text="key position (shade: the split streaming its tile)",
                     range=[-0.5 - pad, n - 0.5 + pad], zeroline=False, showgrid=False)
    fig.update_yaxes(title_text="scaled score q·k / √d", range=[lo - 0.08 * span, trace.m + 0.22 * span])
    return fig


def _tiles_text(tiles: tuple[int, ...]) -> str:
    if len(tiles) <= 6:
        return ", ".join(map(str, tiles))
    return f"{', '.join(map(str, tiles[:3]))}, …, {tiles[-1]}"


def merge_chart(trace: SplitKVTrace) -> go.Figure:
    """Each split's share of the row's softmax mass once rescaled to the global max: exp(m_s - M) l_s / L.
    The shares add up to 1; the output is the same mixture of the splits' own outputs."""
    parts = list(trace.partials)
    ys = [f"split {p.split}" for p in parts]
    fig = go.Figure(go.Bar(
        x=[100 * p.weight for p in parts], y=ys, orientation="h",
        marker_color=[split_color(p.split) for p in parts],
        text=[f"{100 * p.weight:.1f} %" if p.keys else "no keys" for p in parts], textposition="outside",
        cliponaxis=False,
        customdata=[[p.m, p.l, p.keys, math.exp(p.m - trace.m) if p.keys else 0.0] for p in parts],
        hovertemplate="%{y}: %{customdata[2]} keys<br>m_s = %{customdata[0]:.3f}, l_s = %{customdata[1]:.3f}"
                      "<br>rescaled by exp(m_s − M) = %{customdata[3]:.3g}<br>share %{x:.2f} %<extra></extra>"))
    fig.update_layout(title="The merge: each split's share", showlegend=False, bargap=0.35)
    fig.update_xaxes(title_text="exp(m_s − M)·l_s / L, % of the mass", range=[0, 118], zeroline=True)
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def plan_heatmap(cells: tuple[PlanCell, ...], kv_heads: int, sms: int, gpu: str) -> go.Figure:
    """Splits per (batch, context) as the engine's launcher plans them; the hover says how many programs
    that makes against the SM count."""
    batches = sorted({c.batch for c in cells})
    contexts = sorted({c.context for c in cells})
    at = {(c.batch, c.context): c for c in cells}
    z, text, hover = [], [], []
    for b in batches:
        row_z, row_t, row_h = [], [], []
        for ctx in contexts:
            c = at[(b, ctx)]
            progs = c.programs(kv_heads)
            row_z.append(math.log2(c.splits))
            row_t.append(str(c.splits))
            row_h.append(f"batch {b}, {ctx:,} tokens of context<br><b>{c.splits} "
                         f"{'split' if c.splits == 1 else 'splits'}</b> of {c.partition:,} keys<br>"
                         f"{b} × {kv_heads} KV heads × {c.splits} = {progs:,} programs, "
                         f"{progs / sms:.2g} per SM (unsplit: {b * kv_heads:,}, {b * kv_heads / sms:.2g} per SM)")
        z.append(row_z)
        text.append(row_t)
        hover.append(row_h)
    fig = go.Figure(go.Heatmap(
        z=z, x=[_tokens(c) for c in contexts], y=[str(b) for b in batches], text=text, texttemplate="%{text}",
        customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale="Blues", zmin=0,
        zmax=max(1.0, max(max(r) for r in z)), showscale=False, xgap=2, ygap=2))
    fig.update_layout(title=f"Splits the engine picks on {gpu.replace('NVIDIA ', '')} ({sms} SMs)")
    fig.update_xaxes(title_text="context per sequence (tokens)", type="category", showgrid=False)
    fig.update_yaxes(title_text="batch (sequences decoding)", type="category", autorange="reversed", showgrid=False)
    return fig


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def split_gain_chart(bench: SplitBench) -> go.Figure:
    """Measured: decode attention time with the launcher's splits against one program per (sequence, KV
    head), per batch size, over context length."""
    fig = go.Figure()
    dashes = ("solid", "dash", "dot", "dashdot")
    for i, b in enumerate(bench.batches):
        rows = sorted((r for r in bench.rows if r.batch == b), key=lambda r: r.context)
        fig.add_scatter(x=[r.context for r in rows], y=[r.gain for r in rows], mode="lines+markers",
                        name=f"batch {b}", line=dict(color=TECHNIQUE_COLOR if b == 1 else MUTED if b >= 64 else
                                                     BASELINE_COLOR if b <= 4 else "#0072B2",
                                                     width=3, dash=dashes[i % len(dashes)]),
                        marker=dict(size=8),
                        customdata=[[r.splits, r.split_us, r.one_split_us, r.sdpa_us] for r in rows],
                        hovertemplate=f"batch {b}, %{{x:,}} tokens<br>%{{customdata[0]}} splits: "
                                      "%{customdata[1]:.1f} µs<br>one split: %{customdata[2]:.1f} µs<br>"
                                      "SDPA (contiguous cache): %{customdata[3]:.1f} µs<br>"
                                      "<b>%{y:.2f}× faster with splits</b><extra></extra>")
    fig.add_hline(y=1, line=dict(color=MUTED, dash="dot"))
    fig.update_layout(title=f"Split-KV vs one program per KV head, {bench.device.removeprefix('NVIDIA ')}",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0))
    contexts = sorted({r.context for r in bench.rows})
    fig.update_xaxes(title_text="context per sequence (tokens)", type="log", tickvals=contexts,
                     ticktext=[_tokens(c) for c in contexts])
    top = max(r.gain for r in bench.rows)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100) if t <= 1.5 * top]
    fig.update_yaxes(title_text="speed-up from splitting (×)", type="log", tickvals=ticks,
                     ticktext=[f"{t}×" for t in ticks])
    return fig

