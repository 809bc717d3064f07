"""Charts of the fused low-bit decode kernel: one call's time by path, the speed-up by context, and the calls on the
device's roofline."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from kernels.ceilings import Ceilings

from app.analysis.roofline_math import log_range
from app.charts.axes import log_axis
from app.charts.quantspec import FORMAT_COLORS
from app.charts.roofline import fmt_rate
from app.theme import BASELINE_COLOR, MUTED

PATH_COLORS = {**FORMAT_COLORS, "bf16": "#56B4E9", "unfused": BASELINE_COLOR}


def call_figure(frame: pd.DataFrame, batch: int, context: int, where: str) -> go.Figure:
    """Horizontal bars: microseconds per decode attention call for each path (`app.analysis.kv_quant_kernel.call_frame`),
    labelled with the speed-up over the engine's BF16 kernel."""
    rows = frame.iloc[::-1]  # the engine's kernel on top
    engine_path = frame["path"].iloc[0]
    colors = [MUTED if p == engine_path else PATH_COLORS[f] for p, f in zip(rows["path"], rows["fmt"])]
    fig = go.Figure(go.Bar(
        x=rows["us"], y=rows["path"], orientation="h", marker_color=colors,
        text=[f"{u:,.1f} µs · {s:.2f}×" for u, s in zip(rows["us"], rows["speed-up"])], textposition="outside",
        cliponaxis=False, customdata=rows["KV read (MB)"],
        hovertemplate="%{y}: %{x:,.1f} µs a call, %{customdata:,.1f} MB of KV read<extra></extra>"))
    fig.update_layout(
        title=dict(text=f"One decode attention call: {batch} × {context:,} tokens of context",
                   subtitle=dict(text=f"{where} · one layer · ×: speed against the engine's BF16 kernel")),
        xaxis=dict(title="microseconds per call", rangemode="tozero", range=[0, 1.3 * float(frame["us"].max())]),
        yaxis=dict(title=None, automargin=True), showlegend=False, margin=dict(t=100, r=40))
    return fig


def sweep_figure(frame: pd.DataFrame, batch: int, where: str) -> go.Figure:
    """Speed-up over the engine's BF16 kernel against the context (`sweep_frame`), one colour per format; the dotted
    level of each is its bytes ratio, what a purely bandwidth-bound kernel would gain."""
    fig = go.Figure()
    ticks = sorted(frame["context"].unique())
    for fmt, part in frame.groupby("fmt", sort=False):
        color = PATH_COLORS[fmt]
        fig.add_scatter(x=part["context"], y=part["speedup"], mode="lines+markers", name=fmt.upper(),
                        legendgroup=fmt, line=dict(color=color, width=2.5), marker=dict(size=7),
                        customdata=part["us"],
                        hovertemplate="%{x:,} tokens: %{y:.2f}× (%{customdata:.1f} µs)<extra>" + fmt.upper() + "</extra>")
        ideal = float(part["ideal"].iloc[0])
        if ideal > 1.01:
            fig.add_scatter(x=[ticks[0], ticks[-1]], y=[ideal, ideal], mode="lines", legendgroup=fmt,
                            showlegend=False, line=dict(color=color, dash="dot", width=1.5),
                            hovertemplate=f"{fmt.upper()} reads 1/{ideal:.2f} of BF16's bytes<extra></extra>")
    fig.update_layout(
        title=dict(text=f"What fewer bits buy a decode step, batch {batch}",
                   subtitle=dict(text=f"{where} · dotted: the bytes ratio, a bandwidth-bound kernel's ceiling")),
        xaxis=dict(title="context per sequence (tokens, log scale)", type="log", tickvals=ticks,
                   ticktext=[f"{t // 1024}k" for t in ticks]),
        # Every line is the fused kernel, against the engine's own BF16 kernel: its BF16 line sits a little under
        # 1×, which under "speed-up over BF16" and a legend entry "BF16" read as a contradiction. (A longer axis
        # title met the subtitle at this height.)
        yaxis=dict(title="× the engine's BF16", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, title=dict(text="fused kernel reading ")),
        margin=dict(t=110, b=110))
    return fig


def roofline_figure(frame: pd.DataFrame, c: Ceilings, batch: int, context: int, where: str) -> go.Figure:
    """Each path of one call (`app.analysis.kv_quant_kernel.roofline_frame`) at its intensity (FLOPs per pool byte)
    and achieved FLOP/s, under the bandwidth roof β·I: fewer bytes move a point right, and it stays on the roof
    only if the kernel is still waiting for memory."""
    x_lo, x_hi = 1.0, 4 * float(frame["intensity"].max())
    xs = log_range(x_lo, x_hi)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[c.attainable(x) for x in xs], mode="lines", name=f"bandwidth roof β·I, β = "
                    f"{fmt_rate(c.peak_bytes_per_s, 'B/s')}", line=dict(color="#111827", width=3), hoverinfo="skip")
    for row in frame.itertuples():
        color = MUTED if row.path == frame["path"].iloc[0] else PATH_COLORS[row.fmt]
        # FP8 and INT8 read the same bytes, so they share an intensity: the lower point is labelled below, the
        # other above.
        at = round(row.intensity, 3)
        twin = frame[(frame["intensity"].round(3) == at)]
        below = len(twin) == 1 or row.flops_per_s <= float(twin["flops_per_s"].min())
        # The upper twin is a ring round the lower one's dot: as two filled dots a few pixels apart, the one drawn
        # second hid the other.
        marker = (dict(size=15, color=color, line=dict(color="#1F2937", width=1)) if below else
                  dict(size=24, symbol="circle-open", color=color, line=dict(color=color, width=3)))
        fig.add_scatter(x=[row.intensity], y=[row.flops_per_s], mode="markers+text", name=row.path,
                        text=[f"{row.fmt.upper()} {row.of_roof:.0%}"],
                        textposition="bottom center" if below else "top center", marker=marker,
                        hovertemplate=f"{row.path}: I = %{{x:.2f}} FLOP/B, %{{y:.3s}}FLOP/s, {row.of_roof:.0%} of the "
                                      "roof there<extra></extra>")
    y_hi = c.attainable(x_hi) * 1.5
    y_lo = float(frame["flops_per_s"].min()) / 3
    fig.update_xaxes(**log_axis(), range=[math.log10(x_lo), math.log10(x_hi)],
                     title_text="FLOPs per byte of KV read (log)")
    fig.update_yaxes(**log_axis(si=True), range=[math.log10(y_lo), math.log10(y_hi)],
                     title_text="achieved FLOP/s (log)")
    # At 1024 pixels with the sidebar open the subtitle ran past the chart's edge: the compute roof, far above the
    # plot, is named in the caption under the chart (kv_quant_kernel section).
    fig.update_layout(
        title=dict(text=f"The same call on the roofline: {batch} × {context:,} tokens",
                   subtitle=dict(text=f"{where} · %: of the bandwidth roof at that intensity")),
        legend=dict(orientation="h", yanchor="top", y=-0.25, x=0), margin=dict(t=110, b=120))
    return fig
