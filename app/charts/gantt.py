"""A Gantt chart of every request over engine steps, coloured by what it was doing."""
from __future__ import annotations

import plotly.graph_objects as go

from engine.trace import StepRecord

from app.analysis.trace_metrics import gantt_segments, request_ids
from app.charts.axes import step_ticks
from app.theme import MUTED, STATUS_COLORS

STATUS_ORDER = ("waiting", "prefill", "decode", "stalled", "preempted", "finished")


def gantt(records: list[StepRecord], order: list[str] | None = None, selected: int | None = None,
          title: str = "Every request over time", max_step: int | None = None) -> go.Figure:
    ids = order or request_ids(records)
    ids = [i for i in ids if i in set(request_ids(records))]
    segs = gantt_segments(records)
    fig = go.Figure()
    for status in STATUS_ORDER:
        part = [s for s in segs if s.status == status]
        if not part:
            continue
        fig.add_bar(
            y=[s.request_id for s in part], x=[s.end - s.start + 1 for s in part], base=[s.start - 0.5 for s in part],
            orientation="h", name=status, marker=dict(color=STATUS_COLORS[status], line=dict(color="white", width=1)),
            customdata=[(s.start, s.end) for s in part],
            hovertemplate="%{y}: " + status + " from step %{customdata[0]} to %{customdata[1]}<extra></extra>",
        )
    arrivals = {q.request_id: q.arrival_step for q in records[-1].requests} if records else {}
    arriving = [i for i in ids if i in arrivals]
    fig.add_scatter(x=[arrivals[i] - 0.5 for i in arriving], y=arriving, customdata=[arrivals[i] for i in arriving],
                    mode="markers", name="arrives", marker=dict(symbol="triangle-right", size=12, color="#111827"),
                    hovertemplate="%{y} arrives at step %{customdata}<extra></extra>")
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    last = max_step if max_step is not None else (records[-1].step if records else 0)
    fig.update_layout(title=title, barmode="overlay", xaxis_title="engine step", bargap=0.25)
    # Steps start at 0: a range from -1 put a "-1" tick under the arrival markers at -0.5.
    fig.update_xaxes(range=[-0.75, last + 0.75], **step_ticks(last + 1))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(ids)))
    return fig
