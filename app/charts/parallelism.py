"""Charts of the parallelism page: one layer's dimensions cut across the ranks, memory per GPU, the measured
compute of a forward pass per rank, the H200 step with an assumed wire, the pipeline's Gantt, and expert
parallelism's arithmetic (memory, bytes per token, routing imbalance)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.parallel.lab import ParallelResult
from engine.parallel.pipeline import Placed

from app.analysis.parallelism import PassTimes, SplitRow, stage_label
from app.charts.colors import ink_on, tint
from app.formatting import GIB, plural
from app.theme import ACCENT, BASELINE_COLOR, MUTED, REQUEST_COLORS, TECHNIQUE_COLOR

# Ranks (GPUs of a tensor-parallel group) in Paul Tol's muted scheme: none of them is a phase colour (prefill
# orange, decode blue), a request colour or the comparison pair, so "rank 1" never reads as something else.
RANK_COLORS = ("#332288", "#44AA99", "#DDCC77", "#CC6677", "#88CCEE", "#117733", "#AA4499", "#882255")
ONE_GPU_COLOR = MUTED
WIRE_COLOR = ACCENT
EP_COLOR, TP_COLOR = TECHNIQUE_COLOR, BASELINE_COLOR


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def _span_text(row: SplitRow, a: int, b: int) -> str:
    return f"{a}" if b - a == 1 else f"{a:,}–{b - 1:,}"


def split_figure(rows: list[SplitRow], tp: int) -> go.Figure:
    """Each dimension a layer is cut along, as one bar from 0 to 100 %, each rank's share in its colour and
    labelled with the indices it holds."""
    fig = go.Figure()
    labels = [f"{r.part}<br>({r.total:,} {r.unit})" for r in rows]
    for rank in range(tp):
        color = rank_color(rank)
        fig.add_trace(go.Bar(
            y=labels, x=[(r.spans[rank][1] - r.spans[rank][0]) / r.total for r in rows],
            base=[r.spans[rank][0] / r.total for r in rows], orientation="h", name=f"rank {rank}",
            marker=dict(color=color, line=dict(color="white", width=2)),
            text=[_span_text(r, *r.spans[rank]) for r in rows], textposition="inside", insidetextanchor="middle",
            textfont=dict(color=ink_on(color), size=14),
            hovertemplate=[f"rank {rank}: {r.unit} {_span_text(r, *r.spans[rank])} of {r.total:,}<extra></extra>"
                           for r in rows]))
    fig.update_layout(
        barmode="overlay", bargap=0.35,
        title=dict(text=f"How one layer splits over {tp} rank{'s' if tp > 1 else ''}", subtitle=dict(
            text="Whole heads per rank (a head's softmax needs all of it); equal slices of the MLP and vocabulary")),
        xaxis=dict(title="share of the dimension", tickformat=".0%", range=[0, 1], dtick=1 / 3 if tp == 3 else 0.25),
        yaxis=dict(autorange="reversed", tickfont=dict(size=13)),
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0), margin=dict(t=100, l=10))
    return fig


def memory_figure(frame: pd.DataFrame) -> go.Figure:
    """Weights and KV cache per GPU, stacked: the one-GPU run against each rank of the sharded one."""
    x = [w.replace(": ", "<br>") for w in frame["Where"]]  # two short lines: four labels fit a half-width chart
    fig = go.Figure()
    for col, color, name in (("Weights (MiB)", TECHNIQUE_COLOR, "weights"),
                             ("KV cache (MiB)", "#56B4E9", "KV cache (allocated for the whole context)")):
        fig.add_trace(go.Bar(x=x, y=frame[col], name=name, marker=dict(color=color),
                             hovertemplate="%{x}: %{y:,.1f} MiB " + name + "<extra></extra>"))
    # The total above each bar, level: numbers inside bars this narrow were turned sideways.
    total = frame["Weights (MiB)"] + frame["KV cache (MiB)"]
    fig.add_trace(go.Scatter(x=x, y=total, mode="text", text=[f"{v:,.0f} MiB" for v in total],
                             textposition="top center", textfont=dict(size=13), showlegend=False, hoverinfo="skip",
                             cliponaxis=False))
    fig.update_layout(barmode="stack", bargap=0.3,
                      title=dict(text="Memory per GPU", subtitle=dict(text="fp32 here; bf16 on a GPU halves both")),
                      yaxis=dict(title="MiB", range=[0, float(total.max()) * 1.15]), xaxis=dict(title=None),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, x=0), margin=dict(t=100))
    return fig


def pass_figure(times: list[PassTimes], tp: int) -> go.Figure:
    """A forward pass's compute, measured here: the whole model on one rank, each TP rank's share, the pass as it
    would run on tp GPUs (slowest rank per segment, wire excluded) and the ranks in turn as this CPU ran them."""
    x = [t.label for t in times]
    fig = go.Figure()

    def bars(name: str, ys: list[float], color: str, pattern: str = "") -> None:
        fig.add_trace(go.Bar(x=x, y=ys, name=name, marker=dict(color=color, pattern=dict(shape=pattern)),
                             text=[f"{v:.1f}" for v in ys], textposition="outside", cliponaxis=False,
                             textfont=dict(size=12),
                             hovertemplate="%{x}<br>" + name + ": %{y:.2f} ms<extra></extra>"))

    bars("TP = 1: the whole model", [t.one_rank for t in times], ONE_GPU_COLOR)
    for r in range(tp):
        bars(f"rank {r}'s share", [t.per_rank[r] for t in times], rank_color(r))
    if tp > 1:
        bars(f"on {tp} GPUs: slowest rank per segment", [t.critical for t in times], TECHNIQUE_COLOR)
        bars("here: the ranks in turn", [t.serial for t in times], tint(MUTED, 0.45), "/")
    top = max([t.one_rank for t in times] + [t.serial for t in times] + [1e-3])
    fig.update_layout(barmode="group", bargap=0.2, bargroupgap=0.05,
                      title=dict(text="Compute of one forward pass, measured on this CPU", subtitle=dict(
                          text="Milliseconds; the wire (the collectives) is not in any of these bars")),
                      yaxis=dict(title="ms", range=[0, top * 1.15]), xaxis=dict(title=None),
                      legend=dict(orientation="h", yanchor="top", y=-0.12, x=0), margin=dict(t=100))
    return fig


def projection_figure(proj: pd.DataFrame, tp: int, latency_us: float, collectives: int) -> go.Figure:
    """Per batch size on one H200: the whole decode step (TP = 1) against one rank's share at `tp`, measured,
    with the collectives at an assumed latency stacked on top (hatched: an assumption, not a measurement)."""
    x = [str(b) for b in proj["batch"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=proj["tp1_ms"], name="TP = 1: whole step (measured)", offsetgroup="one",
                         marker=dict(color=ONE_GPU_COLOR), hovertemplate="batch %{x}: %{y:.3f} ms<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=proj["rank_ms"], name=f"TP = {tp}: one rank's compute (measured)",
                         offsetgroup="tp", marker=dict(color=rank_color(0)),
                         hovertemplate="batch %{x}: %{y:.3f} ms<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=proj["wire_ms"], base=proj["rank_ms"], offsetgroup="tp",
                         name=f"+ {collectives} collectives × {latency_us:g} µs (assumed)",
                         marker=dict(color=tint(WIRE_COLOR, 0.5), pattern=dict(shape="/", fgcolor=WIRE_COLOR)),
                         hovertemplate="batch %{x}: + %{y:.3f} ms assumed wire<extra></extra>"))
    top = max(float(proj["tp1_ms"].max()), float(proj["projected_ms"].max()), 1e-3)
    fig.update_layout(barmode="group", bargap=0.3,
                      title=dict(text=f"A decode step on one H200: TP = 1 against TP = {tp}", subtitle=dict(
                          text="Compute measured as CUDA graphs; the wire on top is an assumed latency, not measured")),
                      xaxis=dict(title="sequences in the decode batch", type="category"),
                      yaxis=dict(title="ms per decode step", range=[0, top * 1.1]),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), margin=dict(t=100))
    return fig


def tp_floor_figure(frame: pd.DataFrame, model: str, latency_us: float) -> go.Figure:
    """Per TP degree, a big model's decode-step floor: reading its weights and KV at the measured bandwidth, plus
    the collectives at an assumed latency; degrees whose share does not fit one GPU are marked."""
    x = [f"TP = {t}" for t in frame["tp"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=frame["read_ms"], name="reading weights + KV cache (measured bandwidth)",
                         marker=dict(color=[rank_color(0) if ok else tint(MUTED, 0.35) for ok in frame["fits"]]),
                         hovertemplate="%{x}: %{y:.2f} ms reading<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=frame["wire_ms"], name=f"collectives × {latency_us:g} µs (assumed)",
                         marker=dict(color=tint(WIRE_COLOR, 0.5), pattern=dict(shape="/", fgcolor=WIRE_COLOR)),
                         hovertemplate="%{x}: + %{y:.2f} ms wire<extra></extra>"))
    for xi, row in zip(x, frame.itertuples()):
        # In GiB, as the page states the GPU's memory: "152 GB" beside "139.8 GiB" read as two scales.
        # Weights and KV apart: which of them does not fit decides the remedy (more GPUs, or a smaller batch).
        weights, kv = row.weights_gb * 1e9 / GIB, row.kv_gb * 1e9 / GIB
        # One decimal, as the caption's GiB: "95 weights" there read against its "94.5 GiB".
        label = (f"{row.step_ms:.1f} ms" if row.fits else f"{weights + kv:,.1f} GiB: does not fit<br>"
                 f"({weights:,.1f} weights + {kv:,.1f} KV)")
        fig.add_annotation(x=xi, y=row.step_ms, text=label, showarrow=False, yanchor="bottom", yshift=4,
                           font=dict(size=13, color=MUTED if not row.fits else "#111827"))
    fig.update_layout(barmode="stack", bargap=0.35,
                      title=dict(text=f"{model}: one decode step's floor per TP degree", subtitle=dict(
                          text="Arithmetic: bytes per GPU over the H200's measured copy bandwidth, plus the wire")),
                      yaxis=dict(title="ms per decode step", range=[0, float(frame["step_ms"].max()) * 1.18]),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, x=0), margin=dict(t=100))
    return fig


def gantt_figure(result: ParallelResult, placed: list[Placed]) -> go.Figure:
    """The measured stage tasks laid out on one timeline per GPU: bars coloured by request, the prefill (step 0)
    hatched, each at least 3 % of the timeline wide labelled with its step."""
    run = result.pipeline
    rows = [stage_label(run, s) for s in range(run.pp)]
    fig = go.Figure()
    # Step numbers only on bars at least 3 % of the timeline wide: on narrower ones (a CPU decode step beside a
    # long prefill) the numbers that fit came out in uneven clusters ("5 5 5", "9 9 9") that read as noise.
    min_width = 0.03 * max((p.end for p in placed), default=0.0)
    for m in range(len(run.tokens)):
        color = REQUEST_COLORS[m % len(REQUEST_COLORS)]
        for prefill in (True, False):
            part = [p for p in placed if p.micro == m and (p.step == 0) == prefill]
            if not part:
                continue
            fig.add_trace(go.Bar(
                y=[rows[p.stage] for p in part], x=[(p.end - p.start) * 1e3 for p in part],
                base=[p.start * 1e3 for p in part], orientation="h", name=f"request {m + 1}",
                legendgroup=f"r{m}", showlegend=not prefill or not any(p.micro == m and p.step for p in placed),
                marker=dict(color=color, line=dict(color="white", width=1),
                            pattern=dict(shape="x" if prefill else "", fgcolor="white", size=6, solidity=0.35)),
                text=[str(p.step) if p.end - p.start >= min_width else "" for p in part], textposition="inside",
                insidetextanchor="middle",
                textfont=dict(color=ink_on(color)),
                customdata=[(p.step, p.start * 1e3, p.end * 1e3) for p in part],
                hovertemplate=(f"request {m + 1} · " + ("prefill" if prefill else "decode step %{customdata[0]}")
                               + " · %{y}<br>%{customdata[1]:.1f} → %{customdata[2]:.1f} ms<extra></extra>")))
    # A legend entry that says what the hatching means (the bars themselves are per request).
    fig.add_trace(go.Bar(y=[None], x=[None], orientation="h", name="prefill (step 0)",
                         marker=dict(color="white", line=dict(color=MUTED, width=1),
                                     pattern=dict(shape="x", fgcolor=MUTED, size=6)), hoverinfo="skip"))
    end = max((p.end for p in placed), default=0.0) * 1e3
    # Shorter: at 1024 pixels with the sidebar open the subtitle ran past the chart's edge.
    fig.update_layout(
        barmode="overlay", bargap=0.3, uniformtext=dict(minsize=11, mode="hide"),
        title=dict(text=f"{plural(len(run.tokens), 'request')} through {plural(run.pp, 'pipeline stage')}",
                   subtitle=dict(text="Measured stage times, one GPU per stage · in a bar: its decode step · "
                                      "gaps: idle (the bubble)")),
        xaxis=dict(title="ms (measured compute; hops assumed)", range=[0, end * 1.01]),
        yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=rows),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=100))
    return fig


def ep_figure(frame: pd.DataFrame, model: str) -> go.Figure:
    """For one MoE model: weights per GPU and bytes per token per MoE layer, EP against TP, by GPU count."""
    rows = frame[frame["Model"] == model]
    x = [f"{g} GPUs" for g in rows["GPUs"]]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=["Weights per GPU (GiB, fp8)", "Sent per token, per MoE layer (KB)"])
    for col, (ep, tp) in enumerate((("EP weights per GPU (GiB)", "TP weights per GPU (GiB)"),
                                    ("EP all-to-all per token (KB)", "TP all-reduce per token (KB)")), start=1):
        for key, name, color in ((ep, "expert parallel", EP_COLOR), (tp, "tensor parallel", TP_COLOR)):
            fig.add_trace(go.Bar(x=x, y=rows[key], name=name, marker=dict(color=color), legendgroup=name,
                                 showlegend=col == 1, text=[f"{v:,.0f}" for v in rows[key]], textposition="outside",
                                 cliponaxis=False, textfont=dict(size=12),
                                 hovertemplate="%{x} · " + name + ": %{y:,.1f}<extra></extra>"), row=1, col=col)
        top = float(rows[[ep, tp]].max().max()) if len(rows) else 1.0
        fig.update_yaxes(range=[0, top * 1.18], row=1, col=col)
    fig.update_layout(barmode="group", bargap=0.3,
                      title=dict(text=f"{model}: expert against tensor parallelism", subtitle=dict(
                          text="Arithmetic from the published shapes (this app's model has no experts)")),
                      # Title, subtitle, then the subplot titles: at 110 pixels the subplot titles sat on the
                      # subtitle in presentation mode's larger type.
                      legend=dict(orientation="h", yanchor="top", y=-0.15, x=0), margin=dict(t=125))
    return fig


def imbalance_figure(curve: pd.DataFrame, tokens: int, skew: float) -> go.Figure:
    """The busiest GPU's expert slots over the mean, by tokens in the batch, for balanced and skewed routing;
    the chosen batch marked."""
    fig = go.Figure()
    skews = sorted(curve["skew"].unique())
    for s in skews:
        part = curve[curve["skew"] == s]
        chosen = abs(s - skew) < 1e-9
        color = ACCENT if chosen and s > 0 else (TECHNIQUE_COLOR if s == 0 else MUTED)
        fig.add_trace(go.Scatter(x=part["tokens"], y=part["ratio"], mode="lines+markers",
                                 name="uniform routing (skew 0)" if s == 0 else f"skew {s:g}",
                                 line=dict(color=color, width=3 if chosen else 2), marker=dict(size=8),
                                 customdata=part[["busiest", "mean"]].to_numpy(),
                                 hovertemplate="%{x} tokens: busiest %{customdata[0]:,.0f} slots, mean "
                                               "%{customdata[1]:,.0f} (×%{y:.2f})<extra></extra>"))
        at = part[part["tokens"] == tokens]
        if chosen and len(at):
            fig.add_trace(go.Scatter(x=at["tokens"], y=at["ratio"], mode="markers+text", showlegend=False,
                                     marker=dict(size=16, symbol="circle-open", color=color, line=dict(width=3)),
                                     text=[f"×{float(at['ratio'].iloc[0]):.2f}"], textposition="top center",
                                     textfont=dict(size=14), hoverinfo="skip"))
    top = float(curve["ratio"].max()) if len(curve) else 1.5
    fig.update_layout(title=dict(text="The busiest GPU sets the pace", subtitle=dict(
                          text="Its expert slots over the mean per GPU, averaged over random routings")),
                      xaxis=dict(title="tokens in the batch", type="log", tickvals=sorted(curve["tokens"].unique())),
                      yaxis=dict(title="busiest ÷ mean", range=[0.95, top * 1.12]),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), margin=dict(t=100))
    return fig
