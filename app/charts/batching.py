"""Iteration-level batches: what each step ran, for every step and for the selected one."""
from __future__ import annotations

import plotly.graph_objects as go

from engine.trace import StepRecord

from app.charts.axes import index_ticks, step_line_mode, step_ticks
from app.theme import MUTED, request_color


def batch_over_steps(records: list[StepRecord], order: list[str], selected: int | None = None) -> go.Figure:
    """Stacked bars: tokens each request contributed to each step's batch (hatched = prefill)."""
    fig = go.Figure()
    ids = [rid for rid in order if any(s.request_id == rid for r in records for s in r.batch)]
    for rid in ids:
        runs: dict[str, tuple[list[int], list[int]]] = {}
        for phase in ("prefill", "decode"):
            xs, ys = [], []
            for r in records:
                n = sum(s.num_tokens for s in r.batch if s.request_id == rid and s.phase == phase)
                if n:
                    xs.append(r.step)
                    ys.append(n)
            if xs:
                runs[phase] = (xs, ys)
        # The legend swatch names a request, so it is the solid (decode) bar where there is one: a hatched
        # swatch read as "this request is prefill".
        legend_phase = "decode" if "decode" in runs else "prefill"
        for phase, (xs, ys) in runs.items():
            fig.add_bar(x=xs, y=ys, name=rid, legendgroup=rid, showlegend=phase == legend_phase,
                        marker=dict(color=request_color(rid, order), pattern_shape="/" if phase == "prefill" else "",
                                    line=dict(width=0.5, color="white")),
                        hovertemplate=f"step %{{x}}: {rid} {phase} %{{y}} tokens<extra></extra>")
    fig.add_scatter(x=[r.step for r in records], y=[len(r.batch) for r in records], name="sequences in batch",
                    mode=step_line_mode(len(records)), yaxis="y2", line=dict(color="#111827", width=2, shape="hv"),
                    hovertemplate="step %{x}: %{y} sequences<extra></extra>")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    most = max((len(r.batch) for r in records), default=1)
    fig.update_layout(
        title="Tokens per request in every step (hatched = prefill)", barmode="stack",
        xaxis_title="engine step", yaxis=dict(title="tokens computed in the step"),
        yaxis2=dict(title="sequences in the batch", overlaying="y", side="right", showgrid=False,
                    range=[0, most + 1], dtick=1),
        bargap=0.15,
    )
    fig.update_xaxes(**step_ticks(records))
    return fig


def batch_at_step(record: StepRecord, order: list[str]) -> go.Figure:
    """One bar per sequence that ran in the selected step."""
    rank = {rid: i for i, rid in enumerate(order)}
    batch = sorted(record.batch, key=lambda s: rank.get(s.request_id, len(rank)))
    fig = go.Figure()
    fig.add_bar(
        y=[s.request_id for s in batch], x=[s.num_tokens for s in batch], orientation="h",
        marker=dict(color=[request_color(s.request_id, order) for s in batch],
                    pattern_shape=["/" if s.phase == "prefill" else "" for s in batch]),
        text=[f"{s.phase} {s.num_tokens} tok · context {s.context_len}" for s in batch], textposition="auto",
        hovertemplate="%{y}: %{x} tokens<extra></extra>", showlegend=False,
    )
    n, t = len(batch), record.num_batched_tokens
    fig.update_layout(title=dict(text=f"Batch of step {record.step}",
                                 subtitle=dict(text=f"{n} sequence{'s' * (n != 1)}, {t} token{'s' * (t != 1)}")),
                      xaxis_title="tokens computed this step")
    # Tokens are whole: with one token per sequence Plotly labelled 0, 0.2, 0.4 ... 1.
    most = max((s.num_tokens for s in batch), default=1)
    fig.update_xaxes(**index_ticks(most, max_labels=6), rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    if not batch:
        fig.add_annotation(text="nothing ran in this step", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    return fig
