"""The scenario's decode steps on each kernel path: every step's wall time, and the median."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from app.analysis.kernel_paths import PathRun
from app.charts.axes import log_axis
from app.theme import MUTED

PATH_COLORS = {"torch": "#6B7280", "triton": "#E69F00", "graphs": "#009E73"}


def kernel_path_chart(runs: list[PathRun]) -> go.Figure:
    """One row per path: a dot per decode step (a CUDA graph's first replay at a batch size includes
    capturing it, so that dot sits apart) and a bar at the median, written under the path's name."""
    fig = go.Figure()
    labels = [r.path.label for r in runs]
    times = [t for r in runs for t in r.decode_ms if t > 0]
    lo, hi = (min(times), max(times)) if times else (0.1, 10.0)
    for r in runs:
        color = PATH_COLORS.get(r.path.key, MUTED)
        fig.add_scatter(y=[r.path.label] * len(r.decode_ms), x=list(r.decode_ms), mode="markers",
                        marker=dict(color=color, size=7, opacity=0.55), showlegend=False,
                        customdata=list(range(1, len(r.decode_ms) + 1)),
                        hovertemplate="decode step %{customdata}: %{x:.3g} ms<extra></extra>")
        fig.add_scatter(y=[r.path.label], x=[r.median_decode_ms], mode="markers",
                        marker=dict(symbol="line-ns", size=30, line=dict(color=color, width=4)), showlegend=False,
                        hovertemplate=f"{r.path.label}: median %{{x:.3g}} ms per decode step<extra></extra>")
    # Powers of ten only when the paths span one (a GPU's 1 ms against 50 ms); a single CPU path's few
    # milliseconds keep Plotly's in-between ticks, or the axis would carry no label at all.
    wide = hi / lo * 1.6 ** 2 > 10
    fig.update_xaxes(**(log_axis() if wide else {"type": "log", "tickformat": "~g"}),
                     title_text="milliseconds per decode step (log)", range=[math.log10(lo / 1.6), math.log10(hi * 1.6)])
    # Each row's median goes under its name, where no long step can push it off the plot.
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], title_text=None, tickvals=labels,
                     ticktext=[f"{r.path.label}<br>" + (f"<b>median {r.median_decode_ms:.3g} ms</b> · "
                                                          f"{r.decode_tokens_per_s:,.0f} tok/s" if r.decode_ms else
                                                          "no decode step") for r in runs])
    fig.update_layout(title="Every decode step of the scenario, per kernel path", margin=dict(l=10))
    return fig
