"""Charts of the activation quantization page: one layer input's channels before and after smoothing, the
outlier ratio layer by layer, each format's distance from the full model, and SmoothQuant's alpha sweep."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.act_quant.lab import VARIANTS, ActLabResult, Variant

from app.analysis.act_quant import INPUT_LABELS, STAT_LABELS, ChannelView, fmt_times
from app.charts.axes import log_axis
from app.charts.colors import tint
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR, titled_top_margin

REFERENCE_COLOR = MUTED
FORMAT_COLORS = {"int8": BASELINE_COLOR, "fp8": "#0072B2", "nvfp4": ACCENT, "mxfp4": "#E69F00"}
WEIGHT_ONLY_COLOR = TECHNIQUE_COLOR
DOMAIN_LABELS = {"chat": "chat answers", "prose": "prose"}
DOMAIN_COLORS = {"chat": "#0072B2", "prose": "#56B4E9"}
BEFORE_COLOR, AFTER_COLOR = "#9CA3AF", TECHNIQUE_COLOR


def variant_color(v: Variant | None) -> str:
    if v is None:
        return REFERENCE_COLOR
    return WEIGHT_ONLY_COLOR if v.act_format is None else FORMAT_COLORS[v.act_format]


def tick_label(v: Variant) -> str:
    """One short line for a horizontal bar's label: the format, then granularity and SmoothQuant (three-line labels
    under upright bars were turned 90° at projector width and read from the bottom)."""
    fmt = {"int8": "INT8", "fp8": "FP8", "nvfp4": "NVFP4", "mxfp4": "MXFP4"}[v.weight_format]
    if v.act_format is None:
        return f"{fmt} weights only"
    gran = "" if v.act_format in ("nvfp4", "mxfp4") else ("per-tensor" if v.act_granularity == "tensor"
                                                           else "per-token")
    return f"{fmt} {' + '.join(p for p in (gran, 'SQ' if v.smooth else '') if p) or 'blocks'}"


def channel_figure(view: ChannelView) -> go.Figure:
    """The channels of one layer input (log scale), before smoothing (top) and after dividing by s (bottom);
    the outlier channels in orange in both."""
    n = len(view.before)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"Before: largest {fmt_times(view.ratio_before)} the median",
                                        f"After smoothing (x / s): largest {fmt_times(view.ratio_after)} the median"])
    marked = np.zeros(n, dtype=bool)
    marked[view.outliers] = True
    stat = STAT_LABELS[view.stat]
    for row, values, base, name in ((1, view.before, BEFORE_COLOR, "before"), (2, view.after, AFTER_COLOR, "after")):
        fig.add_trace(go.Bar(x=np.arange(n), y=values, marker=dict(color=np.where(marked, ACCENT, base),
                                                                    line=dict(width=0)),
                             name=name, showlegend=False,
                             hovertemplate=f"channel %{{x}} · {name} smoothing: {stat} = %{{y:.3g}}<extra></extra>"),
                      row=row, col=1)
        fig.update_yaxes(title_text=stat, row=row, col=1, **log_axis())
    fig.update_xaxes(title_text="input channel", row=2, col=1)
    fig.update_layout(
        title=dict(text=f"Layer {view.layer}, {INPUT_LABELS[view.input]}: {stat} per input channel",
                   subtitle=dict(text=f"On the calibration tokens; the top {len(view.outliers)} channels before "
                                      "smoothing in orange, in both panels")),
        bargap=0, margin=dict(t=titled_top_margin(), b=60))
    return fig


def outlier_ratio_figure(frame: pd.DataFrame, stat: str) -> go.Figure:
    """Largest channel over the median channel, layer by layer, for each layer input: before smoothing (solid)
    and after (dotted)."""
    inputs = list(INPUT_LABELS)
    fig = make_subplots(rows=1, cols=4, shared_yaxes=True, horizontal_spacing=0.025,
                        subplot_titles=[INPUT_LABELS[i].split(" (")[0] for i in inputs])
    for c, inp in enumerate(inputs, start=1):
        rows = frame[frame["input"] == inp].sort_values("layer")
        for col, name, color, dash in ((stat, "before smoothing", BEFORE_COLOR, "solid"),
                                       (f"{stat}_smoothed", "after SmoothQuant (÷ s)", AFTER_COLOR, "dot")):
            fig.add_trace(go.Scatter(x=rows["layer"], y=rows[col], mode="lines+markers", name=name,
                                     line=dict(color=color if dash == "dot" else "#4B5563", width=2, dash=dash),
                                     marker=dict(size=5), legendgroup=name, showlegend=c == 1,
                                     customdata=[fmt_times(float(y)) for y in rows[col]],
                                     hovertemplate=f"layer %{{x}} · {inp} · {name}: %{{customdata}}<extra></extra>"),
                          row=1, col=c)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_yaxes(title_text=f"largest / median {STAT_LABELS[stat]}", row=1, col=1, **log_axis())
    fig.update_yaxes(**log_axis())
    fig.update_layout(title=dict(text="How far the outliers stand out, layer by layer", subtitle=dict(
        text=f"Largest channel's {STAT_LABELS[stat]} over the median channel's, on the calibration tokens")),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=titled_top_margin(), b=90))
    return fig


def quality_figure(result: ActLabResult) -> go.Figure:
    """KL from the full model per variant on each kind of held-out text (log), horizontal bars labelled on one line
    with each variant's bits per weight and activation; the label at each bar's end is the top-1 agreement."""
    fig = go.Figure()
    names = [f"{tick_label(v.variant)} · W{v.bits_per_weight:g} A{v.bits_per_activation:g}"
             for v in result.variants]
    for domain, label in DOMAIN_LABELS.items():
        scores = [v.scores[domain] for v in result.variants]
        fig.add_trace(go.Bar(
            y=names, x=[max(sc.kl, 1e-6) for sc in scores], orientation="h", name=label,
            marker=dict(color=DOMAIN_COLORS[domain]),
            text=[f"{sc.top1:.0%}" for sc in scores], textposition="outside", cliponaxis=False,
            textfont=dict(size=12),
            hovertemplate=[f"<b>{v.label}</b> · {label}<br>KL {sc.kl:.3g} nats per token<br>top-1 agreement "
                           f"{sc.top1:.1%}<br>perplexity {sc.perplexity:.2f}<extra></extra>"
                           for v, sc in zip(result.variants, scores)]))
    kls = [max(v.scores[d].kl, 1e-6) for v in result.variants for d in DOMAIN_LABELS] or [1e-3, 1.0]
    lo, hi = np.log10(min(kls)), np.log10(max(kls))
    fig.update_layout(
        barmode="group", bargap=0.25,
        title=dict(text="Distance from the full model on held-out text", subtitle=dict(
            text="Mean KL per token, log scale (the full model: 0); at each bar's end, how often its top token is "
                 "the full model's")),
        xaxis=dict(title="KL from the full model (nats)", **log_axis(), range=[np.floor(lo) - 0.2, hi + 0.45]),
        yaxis=dict(title=None, tickfont=dict(size=13), autorange="reversed"),
        legend=dict(orientation="h", yanchor="top", y=-0.14, x=0), margin=dict(t=100, b=100, r=40))
    return fig


def alpha_figure(result: ActLabResult) -> go.Figure:
    """Chat KL against SmoothQuant's alpha for one format, with the unsmoothed format as a dashed line."""
    points = result.sweep
    fig = go.Figure()
    base = result.sweep_baseline
    swept = VARIANTS[result.settings.sweep] if result.settings.sweep else None
    color = variant_color(swept)
    if base is not None:
        fig.add_hline(y=base.chat_kl, line=dict(color=MUTED, dash="dash", width=2))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="without SmoothQuant",
                                 line=dict(color=MUTED, dash="dash", width=2), hoverinfo="skip"))
    fig.add_trace(go.Scatter(
        x=[p.alpha for p in points], y=[p.chat_kl for p in points], mode="lines+markers", name="with SmoothQuant",
        line=dict(color=color, width=3), marker=dict(size=9, color=tint(color, 0.9)),
        customdata=[p.chat_top1 for p in points],
        hovertemplate="α = %{x}: chat KL %{y:.3g} · top-1 %{customdata:.1%}<extra></extra>"))
    best = result.best_alpha
    if best is not None:
        fig.add_trace(go.Scatter(x=[best.alpha], y=[best.chat_kl], mode="markers+text", name="lowest KL",
                                 marker=dict(size=16, symbol="star", color=ACCENT),
                                 text=[f"α = {best.alpha:g}"], textposition="top center", textfont=dict(size=14),
                                 hovertemplate="lowest: α = %{x}, KL %{y:.3g}<extra></extra>"))
    ys = [p.chat_kl for p in points] + ([base.chat_kl] if base else [])
    fig.update_layout(
        title=dict(text=f"SmoothQuant's α on {swept.label if swept else '—'}", subtitle=dict(
            text="s_j = max|X_j|^α / max|W_j|^(1−α): larger α moves more of the outliers into the weights")),
        xaxis=dict(title="α", dtick=0.1, range=[-0.05, 0.95]),
        yaxis=dict(title="KL on chat answers (nats)", rangemode="tozero",
                   range=[0, max(ys) * 1.12] if ys else None),
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), margin=dict(t=100, b=100))
    return fig
