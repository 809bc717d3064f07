"""Static vs continuous batching on the same requests: latency per request and throughput."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.analysis.policy_compare import PolicyRun
from app.analysis.trace_metrics import request_latencies, throughput
from app.theme import BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

# The app's comparison pair, not a phase or request colour: continuous in decode blue sat under a Gantt whose
# blue means "decode", and static in pink was request r3's colour.
POLICY_COLORS: dict[str, str] = {"static": BASELINE_COLOR, "continuous": TECHNIQUE_COLOR}


def latency_comparison(runs: dict[str, PolicyRun]) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, column_widths=[0.42, 0.42, 0.16], horizontal_spacing=0.07,
                        subplot_titles=("End-to-end latency per request", "Time to first token", "Throughput"))
    for policy, run in runs.items():
        lat = request_latencies(list(run.records))
        color = POLICY_COLORS.get(policy, MUTED)
        ids = [x.request_id for x in lat]
        fig.add_bar(x=ids, y=[x.e2e_s for x in lat], name=policy, marker_color=color, legendgroup=policy,
                    hovertemplate="%{x}: %{y:.2f} s<extra>" + policy + "</extra>", row=1, col=1)
        fig.add_bar(x=ids, y=[x.ttft_s for x in lat], name=policy, marker_color=color, legendgroup=policy,
                    showlegend=False, hovertemplate="%{x}: %{y:.2f} s<extra>" + policy + "</extra>", row=1, col=2)
        tps = throughput(list(run.records))
        fig.add_bar(x=[policy], y=[tps], marker_color=color, showlegend=False, text=[f"{tps:.1f}"],
                    textposition="outside", hovertemplate="%{y:.2f} tokens/s<extra></extra>", row=1, col=3)
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=2)
    fig.update_yaxes(title_text="output tokens / s", row=1, col=3, rangemode="tozero")
    # Subplot titles sit where a top legend would go: put the legend under the plots instead.
    fig.update_layout(barmode="group", legend=dict(yanchor="top", y=-0.12, xanchor="left", x=0.0),
                      margin=dict(t=60, b=70))
    return fig
