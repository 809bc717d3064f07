"""Charts of the KV cache quantization and eviction page: memory against quality, the distance from the
reference token by token, why keys are harder to quantize than values, which tokens each eviction policy
keeps, and the attention sink that makes the first tokens worth keeping."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from engine.kv_compression import FORMATS, LabResult

from app.charts.axes import decade_ticks, index_ticks, log_axis, nice_at_least, one_two_five_ticks
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

# Okabe-Ito, in the order variants are listed (the reference is grey).
VARIANT_COLORS = ("#0072B2", ACCENT, TECHNIQUE_COLOR, BASELINE_COLOR, "#E69F00", "#56B4E9")
REFERENCE_COLOR = MUTED
KL_FLOOR = 1e-6  # a KL of zero (the reference, an exact copy) is drawn here on the log axis
TRADEOFF_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "hexagon", "star", "triangle-down", "cross")


def variant_color(i: int) -> str:
    """i: the variant's place in the result (0 = the reference)."""
    return REFERENCE_COLOR if i == 0 else VARIANT_COLORS[(i - 1) % len(VARIANT_COLORS)]


def short_label(label: str) -> str:
    """"INT2 KIVI (keys per channel)" -> "INT2 KIVI": axis labels that stay horizontal."""
    return label.split(" (")[0]


def _covers_earlier(xs: list[float], ys: list[float], i: int) -> bool:
    """Whether point i lands on an earlier point as the log axes draw it: within ~5 % in size, ~25 % in KL."""
    return any(abs(math.log10(xs[i] / xs[j])) < 0.02 and abs(math.log10(ys[i] / ys[j])) < 0.1 for j in range(i))


def tradeoff_figure(result: LabResult) -> go.Figure:
    """Cache size after the run (x, log) against mean KL from the reference (y, log): down and left is better.
    Size, not bytes per token, so quantization and eviction land on one axis."""
    fig = go.Figure()
    kib = [float(r.cache_bytes[-1]) / 1024 for r in result.variants]
    # An exact zero (the reference) one decade under the smallest KL's decade, on a tick reading "0": at a
    # fixed 1e-6 it stretched the axis over seven decades and squeezed the evicting variants (KL 0.6 to 3, one
    # size) into one spot.
    nonzero = [r.mean_kl for r in result.variants if r.mean_kl > 0]
    zero = 10.0 ** (math.floor(math.log10(min(nonzero))) - 1) if nonzero else KL_FLOOR
    kls = [r.mean_kl if r.mean_kl > 0 else zero for r in result.variants]
    for i, r in enumerate(result.variants):
        # Labels alternate right and left: variants of equal size (FP8 and INT8) sit on one vertical line.
        fig.add_trace(go.Scatter(
            x=[kib[i]], y=[kls[i]], mode="markers+text", name=r.variant.label,
            # A shape each, and a smaller marker over an earlier one at the same spot: variants of one size and
            # nearly one KL (FP8 and INT8) sat on one spot, and a circle drawn over an equal circle hid the first.
            marker=dict(size=10 if _covers_earlier(kib, kls, i) else 16, color=variant_color(i),
                        symbol=TRADEOFF_SYMBOLS[i % len(TRADEOFF_SYMBOLS)],
                        line=dict(width=1, color="white")),
            text=[f"{r.top1_agreement:.0%}"], textposition="middle right" if i % 2 == 0 else "middle left",
            showlegend=True,
            hovertemplate=(f"<b>{r.variant.label}</b><br>%{{x:,.0f}} KiB, {int(r.cached_tokens[-1])} tokens"
                           f"<br>mean KL {r.mean_kl:.2g} nats<br>top-1 agreement {r.top1_agreement:.0%}<extra></extra>")))
    fig.update_layout(title=dict(text="Memory against quality", subtitle=dict(
        text="Each point a cache variant; the label is how often its top token was the reference's")),
        xaxis=dict(title="cache after the run (KiB: K and V of every layer, scales included)",
                   **{**log_axis(), **one_two_five_ticks(min(kib) / 10 ** 0.15, max(kib) * 10 ** 0.15)},
                   range=[math.log10(min(kib)) - 0.15, math.log10(max(kib)) + 0.15]),
        yaxis=dict(title="mean KL from the reference (nats)",
                   **{**log_axis(), **decade_ticks(min(kls) / 10 ** 0.5, max(kls) * 10 ** 0.5,
                                                   zero_at=zero if len(nonzero) < len(kls) else None)},
                   range=[math.log10(min(kls)) - 0.5, math.log10(max(kls)) + 0.5]))
    return fig


