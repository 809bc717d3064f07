"""Charts of the weight-only quantization page: size against quality, each method's error layer by layer,
AWQ's chosen scaling, and the activation outliers that make some weights matter more than others."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.weight_quant.lab import METHOD_LABELS, LabResult

from app.analysis.weight_quant import INPUT_LABELS
from app.charts.axes import log_axis
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR, titled_top_margin

METHOD_COLORS = {"Round-to-nearest": BASELINE_COLOR, "AWQ": ACCENT, "GPTQ": TECHNIQUE_COLOR,
                 "GPTQ act-order": "#0072B2"}  # Okabe-Ito blue
REFERENCE_COLOR = MUTED


def method_color(method: str | None) -> str:
    return REFERENCE_COLOR if method is None else METHOD_COLORS[METHOD_LABELS[method]]


DOMAIN_LABELS = {"chat": "chat answers (the fine-tune's behaviour)", "prose": "prose"}
DOMAIN_COLORS = {"chat": "#0072B2", "prose": "#56B4E9"}


def quality_figure(result: LabResult) -> go.Figure:
    """KL from the full model per quantized checkpoint on each kind of held-out text; the label on each bar is
    the top-1 agreement. (Every checkpoint of one run has the same size, so size is not an axis here.)"""
    fig = go.Figure()
    names = [v.label.split(" · ")[0] for v in result.variants]
    for domain, label in DOMAIN_LABELS.items():
        scores = [v.scores[domain] for v in result.variants]
        fig.add_trace(go.Bar(
            x=names, y=[sc.kl for sc in scores], name=label, marker=dict(color=DOMAIN_COLORS[domain]),
            text=[f"{sc.top1:.0%}" for sc in scores], textposition="outside", cliponaxis=False,
            hovertemplate=[f"<b>{v.label}</b> · {label}<br>KL {sc.kl:.3g} nats per token<br>top-1 agreement "
                           f"{sc.top1:.1%}<br>perplexity {sc.perplexity:.2f}<extra></extra>"
                           for v, sc in zip(result.variants, scores)]))
    top = max((v.scores[d].kl for v in result.variants for d in DOMAIN_LABELS), default=1.0)
    fig.update_layout(
        barmode="group",
        title=dict(text="Distance from the full model on held-out text", subtitle=dict(
            text="Mean KL per token (the full model: 0); on each bar, how often its top token is the full model's")),
        yaxis=dict(title="KL from the full model (nats)", range=[0, top * 1.2]), xaxis=dict(title=None),
        legend=dict(orientation="h", yanchor="top", y=-0.12, x=0), margin=dict(t=100, b=80))
    return fig


def layer_error_figure(frame: pd.DataFrame) -> go.Figure:
    """Relative output error of each layer input's linears, layer by layer, one line per method."""
    inputs = list(INPUT_LABELS)
    fig = make_subplots(rows=1, cols=4, shared_yaxes=True, horizontal_spacing=0.025,
                        subplot_titles=[INPUT_LABELS[i].split(" (")[0] for i in inputs])
    for method, sub in frame.groupby("method", sort=False):
        for c, inp in enumerate(inputs, start=1):
            rows = sub[sub["input"] == inp]
            fig.add_trace(go.Scatter(x=rows["layer"], y=rows["rel_error"], mode="lines", name=method,
                                     line=dict(color=METHOD_COLORS[method], width=2), legendgroup=method,
                                     showlegend=c == 1,
                                     hovertemplate=f"{method} · layer %{{x}} · {inp}: %{{y:.1%}}<extra></extra>"),
                          row=1, col=c)
        fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_yaxes(title_text="output error ‖XΔWᵀ‖ / ‖XWᵀ‖", tickformat=".0%", row=1, col=1)
    fig.update_layout(title=dict(text="Where the error goes, layer by layer", subtitle=dict(
        text="On the calibration inputs each layer really sees (the layers before it already quantized)")),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=titled_top_margin(), b=90))
    return fig


