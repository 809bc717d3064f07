"""Chunked prefill charts: tokens per iteration against the budget, iteration time, and the time
between tokens of every request (live run and chunked vs prefill-first)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.trace import StepRecord

from app.analysis.chunked import ChunkRun, StepSplit, TokenGap, step_splits, token_gaps, worst_stall
from app.analysis.trace_metrics import cumulative_clock
from app.charts.axes import step_ticks, ticks_up_to
from app.charts.colors import tint
from app.theme import MUTED, STATUS_COLORS, request_color

# Tick labels of up to four digits ("1000" ms at 15 px) and their standoff fit in this gap.
Y_TITLE_GAP_PX = 40

PREFILL = STATUS_COLORS["prefill"]
DECODE = STATUS_COLORS["decode"]
PREFILL_BAND = tint(PREFILL, 0.22)


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
                  annotation_text=f"budget max_num_batched_tokens = {budget}", annotation_position="top left",
                  # on a white ground: the selected step's dotted line ran through the words when scrubbed to 0
                  annotation=dict(bgcolor="rgba(255,255,255,0.9)"))
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


# Requests decoding in the same steps share every gap (one step = one token for each of them), so in
# one plot their lines lie exactly on top of each other. One strip per request, on shared axes, keeps
# every request visible and still lines the stalls up in time; orange bands mark the steps that also
# ran a prompt chunk, so the cause of each bump is in the picture.
GAP_STRIP_PX = 90


def gap_request_ids(gaps: list[TokenGap], order: list[str]) -> list[str]:
    """The requests that have at least one gap, in the session's order (unknown ids last)."""
    seen = {g.request_id for g in gaps}
    return [r for r in order if r in seen] + sorted(seen - set(order))


def gap_figure_height(num_strips: int) -> int:
    """Pixel height for a gap figure of `num_strips` request strips (title, legend and axis included)."""
    return 170 + GAP_STRIP_PX * max(num_strips, 1)


def _prefill_bands(fig: go.Figure, records: list[StepRecord], col: int) -> None:
    """Shade the clock interval of every run of consecutive steps that computed prompt tokens. Call it after
    the strips' traces: Plotly's row="all" skips subplots that hold no trace yet."""
    clock = cumulative_clock(records)
    start = None
    for i, r in enumerate(records):
        begin = clock[i - 1] if i else 0.0
        if r.num_prefill_tokens and start is None:
            start = begin
        if start is not None and (not r.num_prefill_tokens or i == len(records) - 1):
            end = clock[i] if r.num_prefill_tokens else begin
            fig.add_vrect(x0=start, x1=end, fillcolor=PREFILL_BAND, line_width=0, layer="below", row="all", col=col)
            start = None


def _gap_strip(fig: go.Figure, gaps: list[TokenGap], rid: str, order: list[str], row: int, col: int) -> None:
    mine = [g for g in gaps if g.request_id == rid]
    fig.add_scatter(x=[g.time_s for g in mine], y=[g.gap_s * 1e3 for g in mine], name=rid, showlegend=False,
                    mode="lines+markers", line=dict(color=request_color(rid, order), width=2.5),
                    marker=dict(size=[10 if g.prefill_in_step else 5 for g in mine],
                                symbol=["diamond" if g.prefill_in_step else "circle" for g in mine]),
                    customdata=[g.step for g in mine],
                    hovertemplate=f"{rid}: token at step %{{customdata}}, %{{y:.0f}} ms after its previous one"
                                  "<extra></extra>", row=row, col=col)


def _strip_label(fig: go.Figure, rid: str, order: list[str], row: int, col: int) -> None:
    fig.add_annotation(text=f"<b>{rid}</b>", x=0.005, y=0.97, xref="x domain", yref="y domain", xanchor="left",
                       yanchor="top", showarrow=False, font=dict(color=request_color(rid, order), size=13),
                       bgcolor="rgba(255,255,255,0.75)", row=row, col=col)


def _worst_label(fig: go.Figure, worst: TokenGap | None, ids: list[str], col: int, text: str) -> None:
    if worst is None or worst.request_id not in ids:
        return
    # Level with its point and to the right: the worst stall is the highest point of all the strips, and a label
    # raised above it left the strip and touched the column title over the first strip.
    fig.add_annotation(x=worst.time_s, y=worst.gap_s * 1e3, text=text, showarrow=True, arrowhead=2, ax=45, ay=-4,
                       xanchor="left", bgcolor="rgba(255,255,255,0.85)", row=ids.index(worst.request_id) + 1, col=col)


