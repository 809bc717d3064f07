"""Disaggregated prefill/decode charts: both workers on one time axis with the KV handoffs between
them, where each request's first moments went, and the same requests served three ways."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.disaggregated import ClusterStepRecord, WorkerStep

from app.analysis.chunked import TokenGap
from app.analysis.disaggregated import FirstMoments, ServingRun, handoffs_until, worker_steps, worst_gap
from app.charts.axes import ticks_up_to
from app.charts.colors import tint
from app.theme import ACCENT, BASELINE_COLOR, MUTED, STATUS_COLORS, TECHNIQUE_COLOR, request_color

PREFILL = STATUS_COLORS["prefill"]
DECODE = STATUS_COLORS["decode"]
WAITING = STATUS_COLORS["waiting"]
HANDOFF = "#111827"
RUN_COLORS = {"colocated": BASELINE_COLOR, "chunked": ACCENT, "disaggregated": TECHNIQUE_COLOR}
# Lanes of the timeline, bottom to top; the gap between the two bars is where the handoffs cross.
DECODE_Y, HANDOFF_Y, PREFILL_Y = 0.0, 0.5, 1.0
BAR_WIDTH = 0.44


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _step_bars(fig: go.Figure, steps: list[WorkerStep], y: float, color: str, name: str, now: float) -> None:
    """One bar per iteration. A step still running at `now` on its worker's clock (a long prefill computed
    ahead of the decode worker) is drawn solid up to `now` and pale after it."""
    if not steps:
        return
    info = []
    for s in steps:
        r = s.record
        ids = ", ".join(dict.fromkeys(b.request_id for b in r.batch)) or "–"
        info.append(f"{len(r.batch)} sequence(s), {r.num_batched_tokens} tokens: {ids}")
    done = [min(s.end, max(now, s.start)) for s in steps]
    fig.add_bar(y=[y] * len(steps), x=[_ms(d - s.start) for s, d in zip(steps, done)],
                base=[_ms(s.start) for s in steps], orientation="h", width=BAR_WIDTH,
                marker=dict(color=color, line=dict(color="white", width=1)), name=name,
                customdata=[[s.record.step, i, _ms(s.end - s.start)] for s, i in zip(steps, info)],
                hovertemplate=f"{name} step %{{customdata[0]}}: from %{{base:.0f}} ms, %{{customdata[2]:.0f}} ms "
                              "long<br>%{customdata[1]}<extra></extra>")
    running = [(s, d) for s, d in zip(steps, done) if s.end > d]
    if running:
        fig.add_bar(y=[y] * len(running), x=[_ms(s.end - d) for s, d in running], base=[_ms(d) for _, d in running],
                    orientation="h", width=BAR_WIDTH, marker=dict(color=tint(color, 0.3), line=dict(color=color, width=1)),
                    name=f"{name}: still running", customdata=[_ms(s.end) for s, _ in running],
                    hovertemplate="still running: ends at %{customdata:.0f} ms<extra></extra>")


def worker_timeline(history: list[ClusterStepRecord], order: list[str]) -> go.Figure:
    """Both workers' iterations on the run's clock, every request's arrival, and an arrow per KV handoff
    from the end of its prefill to the decode iteration that took it."""
    prefill, decode = worker_steps(history)
    now = history[-1].clock if history else 0.0
    fig = go.Figure()
    _step_bars(fig, prefill, PREFILL_Y, PREFILL, "prefill worker", now)
    _step_bars(fig, decode, DECODE_Y, DECODE, "decode worker", now)
    states = history[-1].requests if history else ()
    arrived = [q for q in states if q.arrival_time >= 0]
    if arrived:
        fig.add_scatter(x=[_ms(q.arrival_time) for q in arrived], y=[PREFILL_Y + BAR_WIDTH / 2 + 0.06] * len(arrived),
                        mode="markers", name="a request arrives",
                        marker=dict(symbol="triangle-down", size=13, color=[request_color(q.request_id, order)
                                                                             for q in arrived],
                                    line=dict(color="white", width=1)),
                        customdata=[q.request_id for q in arrived],
                        hovertemplate="%{customdata} arrives at %{x:.0f} ms<extra></extra>")
    handed = handoffs_until(history)
    for h in handed:
        fig.add_annotation(x=_ms(h.taken_at), y=DECODE_Y + BAR_WIDTH / 2, ax=_ms(h.sent_at),
                           ay=PREFILL_Y - BAR_WIDTH / 2, xref="x", yref="y", axref="x", ayref="y", text="",
                           showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=2.5,
                           arrowcolor=request_color(h.request_id, order))
    if handed:  # one legend key for the arrows (annotations have none), hover on the arrows' heads
        fig.add_scatter(x=[_ms(h.taken_at) for h in handed], y=[DECODE_Y + BAR_WIDTH / 2] * len(handed),
                        mode="markers", name="KV handoff (prefill → decode)",
                        marker=dict(size=7, color=[request_color(h.request_id, order) for h in handed]),
                        customdata=[[h.request_id, h.nbytes / 1e6, _ms(h.taken_at - h.sent_at)] for h in handed],
                        hovertemplate="%{customdata[0]}: %{customdata[1]:.1f} MB of KV, taken "
                                      "%{customdata[2]:.1f} ms after it was sent<extra></extra>")
    waiting = [h for h in (history[-1].in_flight if history else ()) if h.sent_at <= now]
    for i, h in enumerate(waiting):  # sent, not taken: the KV sits in the transport until the decode worker takes it
        color = request_color(h.request_id, order)
        y = HANDOFF_Y + 0.16 * ((i + 0.5) / len(waiting) - 0.5)  # several waiting side by side, not on top
        fig.add_scatter(x=[_ms(h.sent_at), _ms(now)], y=[y, y], mode="lines+markers",
                        line=dict(color=color, width=3, dash="dash"), marker=dict(size=[8, 0], color=color),
                        name="KV waiting for the decode worker", legendgroup="waiting", showlegend=i == 0,
                        hovertemplate=f"{h.request_id}: KV sent at %{{x:.0f}} ms, waiting for the decode worker"
                                      "<extra></extra>")
    if history:
        fig.add_vline(x=_ms(now), line=dict(color=MUTED, dash="dot", width=2))
    # A little room left of 0 too: the first arrivals' markers sit on it.
    right = _ms(max([now] + [s.end for s in prefill + decode]))
    fig.update_xaxes(range=[-0.02 * right, 1.03 * right] if right > 0 else None)
    fig.update_yaxes(tickvals=[DECODE_Y, HANDOFF_Y, PREFILL_Y], ticktext=["decode worker", "KV handoff",
                                                                          "prefill worker"],
                     range=[-0.4, 1.45], fixedrange=True, showgrid=False, zeroline=False)
    fig.update_layout(title=dict(text="Two workers, one time axis", subtitle=dict(
                          text="bars: iterations · ▼ arrival, arrow: KV handoff, in the request's colour · "
                               "dotted: selected tick")),
                      xaxis_title="run clock (ms)", barmode="overlay", bargap=0)
    return fig


def first_moments_figure(moments: list[FirstMoments], order: list[str]) -> go.Figure:
    """Per handed-off request: queued at the prefill worker, its prefill step, the handoff, and the first
    decode iteration (arrival to the second token). The prefill step copies the request's KV out before it
    ends, so that copy is drawn as the handoff's first part, and the first token (TTFT) falls inside the
    handoff bar, after the copy out: a marker shows where."""
    fig = go.Figure()
    rows = [m.request_id for m in moments]
    parts = [("queued for the prefill worker", WAITING, lambda m: m.prefill_start - m.arrival),
             ("prefill step", PREFILL,
              lambda m: m.first_token - m.prefill_start - m.copy_out),
             ("KV handoff (copy out, wait, copy in)", HANDOFF, lambda m: m.handoff),
             ("first decode iteration (second token)", DECODE,
              lambda m: (m.second_token - m.taken) if m.second_token >= 0 else 0.0)]
    for name, color, length in parts:
        fig.add_bar(y=rows, x=[_ms(max(length(m), 0.0)) for m in moments], orientation="h", name=name,
                    marker_color=color, hovertemplate="%{y}: %{x:.1f} ms<extra>" + name + "</extra>")
    ends = []
    for m in moments:
        end = max(m.second_token, m.taken, m.first_token) - m.arrival
        ends.append(_ms(end))
        # The handoff is written out: beside a prefill of hundreds of ms its bar is often under a pixel wide.
        fig.add_annotation(x=_ms(end), y=m.request_id,
                           text=f"TTFT {_ms(m.first_token - m.arrival):.0f} ms<br>handoff {_ms(m.handoff):.1f} ms",
                           showarrow=False, xanchor="left", align="left", xshift=6, font=dict(size=13, color=MUTED))
    # White on the bars (the mark sits in the dark handoff bar or at its edge); its legend entry grey on the
    # white page.
    tick = dict(symbol="line-ns-open", size=26)
    fig.add_scatter(x=[_ms(m.first_token - m.arrival) for m in moments], y=rows, mode="markers", showlegend=False,
                    marker=dict(**tick, color="white", line=dict(width=3, color="white")),
                    hovertemplate="%{y}: first token at %{x:.1f} ms<extra></extra>")
    fig.add_scatter(x=[None], y=[None], mode="markers", name="first token (TTFT)",
                    marker=dict(**tick, color=MUTED, line=dict(width=3, color=MUTED)))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=rows)
    # Room right of the longest bar for its two-line label (about 120 px of a plot 800 px wide at 1280 pixels;
    # on one line, "TTFT 1062 ms · handoff 31.3 ms" ran off the chart's edge).
    fig.update_xaxes(range=[0, max(ends, default=1.0) * 1.2])
    fig.update_layout(title=dict(text="From arrival to the second token", subtitle=dict(
                          text="the handoff is the only step a colocated engine does not have")),
                      barmode="stack", xaxis_title="ms", bargap=0.35,
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0, traceorder="normal"))
    return fig


def _gap_panel(fig: go.Figure, gaps: list[TokenGap], order: list[str], row: int) -> None:
    for rid in [r for r in order if any(g.request_id == r for g in gaps)]:
        mine = [g for g in gaps if g.request_id == rid]
        fig.add_scatter(x=[g.time_s * 1e3 for g in mine], y=[g.gap_s * 1e3 for g in mine], mode="lines+markers",
                        name=rid, legendgroup=rid, showlegend=row == 1, line=dict(color=request_color(rid, order), width=2),
                        marker=dict(size=5), hovertemplate=f"{rid}: %{{y:.0f}} ms after its previous token"
                                                           "<extra></extra>", row=row, col=1)


def compare_gaps_figure(runs: dict[str, ServingRun], order: list[str], exclude: str | None) -> go.Figure:
    """Time between tokens of every request but `exclude` (the long prompt, whose wait is its TTFT), one
    panel per way of serving, every axis shared; orange bands mark colocated steps that ran prompt tokens."""
    keys = list(runs)
    panels = {k: [g for g in runs[k].gaps if g.request_id != exclude] for k in keys}
    titles = []
    for k in keys:
        worst = worst_gap(panels[k])
        titles.append(f"{runs[k].label}: worst {worst.gap_s * 1e3:.0f} ms" if worst else runs[k].label)
    fig = make_subplots(rows=len(keys), cols=1, shared_xaxes=True, shared_yaxes="all", vertical_spacing=0.09,
                        subplot_titles=titles)
    for i, k in enumerate(keys, start=1):
        _gap_panel(fig, panels[k], order, i)
        for a, b in runs[k].prefill_bands:
            fig.add_vrect(x0=a * 1e3, x1=b * 1e3, fillcolor=tint(PREFILL, 0.25), line_width=0, layer="below",
                          row=i, col=1)
    top = max((g.gap_s * 1e3 for gaps in panels.values() for g in gaps), default=1.0)
    fig.update_yaxes(range=[0, top * 1.15], tickvals=ticks_up_to(top))
    fig.update_yaxes(title_text="ms since the previous token", row=(len(keys) + 1) // 2, col=1)
    fig.update_xaxes(title_text="run clock (ms)", row=len(keys), col=1)
    fig.update_layout(height=190 + 170 * len(keys))
    return fig


def compare_ttft_figure(runs: dict[str, ServingRun], order: list[str]) -> go.Figure:
    """Time to first token of every request, one bar per way of serving."""
    fig = go.Figure()
    ids = [r for r in order if any(r in dict(run.ttft) for run in runs.values())]
    for k, run in runs.items():
        fig.add_bar(y=ids, x=[run.ttft_of(r) * 1e3 for r in ids], orientation="h", name=run.label,
                    marker_color=RUN_COLORS.get(k, MUTED), hovertemplate="%{y}: %{x:.0f} ms<extra></extra>")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text="Time to first token", subtitle=dict(text="arrival to the first token, ms")),
                      barmode="group", xaxis_title="ms", bargap=0.25,
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    return fig
