"""Charts of the merge-or-serve page: the decode step of each deployment split by kernel kind, the adapter's
update layer by layer, the singular values of one update against its weight's, the memory of N fine-tunes
either way, and the bench's extra step time at every rank."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.lora.anatomy import Spectrum
from engine.lora.merge_lab import MergeResult

from app.analysis.lora_merge import PARTS, Deployment, breakdown
from app.charts.axes import log_axis
from app.formatting import GIB, fmt_bytes
from app.theme import ACCENT, BASELINE_COLOR, MUTED, TECHNIQUE_COLOR, titled_top_margin

# Merged and unmerged are the page's A/B pair; the base model is the neutral reference.
WAY_COLORS = {"base": MUTED, "merged": BASELINE_COLOR, "unmerged": TECHNIQUE_COLOR}
WAY_LABELS = {"base": "Base model (no adapter)", "merged": "Merged: W′ = W + (α/r)·BA",
              "unmerged": "Unmerged: Wx + (α/r)·B(Ax)"}
# A step's parts: greys for what both deployments run, the accent for the LoRA kernels only one of them runs.
PART_COLORS = dict(zip(PARTS, ("#4B5563", ACCENT, "#9CA3AF", "#D1D5DB", "#EEF0F3")))
# The bench's ranks, smallest first: hues apart for normal and red-green colour-blind vision alike (tints of one
# orange left rank 8 and rank 16 on the CPU nearly the same line). Device is the dash, not the colour.
RANK_COLORS = ("#0072B2", "#E69F00", "#000000", "#882255", "#44AA99", "#56B4E9")


def step_time_figure(result: MergeResult) -> go.Figure:
    """Median decode step per batch size, merged beside unmerged, stacked by what the time went to."""
    batches = result.settings.batch_sizes
    cats: list[list[str]] = [[], []]
    parts = {p: [] for p in PARTS}
    totals, labels = [], []
    for b in batches:
        m = result.timing("merged", b)
        for way in ("merged", "unmerged"):
            t = result.timing(way, b)
            cats[0].append(f"batch {b}")
            cats[1].append(way)
            for p, secs in breakdown(t).items():
                parts[p].append(secs * 1e3)
            totals.append(t.median * 1e3)
            labels.append(f"{t.median * 1e3:.3g} ms" if way == "merged"
                          else f"{t.median * 1e3:.3g} ms<br><b>{t.median / m.median - 1:+.0%}</b>")
    fig = go.Figure()
    for p in PARTS:
        fig.add_trace(go.Bar(
            x=cats, y=parts[p], name=p, marker=dict(color=PART_COLORS[p], line=dict(color="#9CA3AF", width=0.5)),
            hovertemplate=f"{p}: %{{y:.3g}} ms<extra>%{{x}}</extra>"))
    # The totals as text above each bar (a transparent bar on top: a stacked bar's own text would sit inside).
    fig.add_trace(go.Scatter(x=cats, y=totals, mode="text", text=labels, textposition="top center",
                             showlegend=False, hoverinfo="skip", cliponaxis=False))
    top = max(totals, default=1.0)
    fig.update_layout(
        barmode="stack", bargap=0.25,
        title=dict(text="One decode step, merged and unmerged", subtitle=dict(
            text="Height and label: the median step; its parts are their shares of a profiled step; "
                 "bold: unmerged's extra time")),
        yaxis=dict(title="ms per decode step", range=[0, top * 1.3]),
        xaxis=dict(title=None, tickfont=dict(size=14)),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, traceorder="normal"), margin=dict(t=110, b=120))
    return fig


def anatomy_figure(result: MergeResult) -> go.Figure:
    """||dW||_F / ||W||_F per layer (x) and linear (y); blank where the adapter leaves the linear alone."""
    anat = result.anatomy
    z = anat.rel_norm.T
    fig = go.Figure(go.Heatmap(
        z=z, x=np.arange(z.shape[1]), y=[f"{t}_proj" for t in anat.targets], colorscale="Oranges", zmin=0,
        colorbar=dict(title=dict(text="‖ΔW‖ / ‖W‖", side="top"), tickformat=".1%", thickness=14),
        hovertemplate="layer %{x} · %{y}: ‖ΔW‖ / ‖W‖ = %{z:.2%}<extra></extra>", xgap=1, ygap=1))
    untouched = [t for j, t in enumerate(anat.targets) if np.isnan(z[j]).all()]
    sub = (f"Frobenius norms, ΔW = (α/r)·BA with r = {result.rank}, α = {result.alpha:g}"
           + (f"; blank rows: not adapted ({', '.join(untouched)})" if untouched else ""))
    fig.update_layout(title=dict(text="How much the adapter changes each weight", subtitle=dict(text=sub)),
                      xaxis=dict(title="layer", dtick=2, showgrid=False),
                      yaxis=dict(autorange="reversed", showgrid=False), plot_bgcolor="#F9FAFB", margin=dict(t=100))
    return fig


def spectrum_figure(sp: Spectrum) -> go.Figure:
    """Singular values of W and of dW, largest first, on a log axis; a line after the r-th."""
    fig = go.Figure()
    k = np.arange(1, len(sp.weight) + 1)
    fig.add_trace(go.Scatter(x=k, y=sp.weight, mode="lines", name="W (the base weight)",
                             line=dict(color=MUTED, width=2.5),
                             hovertemplate="W: σ<sub>%{x}</sub> = %{y:.3g}<extra></extra>"))
    floor = max(float(sp.delta[0]) * 1e-12, 1e-30) if len(sp.delta) else 1e-30
    kd = np.arange(1, len(sp.delta) + 1)
    fig.add_trace(go.Scatter(x=kd, y=np.maximum(sp.delta, floor), mode="lines+markers", name="ΔW = (α/r)·BA",
                             line=dict(color=ACCENT, width=2.5), marker=dict(size=np.where(kd <= sp.rank, 7, 0)),
                             hovertemplate="ΔW: σ<sub>%{x}</sub> = %{y:.3g}<extra></extra>"))
    fig.add_vline(x=sp.rank + 0.5, line=dict(color=ACCENT, dash="dash", width=1.5))
    fig.add_annotation(x=np.log10(sp.rank + 0.5), xref="x", y=1.0, yref="paper", yanchor="bottom",
                       text=f"r = {sp.rank}", showarrow=False, font=dict(color=ACCENT))
    fig.update_layout(
        title=dict(text=f"Layer {sp.layer}, {sp.target}_proj: singular values", subtitle=dict(
            text=f"ΔW has {sp.numerical_rank} above 10⁻⁴ of its largest; past r they are rounding dust "
                 f"(σ<sub>{sp.rank + 1}</sub>/σ<sub>1</sub> = {sp.tail_ratio:.1e})")),
        xaxis=dict(title="index (largest first)", **log_axis()),
        yaxis=dict(title="singular value", type="log", dtick=3, exponentformat="power", showexponent="all",
                   minor=dict(dtick=1, showgrid=True, gridcolor="rgba(0,0,0,0.04)")),
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), margin=dict(t=titled_top_margin(), b=110))
    return fig


def memory_figure(frame: pd.DataFrame, live: Deployment, big: Deployment, memory: float) -> go.Figure:
    """Weight memory of N fine-tunes, merged (N checkpoints) against unmerged (one base and N adapters), for
    the live model and a larger one of the same family; the H200's memory as a line."""
    fig = go.Figure()
    for d, dash in ((live, "solid"), (big, "dot")):
        for way in ("merged", "unmerged"):
            rows = frame[(frame["model"] == d.model) & (frame["way"] == way)]
            what = "N checkpoints" if way == "merged" else "one base + N adapters"
            fig.add_trace(go.Scatter(
                x=rows["n"], y=rows["bytes"] / GIB, mode="lines", name=f"{d.model}, {way} ({what})",
                line=dict(color=WAY_COLORS[way], dash=dash, width=3 if d is live else 2),
                hovertemplate=f"<b>{d.model}</b>, {way}<br>%{{x}} fine-tunes: %{{y:,.3g}} GiB<extra></extra>"))
    fig.add_hline(y=memory / GIB, line=dict(color="#111827", dash="dash", width=1.5))
    # The capacity the fits are divided by, to the decimal: "140 GiB" beside "557 merged" (139.8 / 0.2506) read
    # as a division that came out one short.
    fig.add_annotation(x=0, xref="paper", xanchor="left", y=np.log10(memory / GIB), yref="y", yanchor="bottom",
                       text=f"one H200: {fmt_bytes(memory)}", showarrow=False)
    fig.update_layout(
        title=dict(text="Weights in memory for N fine-tunes", subtitle=dict(
            text="bf16; solid: this model's real tensors · dotted: an 8B model, same adapter shape, from its "
                 "shape alone")),
        xaxis=dict(title="fine-tunes served (N)", **log_axis()),
        yaxis=dict(title="GiB of weights", **log_axis()),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=110, b=140))
    return fig