def kl_positions_figure(result: LabResult, token_text: Callable[[int], str]) -> go.Figure:
    """KL(reference || variant) at every generated position, each variant fed the reference's tokens."""
    fig = go.Figure()
    ref = result.reference_tokens
    every_y: list[float] = []
    for i, r in enumerate(result.variants):
        if r.is_reference:
            continue
        steps = list(range(1, len(r.kl)))  # step 0 is the prefill's prediction, before any compression
        ys = [max(float(k), KL_FLOOR) for k in r.kl[1:]]
        every_y += ys
        agree = r.matches[1:]
        hover = [f"token {s + 1}: {token_text(ref[s])!r} · KL {r.kl[s]:.2g}"
                 + ("" if a else f" · its top: {token_text(int(r.forced_argmax[s]))!r}") for s, a in zip(steps, agree)]
        # Counted from 1, as the summary table's "Differs at" counts.
        fig.add_trace(go.Scatter(x=[s + 1 for s in steps], y=ys, mode="lines+markers", name=r.variant.label,
                                 line=dict(color=variant_color(i), width=2),
                                 marker=dict(size=[6 if a else 11 for a in agree],
                                             symbol=["circle" if a else "x" for a in agree]),
                                 customdata=hover, hovertemplate="%{customdata}<extra>" + r.variant.label + "</extra>"))
    fig.update_layout(title=dict(text="How far each cache moved the next-token distribution", subtitle=dict(
        text="Every variant fed the reference's text; × = its top token was a different one")),
        # No "0" tick on an axis counted from 1 (token 1, the prefill's own, has no point: nothing was compressed yet).
        xaxis=dict(title="generated token", range=[0.5, len(ref) + 0.5], **index_ticks(len(ref) + 1)),
        yaxis=dict(title="KL from the reference (nats)", **log_axis(),
                   # Padded a decade each way, about where Plotly's own range would end.
                   **(decade_ticks(min(every_y) / 10, max(every_y) * 10) if every_y else {})))
    return fig