def _legend_keys(fig: go.Figure) -> None:
    """Legend entries for the two marks every strip shares (the strips are named by their labels)."""
    fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="diamond", size=10, color=MUTED),
                    name="a prompt chunk ran in that step")
    fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=14, color=PREFILL_BAND),
                    name="steps with a prompt chunk")


def _shared_y(fig: go.Figure, gaps: list[TokenGap]) -> None:
    """One y range for every strip, with room above the highest point for its label, and ticks no higher
    than that point: Plotly's own put a "400" at a strip's top edge, against the "0" of the strip above."""
    top = max((g.gap_s * 1e3 for g in gaps), default=1.0)
    fig.update_yaxes(range=[0, top * 1.35], tickvals=ticks_up_to(top))


def _y_title(fig: go.Figure) -> None:
    """One y-axis title for all strips, a fixed number of pixels left of the plot: placed at a fraction of
    the plot's width, it sat on the strips' tick labels ("500") in a narrower chart."""
    fig.add_annotation(text="ms since the previous token", textangle=-90, x=0, xanchor="right",
                       xshift=-Y_TITLE_GAP_PX, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14))


def token_gap_figure(records, order: list[str], selected_time: float | None = None) -> go.Figure:  # noqa: ANN001
    """Sized for its number of strips (layout.height): show it at that height."""
    gaps = token_gaps(records)
    ids = gap_request_ids(gaps, order)
    title = "Time between tokens, one strip per request (shared axes)"
    if not ids:
        fig = go.Figure()
        fig.add_annotation(text="no request has two tokens yet", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
        # No y ticks: with no gap yet a 0-4 ms scale would read as data.
        fig.update_layout(title=title, xaxis=dict(title="engine clock (s)", range=[0, 1]),
                          yaxis=dict(title="ms since the previous token", showticklabels=False, showgrid=False,
                                     zeroline=False), height=gap_figure_height(0))
        return fig
    fig = make_subplots(rows=len(ids), cols=1, shared_xaxes=True, shared_yaxes="all", vertical_spacing=0.03)
    for i, rid in enumerate(ids, start=1):
        _gap_strip(fig, gaps, rid, order, i, 1)
        _strip_label(fig, rid, order, i, 1)
    _prefill_bands(fig, records, col=1)
    worst = worst_stall(records)
    if worst is not None:
        _worst_label(fig, worst, ids, 1, f"worst stall {worst.gap_s * 1e3:.0f} ms (step {worst.step})")
    if selected_time is not None:
        fig.add_vline(x=selected_time, line=dict(color=MUTED, dash="dot", width=2), row="all", col=1)
    _legend_keys(fig)
    _y_title(fig)
    _shared_y(fig, gaps)
    fig.update_xaxes(title_text="engine clock (s)", row=len(ids), col=1)
    fig.update_layout(title=title, margin=dict(l=80), height=gap_figure_height(len(ids)))
    return fig


def compare_gaps_figure(runs: dict[str, ChunkRun], order: list[str]) -> go.Figure:
    """Time between tokens under both policies: a strip per request, a column per policy, every axis shared
    so the same request's stalls line up side by side at the same scale. Sized like `token_gap_figure`."""
    keys = list(runs)
    per_run = {k: token_gaps(list(runs[k].records)) for k in keys}
    ids = gap_request_ids([g for gaps in per_run.values() for g in gaps], order) or ["–"]
    titles = [f"{runs[k].label}, budget {runs[k].budget}" for k in keys] + [""] * (len(keys) * (len(ids) - 1))
    fig = make_subplots(rows=len(ids), cols=len(keys), shared_xaxes="all", shared_yaxes="all",
                        horizontal_spacing=0.04, vertical_spacing=0.03, subplot_titles=titles)
    for c, k in enumerate(keys, start=1):
        records = list(runs[k].records)
        for i, rid in enumerate(ids, start=1):
            _gap_strip(fig, per_run[k], rid, order, i, c)
            if c == 1:
                _strip_label(fig, rid, order, i, c)
        _prefill_bands(fig, records, col=c)
        worst = worst_stall(records)
        if worst is not None:
            _worst_label(fig, worst, ids, c, f"worst {worst.gap_s * 1e3:.0f} ms")
        fig.update_xaxes(title_text="engine clock (s)", row=len(ids), col=c)
    _legend_keys(fig)
    _y_title(fig)
    _shared_y(fig, [g for gaps in per_run.values() for g in gaps])
    fig.update_layout(margin=dict(l=80), height=gap_figure_height(len(ids)))
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
