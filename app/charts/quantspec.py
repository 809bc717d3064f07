"""Charts of self-speculation with a quantized KV cache: every round's drafts kept or thrown away, and the modeled
speed-up against context length."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.kv_compression.formats import FORMATS
from engine.speculative.quantspec import SelfSpecRun

from app.analysis.quantspec import draft_weights_label
from app.theme import BASELINE_COLOR, MUTED, TECHNIQUE_COLOR

FORMAT_COLORS = {"fp8": "#0072B2", "int8": TECHNIQUE_COLOR, "int4": "#E69F00", "int2": BASELINE_COLOR}
TARGET_COLOR = "#56B4E9"


def rounds_figure(run: SelfSpecRun, decode) -> go.Figure:  # noqa: ANN001 (token ids -> text)
    """One column per round: the drafts bottom-up, kept (green) or thrown away (grey, from the first miss on),
    and on top the target's own token (blue)."""
    fig = go.Figure()
    kinds = {"kept": (TECHNIQUE_COLOR, "draft kept"), "lost": ("#D1D5DB", "draft thrown away"),
             "target": (TARGET_COLOR, "the target's own token")}
    cells: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in kinds}
    for i, r in enumerate(run.rounds, start=1):
        for j, tok in enumerate(r.drafted):
            kind = "kept" if j < r.accepted else "lost"
            cells[kind][0].append(i)
            cells[kind][1].append(j + 1)
            cells[kind][2].append(decode([tok]))
        cells["target"][0].append(i)
        cells["target"][1].append(len(r.drafted) + 1)
        cells["target"][2].append(decode([r.committed[-1]]))
    for kind, (color, name) in kinds.items():
        x, y, text = cells[kind]
        fig.add_bar(x=x, y=[1] * len(x), base=[v - 1 for v in y], name=name, marker_color=color,
                    marker_line=dict(color="white", width=1), customdata=text, width=0.85,
                    hovertemplate="round %{x}: “%{customdata}”<extra>" + name + "</extra>")
    gamma = run.gamma
    fig.update_layout(
        title=dict(text=f"Every round: {FORMATS[run.kv_format].label} draft cache, "
                        f"{draft_weights_label(run.draft_weight_bits)} weights, γ = {gamma}", subtitle=dict(
            text=f"{run.accepted} of {run.drafted} drafts kept ({run.acceptance:.0%}); {len(run.rounds)} target "
                 f"passes for {sum(len(r.committed) for r in run.rounds)} tokens")),
        barmode="overlay", bargap=0.1,
        xaxis=dict(title="round (one pass of the target)", dtick=max(1, len(run.rounds) // 12)),
        yaxis=dict(title="tokens", range=[0, gamma + 1.2], dtick=1),
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), margin=dict(t=100, b=110))
    return fig


def speedup_figure(frame: pd.DataFrame) -> go.Figure:
    """Modeled speed-up over plain decoding against the context, one colour per draft format; solid with 16-bit
    draft weights, dashed with INT4 draft weights (QuantSpec's draft), each at its own measured acceptance."""
    fig = go.Figure()
    drawn: dict[tuple[int, tuple[float, ...]], str] = {}  # (weights, speed-ups) -> the format drawn with them
    for fmt, part in frame.groupby("format", sort=False):
        for bits, dash in ((16, "solid"), (4, "dash")):
            rows = part[part["weights"] == bits]
            if rows.empty:
                continue
            name = fmt.upper() + ("" if bits == 16 else ", INT4 weights")
            # FP8 and INT8 store the same bytes; at the same acceptance their lines coincide exactly. The later
            # one gets rings around its points, so that both stay visible.
            key = (bits, tuple(np.round(rows["speedup"], 9)))
            under = drawn.setdefault(key, fmt)
            marker = dict(size=6) if under == fmt else dict(size=14, symbol="circle-open", line=dict(width=2))
            if under != fmt:
                name += f" (on {under.upper()}'s line)"
            fig.add_scatter(x=rows["context"], y=rows["speedup"], mode="lines+markers", line=dict(
                color=FORMAT_COLORS[fmt], dash=dash, width=2.5), marker=marker, name=fmt.upper(),
                legendgroup=fmt, showlegend=bits == 16, customdata=np.round(rows["cost ratio"], 3),
                hovertemplate="%{x:,} tokens of context: %{y:.2f}× (a draft step reads %{customdata} of a target "
                              f"step's bytes)<extra>{name}</extra>")
    ticks = sorted(frame["context"].unique())
    # A line in the legend rather than a label on the plot, where every curve passes near 1 somewhere.
    fig.add_scatter(x=[ticks[0], ticks[-1]], y=[1, 1], mode="lines", name="plain decoding (1×)",
                    line=dict(color=MUTED, dash="dot", width=1.5), hoverinfo="skip")
    fig.update_layout(
        title=dict(text="What the measured acceptance would buy, by context", subtitle=dict(
            text="time ∝ bytes a step reads, target in bf16 · solid: the draft shares the target's weights · "
                 "dashed: INT4 (QuantSpec)")),
        xaxis=dict(title="context (tokens, log scale)", type="log", tickvals=ticks,
                   ticktext=[f"{t // 1024}k" for t in ticks]),
        yaxis=dict(title="speed-up over plain decoding", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="top", y=-0.25, x=0), margin=dict(t=110, b=110))
    return fig
