"""Chunked prefill charts: tokens per iteration against the budget, iteration time, and the time
between tokens of every request (live run and chunked vs prefill-first)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.analysis.chunked import ChunkRun, StepSplit, TokenGap, step_splits, token_gaps, worst_stall
from app.charts.axes import step_ticks
from app.theme import MUTED, STATUS_COLORS, request_color

PREFILL = STATUS_COLORS["prefill"]
DECODE = STATUS_COLORS["decode"]
RUN_COLORS = {"chunked": "#009E73", "unchunked": "#CC79A7"}


def tokens_vs_budget(splits: list[StepSplit], budget: int, selected: int | None = None,
                     title: str = "Tokens in every iteration against the budget") -> go.Figure:
    fig = go.Figure()
    steps = [s.step for s in splits]
    fig.add_bar(x=steps, y=[s.prefill_tokens for s in splits], name="prefill-chunk tokens", marker_color=PREFILL,
                customdata=[", ".join(s.prefill_requests) or "–" for s in splits],
                hovertemplate="step %{x}: %{y} prompt tokens (%{customdata})<extra></extra>")
    fig.add_bar(x=steps, y=[s.decode_tokens for s in splits], name="decode tokens (1 per running request)",
                marker_color=DECODE, hovertemplate="step %{x}: %{y} decode tokens<extra></extra>")
    fig.add_hline(y=budget, line=dict(color="#111827", dash="dash", width=2),
                  annotation_text=f"budget max_num_batched_tokens = {budget}", annotation_position="top left")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    top = max([budget] + [s.prefill_tokens + s.decode_tokens for s in splits])
    fig.update_layout(title=title, barmode="stack", bargap=0.15, xaxis_title="engine step",
                      yaxis=dict(title="tokens computed", range=[0, top * 1.15]))
    fig.update_xaxes(**step_ticks(len(splits)))
    return fig


def iteration_time(splits: list[StepSplit], selected: int | None = None,
                   title: str = "Measured iteration time", subtitle: str = "wall time of each step") -> go.Figure:
    fig = go.Figure()
    colors = [PREFILL if s.prefill_tokens else DECODE for s in splits]
    fig.add_bar(x=[s.step for s in splits], y=[s.wall_seconds * 1e3 for s in splits], marker_color=colors,
                customdata=[[s.prefill_tokens, s.decode_tokens, s.forward_seconds * 1e3] for s in splits],
                hovertemplate="step %{x}: %{y:.0f} ms (forward %{customdata[2]:.0f} ms)<br>"
                              "%{customdata[0]} prefill + %{customdata[1]} decode tokens<extra></extra>",
                showlegend=False)
    for name, c in (("step with a prompt chunk", PREFILL), ("decode-only step", DECODE)):
        fig.add_bar(x=[None], y=[None], marker_color=c, name=name)
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    fig.update_layout(title=dict(text=title, subtitle=dict(text=subtitle)), xaxis_title="engine step",
                      yaxis_title="ms", bargap=0.15)
    fig.update_xaxes(**step_ticks(len(splits)))
    return fig


def _gap_traces(fig: go.Figure, gaps: list[TokenGap], order: list[str], row: int | None = None,
                col: int | None = None, show_legend: bool = True) -> None:
    ids = [r for r in order if any(g.request_id == r for g in gaps)]
    ids += sorted({g.request_id for g in gaps} - set(ids))
    kw = {} if row is None else {"row": row, "col": col}
    # Requests served in the same steps have identical gaps: widest line first, so overlaps show as stripes.
    widths = {rid: 2 + 2.2 * (len(ids) - 1 - i) for i, rid in enumerate(ids)}
    for rid in ids:
        mine = [g for g in gaps if g.request_id == rid]
        fig.add_scatter(x=[g.time_s for g in mine], y=[g.gap_s * 1e3 for g in mine], name=rid, legendgroup=rid,
                        showlegend=show_legend, mode="lines+markers",
                        line=dict(color=request_color(rid, order), width=widths[rid]),
                        marker=dict(size=[11 if g.prefill_in_step else 6 for g in mine],
                                    symbol=["diamond" if g.prefill_in_step else "circle" for g in mine]),
                        customdata=[g.step for g in mine],
                        hovertemplate=f"{rid}: token at step %{{customdata}}, %{{y:.0f}} ms after its previous one"
                                      "<extra></extra>", **kw)


def token_gap_figure(records, order: list[str], selected_time: float | None = None) -> go.Figure:  # noqa: ANN001
    gaps = token_gaps(records)
    fig = go.Figure()
    _gap_traces(fig, gaps, order)
    worst = worst_stall(records)
    if worst is not None:
        fig.add_annotation(x=worst.time_s, y=worst.gap_s * 1e3, text=f"worst stall {worst.gap_s * 1e3:.0f} ms "
                           f"({worst.request_id}, step {worst.step})", showarrow=True, arrowhead=2, ax=40, ay=-30)
    if selected_time is not None:
        fig.add_vline(x=selected_time, line=dict(color=MUTED, dash="dot", width=2))
    fig.update_layout(title="Time between tokens, per request (◆ = a prompt chunk ran in that step)",
                      xaxis_title="engine clock (s)",
                      yaxis=dict(title="ms since the previous token", rangemode="tozero"))
    if not gaps:
        fig.add_annotation(text="no request has two tokens yet", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    return fig


def compare_gaps_figure(runs: dict[str, ChunkRun], order: list[str]) -> go.Figure:
    """Time between tokens under both policies, side by side on the same y axis."""
    keys = list(runs)
    fig = make_subplots(rows=1, cols=len(keys), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"{runs[k].label}, budget {runs[k].budget}" for k in keys])
    for i, k in enumerate(keys, start=1):
        records = list(runs[k].records)
        _gap_traces(fig, token_gaps(records), order, row=1, col=i, show_legend=i == 1)
        worst = worst_stall(records)
        if worst is not None:
            fig.add_annotation(x=worst.time_s, y=worst.gap_s * 1e3, text=f"worst {worst.gap_s * 1e3:.0f} ms",
                               showarrow=True, arrowhead=2, ax=30, ay=-25, row=1, col=i)
        fig.update_xaxes(title_text="engine clock (s)", row=1, col=i)
    fig.update_yaxes(title_text="ms since the previous token", rangemode="tozero", row=1, col=1)
    fig.update_layout(legend=dict(yanchor="top", y=-0.2, xanchor="left", x=0.0), margin=dict(t=60, b=90))
    return fig


def compare_steps_figure(runs: dict[str, ChunkRun]) -> go.Figure:
    """Iteration time of every step under both policies, stacked bars of its tokens beneath."""
    keys = list(runs)
    fig = make_subplots(rows=2, cols=len(keys), shared_xaxes=True, vertical_spacing=0.1, horizontal_spacing=0.05,
                        row_heights=[0.5, 0.5], shared_yaxes=True,
                        subplot_titles=[f"{runs[k].label}: iteration time" for k in keys]
                        + [f"{runs[k].label}: tokens per iteration" for k in keys])
    for i, k in enumerate(keys, start=1):
        splits = step_splits(list(runs[k].records))
        steps = [s.step for s in splits]
        fig.add_bar(x=steps, y=[s.wall_seconds * 1e3 for s in splits], showlegend=False,
                    marker_color=[PREFILL if s.prefill_tokens else DECODE for s in splits],
                    hovertemplate="step %{x}: %{y:.0f} ms<extra></extra>", row=1, col=i)
        fig.add_bar(x=steps, y=[s.prefill_tokens for s in splits], name="prefill tokens", marker_color=PREFILL,
                    legendgroup="p", showlegend=i == 1, hovertemplate="step %{x}: %{y} prefill<extra></extra>",
                    row=2, col=i)
        fig.add_bar(x=steps, y=[s.decode_tokens for s in splits], name="decode tokens", marker_color=DECODE,
                    legendgroup="d", showlegend=i == 1, hovertemplate="step %{x}: %{y} decode<extra></extra>",
                    row=2, col=i)
        fig.add_hline(y=runs[k].budget, line=dict(color="#111827", dash="dash", width=1.5), row=2, col=i,
                      annotation_text=f"budget {runs[k].budget}", annotation_position="top left")
        fig.update_xaxes(title_text="engine step", row=2, col=i)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="tokens", row=2, col=1)
    fig.update_layout(barmode="stack", bargap=0.15, legend=dict(yanchor="top", y=-0.12, xanchor="left", x=0.0),
                      margin=dict(t=60, b=80))
    return fig