def alpha_figure(frame: pd.DataFrame) -> go.Figure:
    """AWQ's chosen alpha per layer and input (0: plain round-to-nearest was best)."""
    awq = frame[frame["method"] == "AWQ"]
    inputs = list(INPUT_LABELS)
    z = np.full((len(inputs), int(awq["layer"].max()) + 1 if len(awq) else 1), np.nan)
    for _, r in awq.iterrows():
        z[inputs.index(r["input"]), int(r["layer"])] = r["alpha"]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(z.shape[1])), y=[INPUT_LABELS[i].split(" (")[0] for i in inputs],
                               zmin=0, zmax=0.9, colorscale="Oranges", colorbar=dict(title="α", thickness=12),
                               hovertemplate="layer %{x} · %{y}: α = %{z}<extra></extra>"))
    fig.update_layout(title=dict(text="AWQ's search: how hard each input's salient channels are protected",
                                 subtitle=dict(text="s = mean|x|^α per input channel; α = 0 is round-to-nearest")),
                      xaxis=dict(title="layer"), margin=dict(t=100))
    return fig


def activation_figure(magnitudes: np.ndarray, top: int, layer: int, inp: str, ratio: float) -> go.Figure:
    """Mean |x| of every input channel of one layer input; the `top` largest in the accent colour."""
    order = np.argsort(magnitudes)[::-1]
    salient = set(order[:top].tolist())
    colors = [ACCENT if j in salient else REFERENCE_COLOR for j in range(len(magnitudes))]
    fig = go.Figure(go.Bar(x=np.arange(len(magnitudes)), y=magnitudes, marker=dict(color=colors, line=dict(width=0)),
                           hovertemplate="channel %{x}: mean |x| = %{y:.3g}<extra></extra>"))
    fig.update_layout(
        title=dict(text=f"Layer {layer}, {INPUT_LABELS[inp]}: mean |x| per input channel", subtitle=dict(
            text=f"On the calibration tokens: the largest is {ratio:,.0f}× the median; the top {top} (1 %) in "
                 "orange")),
        # "On the calibration tokens" in the subtitle, not the y-axis title: in presentation mode at 1024 pixels
        # that title ran up past the plot into the subtitle.
        xaxis=dict(title="input channel"), yaxis=dict(title="mean |x|", **log_axis()),
        bargap=0, margin=dict(t=100))
    return fig


def bits_sweep_figure(frame: pd.DataFrame) -> go.Figure:
    """Bits per weight (x) against KL on held-out chat answers (y, log), a line per method and calibration set."""
    fig = go.Figure()
    for (method, calibration), rows in frame.groupby(["method", "calibration"], sort=False):
        rows = rows.sort_values("bits_per_weight")
        fig.add_trace(go.Scatter(
            x=rows["bits_per_weight"], y=rows["chat_kl"], mode="lines+markers", name=f"{method}, {calibration}",
            line=dict(color=METHOD_COLORS[method], dash="solid" if calibration == "chat" else "dot", width=2),
            marker=dict(size=8), customdata=np.stack([rows["mib"], rows["chat_top1"]], axis=1),
            hovertemplate=(f"<b>{method}</b>, calibrated on {calibration}<br>%{{x:.2f}} bits per weight, "
                           "%{customdata[0]:.0f} MiB<br>chat KL %{y:.3g} · top-1 %{customdata[1]:.1%}"
                           "<extra></extra>")))
    fig.update_layout(
        title=dict(text="Every bit width, measured earlier", subtitle=dict(
            text="Solid: calibrated on chat answers · dotted: on prose · groups of 64")),
        xaxis=dict(title="bits per linear weight (scales and zero points included)", autorange="reversed"),
        yaxis=dict(title="KL on chat answers (nats)", **log_axis()),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=110, b=110))
    return fig
