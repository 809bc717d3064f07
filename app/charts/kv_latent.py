"""Charts of the KV page's MLA section: published models' cache per token, the live model's latent retrofit
(quality against cache size), and the spectra that explain it."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.kv_latent.lab import KIND_LABELS, LatentLabResult

from app.analysis.kv_math import PUBLISHED_CACHES
from app.charts.kv_cache import GIB, VARIANT_COLORS
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

KIND_COLORS = {"plain": MUTED, "aware": TECHNIQUE_COLOR, "mqa": BASELINE_COLOR, "full": "#0072B2"}


def published_figure(bytes_per_element: int, context: int) -> go.Figure:
    """KiB per token of released models' caches (horizontal bars by kind), labelled with one request's GiB at
    `context` tokens."""
    models = list(reversed(PUBLISHED_CACHES))  # the first listed on top
    kib = [m.bytes_per_token(bytes_per_element) / 1024 for m in models]
    gib = [m.bytes_per_token(bytes_per_element) * context / GIB for m in models]
    fig = go.Figure(go.Bar(
        y=[f"{m.name} <sub>{m.kind}</sub>" for m in models], x=kib, orientation="h",
        marker_color=[VARIANT_COLORS[m.kind] for m in models],
        text=[f"{k:,.0f} KiB · {g:,.1f} GiB" for k, g in zip(kib, gib)], textposition="outside", cliponaxis=False,
        customdata=[m.shape for m in models],
        hovertemplate="%{y}: %{x:,.1f} KiB per token (%{customdata} numbers a layer)<extra></extra>"))
    fig.update_layout(
        title=dict(text="Released models: KV cache per token", subtitle=dict(
            text=f"label: per token · one request of {context // 1024}k tokens")),
        xaxis=dict(title="KiB per token (log scale)", type="log", range=[1, np.log10(max(kib)) + 1.0],
                   dtick=1, exponentformat="none", tickformat=",~g"),
        margin=dict(l=10, r=30, t=80), showlegend=False)
    return fig


def tradeoff_figure(result: LatentLabResult, domain: str) -> go.Figure:
    """KL from the full model (left, log) and top-1 agreement (right) against the numbers cached per token and
    layer: the two SVD retrofits as lines over rank, MQA as one point, the model as trained as a dashed line."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "KL(full ‖ retrofit), nats per token", "Top-1 agreement with the full model"))
    full = result.full_rank
    for kind in ("plain", "aware", "mqa"):
        pts = sorted((p for p in result.points if p.kind == kind), key=lambda p: p.rank)
        if not pts:
            continue
        x = [p.rank for p in pts]
        share = [f"{p.rank / full:.0%} of the GQA cache" for p in pts]
        mode, marker = ("markers", dict(size=15, symbol="diamond")) if kind == "mqa" else ("lines+markers",
                                                                                         dict(size=8))
        for col, values, fmt in ((1, [p.scores[domain].kl for p in pts], "%{y:.3f} nats"),
                                 (2, [100 * p.scores[domain].top1 for p in pts], "%{y:.1f} %")):
            fig.add_scatter(x=x, y=values, mode=mode, marker=marker, name=KIND_LABELS[kind],
                            line=dict(color=KIND_COLORS[kind], width=2.5), marker_color=KIND_COLORS[kind],
                            customdata=share, showlegend=col == 1, legendgroup=kind, row=1, col=col,
                            hovertemplate=f"{KIND_LABELS[kind]}: %{{x}} numbers (%{{customdata}}): {fmt}"
                                          "<extra></extra>")
    fig.add_hline(y=100, line=dict(color=KIND_COLORS["full"], dash="dash", width=1.5), row=1, col=2)
    ticks = sorted({p.rank for p in result.points})
    # Below the line at the left, where the curves are low: above it the subplot's title sits.
    fig.add_annotation(x=ticks[0], y=100, xref="x2", yref="y2", text="GQA as trained",
                       showarrow=False, xanchor="left", yanchor="top", font=dict(color=KIND_COLORS["full"]))
    for col in (1, 2):
        fig.update_xaxes(title_text="numbers cached per token and layer", tickvals=ticks, range=[0, full + 16],
                         row=1, col=col)
    fig.update_yaxes(type="log", exponentformat="none", tickformat=",~g", row=1, col=1)
    fig.update_yaxes(range=[0, 105], ticksuffix=" %", row=1, col=2)
    fig.update_layout(title=dict(text=f"Smaller cache, further from the model ({domain} text)", subtitle=dict(
        text="each point is the whole model with that cache layout in every layer, scored on held-out text")),
        # A taller top than the template's: the subtitle and the subplot titles stay apart in presentation mode.
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=150, b=110))
    return fig


def spectrum_figure(result: LatentLabResult) -> go.Figure:
    """Share kept against rank, the median layer as a line and the range over layers as a band: of W_kv's own
    spectrum (plain) and of the K and V the calibration text produces (aware)."""
    fig = go.Figure()
    names = {"plain": "of W_kv (plain SVD's view)", "aware": "of the K and V the text produces (activation-aware)"}
    for kind, curves in result.spectra.items():
        r = np.arange(1, curves.shape[1] + 1)
        lo, mid, hi = (100 * np.quantile(curves, q, axis=0) for q in (0.0, 0.5, 1.0))
        color = KIND_COLORS[kind]
        fig.add_scatter(x=np.r_[r, r[::-1]], y=np.r_[hi, lo[::-1]], fill="toself", line=dict(width=0),
                        fillcolor=color, opacity=0.18, hoverinfo="skip", showlegend=False)
        fig.add_scatter(x=r, y=mid, mode="lines", name="share " + names[kind], line=dict(color=color, width=2.5),
                        hovertemplate="rank %{x}: %{y:.1f} % (median layer)<extra></extra>")
    rank = result.settings.answer_rank
    fig.add_vline(x=rank, line=dict(color=ACCENT, dash="dash", width=1.5))
    # Inside the plot at the bottom (the curves are high there): above it the subtitle sits.
    fig.add_annotation(x=rank, y=0.04, yref="paper", xanchor="left", yanchor="bottom", xshift=4,
                       text=f"rank {rank}", showarrow=False, font=dict(color=ACCENT))
    fig.update_layout(
        title=dict(text="How much a rank-r latent keeps", subtitle=dict(
            text=f"squared singular values kept · line: median layer · band: all {result.layers}")),
        xaxis=dict(title="latent rank r", range=[0, result.full_rank]),
        yaxis=dict(title="share kept", ticksuffix=" %", range=[0, 101]),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=110, b=110))
    return fig