def bench_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Extra decode-step time of the unmerged adapter (y) against batch size (x), a line per rank, solid on
    the CPU and dashed on the GPU."""
    fig = go.Figure()
    ranks = sorted({int(r) for f in frames.values() for r in f["rank"]})
    shades = {r: RANK_COLORS[i % len(RANK_COLORS)] for i, r in enumerate(ranks)}
    for label, frame in frames.items():
        dash = "solid" if label.startswith("CPU") else "dash"
        for r, rows in frame.groupby("rank"):
            rows = rows.sort_values("batch")
            fig.add_trace(go.Scatter(
                x=rows["batch"], y=rows["extra"], mode="lines+markers", name=f"{label}, rank {r}",
                line=dict(color=shades[int(r)], dash=dash, width=2.5), marker=dict(size=8),
                customdata=np.stack([rows["merged_ms"], rows["unmerged_ms"]], axis=1),
                hovertemplate=(f"<b>{label}</b>, rank {r}<br>batch %{{x}}: %{{customdata[0]:.3g}} → "
                               "%{customdata[1]:.3g} ms (%{y:+.1%})<extra></extra>")))
    fig.add_hline(y=0, line=dict(color=MUTED, width=1))
    fig.update_layout(
        title=dict(text="Every rank, measured earlier by the bench", subtitle=dict(
            text="Extra decode-step time of the unmerged adapter over the merged checkpoint (all 7 linears adapted)")),
        xaxis=dict(title="batch size (rows decoding together)", **log_axis()),
        yaxis=dict(title="extra time per step", tickformat="+.0%", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=110, b=130))
    return fig