def channel_figure(result: LabResult) -> go.Figure:
    """Largest |K| and |V| per channel (x) and layer (y), one colour scale: keys have outlier channels."""
    top = float(max(result.key_absmax.max(), result.value_absmax.max()))
    # Axis titles name the panels: subplot titles would sit on the chart's subtitle.
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04)
    for col, data, name in ((1, result.key_absmax, "key channel (after RoPE)"), (2, result.value_absmax, "value channel")):
        fig.add_trace(go.Heatmap(z=data, zmin=0, zmax=top, colorscale="Viridis", showscale=col == 2,
                                 colorbar=dict(title="max |x|"),
                                 hovertemplate="layer %{y}, channel %{x}: max |x| %{z:.2f}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text=name, row=1, col=col, **index_ticks(data.shape[1], max_labels=8))
    fig.update_yaxes(title_text="layer", row=1, col=1, autorange="reversed")
    fig.update_layout(title=dict(text="Where the large numbers are", subtitle=dict(
        text="Largest |x| per channel and layer in the reference's cache: keys have a few bright channels")))
    return fig


def roundtrip_figure(result: LabResult, formats: Sequence[str]) -> go.Figure:
    """Relative error of storing the reference's K and V in each format (mean over layers), log scale. Horizontal
    bars: each label at the end of its own bar, where upright grouped bars put "50.9%" and "42.5%" side by side
    until they ran together."""
    names = [f for f in formats if FORMATS[f].compressed]
    labels = [short_label(FORMATS[f].label) for f in names]
    fig = go.Figure()
    every: list[float] = []
    for j, (part, color) in enumerate((("keys", "#0072B2"), ("values", ACCENT))):
        xs = [float(result.roundtrip_error[f][j].mean()) for f in names]
        every += xs
        fig.add_trace(go.Bar(y=labels, x=xs, orientation="h", name=part, marker_color=color,
                             text=[f"{x:.1%}" for x in xs], textposition="outside", cliponaxis=False,
                             hovertemplate="%{y}: " + part + " %{x:.2%} relative error<extra></extra>"))
    positive = [x for x in every if x > 0] or [1e-3, 1.0]
    fig.update_layout(barmode="group", title=dict(text="Error of storing the cache in each format", subtitle=dict(
        text="‖stored − exact‖ / ‖exact‖ on the reference's own cache, mean over layers")),
        # Room right of the longest bar for its label (a log axis has no headroom of its own).
        xaxis=dict(title="relative error", **log_axis(),
                   range=[math.log10(min(positive)) - 0.3, math.log10(max(positive)) + 0.45]),
        yaxis=dict(title=None, autorange="reversed"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, traceorder="normal"), margin=dict(t=110))
    return fig


EVICTED_COLOR = "#F1F3F6"
HELD_BLUES = ["#9ECAE1", "#4292C6", "#08306B"]  # one head holding it ... every head


def head_count_scale(heads: int) -> list[list]:
    """One flat band per head count 0..heads (for zmin -0.5, zmax heads + 0.5): pale grey for none, then blues. A
    smooth scale gave "none" the bottom 1 % of its colour bar, which read as light blue beside a caption that
    said "white"."""
    blues = sample_colorscale(HELD_BLUES, np.linspace(0.0, 1.0, heads).tolist()) if heads else []
    bands = [EVICTED_COLOR, *blues]
    return [[edge / (heads + 1), color] for k, color in enumerate(bands) for edge in (k, k + 1)]


def kept_map_figure(counts: np.ndarray, labels: Sequence[str], prompt_len: int, heads: int, title: str) -> go.Figure:
    """counts [layers, positions]: how many KV heads of each layer still hold each position."""
    layers, n = counts.shape
    fig = go.Figure(go.Heatmap(
        z=counts, zmin=-0.5, zmax=heads + 0.5, colorscale=head_count_scale(heads), xgap=0, ygap=1,
        customdata=np.tile(np.array(labels, dtype=object), (layers, 1)),
        colorbar=dict(title=dict(text="KV heads holding it", side="right"), tickvals=list(range(heads + 1))),
        hovertemplate="layer %{y}, position %{x} %{customdata}: held by %{z} of " + str(heads) + " heads<extra></extra>"))
    fig.add_vline(x=prompt_len - 0.5, line=dict(color=ACCENT, width=2, dash="dot"))
    fig.add_annotation(x=prompt_len - 0.5, y=-0.5, yref="y", text="generated →", showarrow=False, xanchor="left",
                       yanchor="bottom", font=dict(color=ACCENT))
    fig.update_layout(title=dict(text=title, subtitle=dict(
        text="Each cell a cached token of one layer; pale grey = evicted from every head")),
        xaxis=dict(title="position in the sequence", **index_ticks(n)),
        yaxis=dict(title="layer", autorange="reversed"))
    return fig


def share_ticks(top: float, ticks: int = 5) -> dict:
    """Round ticks (a 1-2-5 step) from 0 on a share axis reaching `top`, with as many decimals of a percent as
    the step needs: ".0%" wrote ticks 0.5 % apart as "0%, 1%, 1%, 2%, 2%"."""
    step = nice_at_least(max(top, 1e-6) / ticks)
    decimals = max(0, -math.floor(math.log10(100 * step) + 1e-9))
    return {"tickmode": "linear", "tick0": 0, "dtick": step, "tickformat": f".{decimals}%"}


def share_text(x: float) -> str:
    """A share with the decimals a small one needs ("0.3%", not "0%")."""
    return f"{x:.0%}" if x >= 0.1 else f"{x:.1%}" if x >= 0.001 else f"{x:.2%}"


def sink_figure(result: LabResult, layer: int, labels: Sequence[str]) -> go.Figure:
    """Left: the attention generated tokens put on position 0, per layer. Right: one layer's attention of the
    last generated token over every position, position 0 marked."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.42, 0.58], horizontal_spacing=0.1)
    share = result.sink_share
    fig.add_trace(go.Bar(x=list(range(len(share))), y=share, showlegend=False,
                         marker_color=[ACCENT if i == layer else "#0072B2" for i in range(len(share))],
                         hovertemplate="layer %{x}: %{y:.1%} of the attention on position 0<extra></extra>"),
                  row=1, col=1)
    row = result.last_attention[layer]
    n = len(row)
    fig.add_trace(go.Scatter(x=list(range(n)), y=row, mode="lines", showlegend=False,
                             line=dict(color="#0072B2", width=1.5), customdata=list(labels[:n]),
                             hovertemplate="position %{x} %{customdata}: %{y:.1%}<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(x=[0], y=[row[0]], mode="markers", showlegend=False,
                             marker=dict(size=12, color=ACCENT, symbol="diamond"),
                             hovertemplate=f"position 0 {labels[0] if labels else ''}: %{{y:.1%}}<extra></extra>"),
                  row=1, col=2)
    # Beside the marker when position 0 stands above the rest (the sink); above it, on a white ground, when the
    # line runs at its height: there "position 0: 0%" was drawn on the line itself.
    sink = n < 2 or float(row[0]) >= 1.5 * float(row[1:].max())
    fig.add_annotation(x=0, y=float(row[0]), xref="x2", yref="y2", text=f"position 0: {share_text(float(row[0]))}",
                       showarrow=True, ax=60 if sink else 40, ay=0 if sink else -45, xanchor="left",
                       font=dict(color=ACCENT), bgcolor="rgba(255,255,255,0.85)")
    fig.update_xaxes(title_text="layer", row=1, col=1, **index_ticks(len(share)))
    fig.update_xaxes(title_text="position", row=1, col=2, range=[-0.03 * n, n], **index_ticks(n))
    fig.update_yaxes(title_text="attention on position 0", rangemode="tozero", row=1, col=1,
                     **share_ticks(float(share.max()) if len(share) else 0.0))
    # The right panel's axis on its right: on the left, its title sat over the left panel's bars at 1024 pixels.
    fig.update_yaxes(title_text=f"last token's attention, layer {layer}", rangemode="tozero", side="right",
                     automargin=True, row=1, col=2, **share_ticks(float(row.max()) if n else 0.0))
    # At 1024 pixels with the sidebar open the subtitle ran past the chart's edge, so "reference cache" moved to
    # the caption under the chart.
    fig.update_layout(title=dict(text="The attention sink", subtitle=dict(
        text="Left: per layer, mean over generated tokens and heads · right: the orange layer, last token only")))
    return fig
