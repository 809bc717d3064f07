"""Charts of the multi-LoRA page: one step's packed batch (the shared base GEMM over every row, each
adapter's update over its own rows), the device's adapter slots, every request over the steps
coloured by adapter, and mixed batches vs one merged deployment per fine-tune."""
from __future__ import annotations

import plotly.graph_objects as go

from engine.trace import StepRecord

from app.analysis.multi_lora import BASE, ComparisonSummary, RowSegment, lora_extras
from app.charts.axes import step_ticks
from app.charts.colors import adapter_color, ink_on
from app.theme import BASELINE_COLOR, MUTED, TECHNIQUE_COLOR


def batch_rows_figure(segments: list[RowSegment], adapters: list[str]) -> go.Figure:
    """Two tracks over the step's rows: the base weights, one GEMM over all of them, and the LoRA update,
    one shrink/expand per adapter over its rows (rows without an adapter skip it)."""
    total = sum(s.rows for s in segments)
    fig = go.Figure()
    fig.add_bar(y=["base W x (one GEMM)"], x=[total], base=[0], orientation="h", name="shared base weights",
                marker=dict(color="#4B5563"), text=[f"all {total} rows read W once"], textposition="inside",
                insidetextanchor="middle", textfont=dict(color="white"),
                hovertemplate="one matmul over all %{x} rows<extra></extra>", showlegend=False)
    seen: set[str] = set()
    for s in segments:
        color = adapter_color(None if s.adapter == BASE else s.adapter, adapters)
        lora = s.adapter != BASE
        label = f"{s.label}" + (f" ({s.rows})" if s.rows > 1 else "")
        fig.add_bar(
            y=["+ B A x per adapter"], x=[s.rows], base=[s.start],
            orientation="h", name=s.adapter, legendgroup=s.adapter, showlegend=s.adapter not in seen,
            marker=dict(color=color if lora else "rgba(0,0,0,0)", line=dict(color=color, width=2)),
            text=[label], textposition="inside", insidetextanchor="middle",
            textfont=dict(color=ink_on(color) if lora else MUTED),
            customdata=[[s.label, s.adapter, s.phase, s.start, s.start + s.rows - 1]],
            hovertemplate="%{customdata[0]}: %{customdata[1]}, %{customdata[2]}, rows %{customdata[3]}"
                          "–%{customdata[4]}<extra></extra>")
        seen.add(s.adapter)
    fig.update_layout(barmode="overlay", bargap=0.35, title="This step's packed batch, row by row",
                      xaxis_title="row of the packed batch (one token each)",
                      legend=dict(orientation="h", yanchor="top", y=-0.3, x=0), uniformtext=dict(minsize=11, mode="hide"))
    fig.update_xaxes(range=[-0.5, max(total, 1) + 0.5])
    fig.update_yaxes(categoryorder="array", categoryarray=["+ B A x per adapter", "base W x (one GEMM)"])
    return fig


def slots_figure(record: StepRecord, adapters: list[str]) -> go.Figure:
    """The device's adapter slots after this step: which adapter each holds and how many running
    sequences pin it; this step's loads and evictions marked."""
    lora = lora_extras(record)
    resident, pins = lora.get("resident", []), lora.get("pins", [])
    loaded = {e["slot"] for e in lora.get("events", []) if e["kind"] == "load"}
    fig = go.Figure()
    for i, (name, pin) in enumerate(zip(resident, pins)):
        color = adapter_color(name, adapters) if name else "#F1F3F6"
        text = (f"<b>{name}</b><br>{pin} running" if name else "empty") + ("<br>loaded now" if i in loaded else "")
        fig.add_shape(type="rect", x0=i + 0.06, x1=i + 0.94, y0=0, y1=1, fillcolor=color,
                      line=dict(color="#111827" if i in loaded else "white", width=3 if i in loaded else 1))
        fig.add_annotation(x=i + 0.5, y=0.5, text=text, showarrow=False,
                           font=dict(color=ink_on(color) if name else MUTED))
    n = max(len(resident), 1)
    fig.update_xaxes(range=[0, n], tickvals=[i + 0.5 for i in range(n)], ticktext=[f"slot {i}" for i in range(n)],
                     showgrid=False, zeroline=False)
    fig.update_yaxes(range=[0, 1], visible=False)
    # "After this step": beside the step's packed batch, "0 running" under an adapter that batch used read as a
    # contradiction when its requests had just finished.
    fig.update_layout(title=dict(text="Adapter slots on the device", subtitle=dict(text="after this step")),
                      showlegend=False, margin=dict(l=10, r=10))
    return fig


# Steps between the dashed lines of adapters loaded in the same step.
LOAD_LINE_GAP = 0.14


def adapter_timeline(records: list[StepRecord], order: list[str], adapter_for, waiting: dict[str, list[int]],
                     events: list[dict], adapters: list[str], selected: int | None = None) -> go.Figure:
    """Every request (rows) over the engine steps: a cell where it ran, coloured by its adapter; an open
    square where it was ready but no slot was free; dashed lines where a slot loaded an adapter."""
    fig = go.Figure()
    cells: dict[str, tuple[list, list, list]] = {}
    for r in records:
        for s in r.batch:
            name = adapter_for(s.request_id)
            xs, ys, info = cells.setdefault(name, ([], [], []))
            xs.append(r.step)
            ys.append(s.request_id)
            info.append(f"{s.phase}, {s.num_tokens} token{'s' if s.num_tokens != 1 else ''}")
    for name, (xs, ys, info) in cells.items():
        fig.add_scatter(x=xs, y=ys, mode="markers", name=name, customdata=info,
                        marker=dict(symbol="square", size=14, color=adapter_color(None if name == BASE else name,
                                                                                  adapters),
                                    line=dict(color="white", width=1)),
                        hovertemplate="%{y} at step %{x}: " + name + ", %{customdata}<extra></extra>")
    wx = [s for label, steps in waiting.items() for s in steps]
    wy = [label for label, steps in waiting.items() for _ in steps]
    if wx:
        fig.add_scatter(x=wx, y=wy, mode="markers", name="waiting for a slot",
                        marker=dict(symbol="square-open", size=13, color="#111827", line=dict(width=2)),
                        hovertemplate="%{y} waits at step %{x}: every slot is pinned<extra></extra>")
    loads = [e for e in events if e["kind"] == "load"]
    for e in loads:
        # Loads in one step side by side in the gap before it (drawn on one x, two loads read as one).
        same = [x for x in loads if x["step"] == e["step"]]
        offset = (same.index(e) - (len(same) - 1) / 2) * LOAD_LINE_GAP
        fig.add_vline(x=e["step"] - 0.5 + offset, line=dict(color=adapter_color(e["adapter"], adapters),
                                                            dash="dash", width=2))
    if selected is not None:
        fig.add_vline(x=selected, line=dict(color=MUTED, dash="dot", width=2))
    last = records[-1].step if records else 0
    fig.update_layout(title="Every request over the steps, by adapter (dashed: an adapter loaded into a slot)",
                      xaxis_title="engine step", legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    fig.update_xaxes(range=[-0.6, last + 0.6], **step_ticks(last))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)), type="category")
    return fig


def comparison_figure(summaries: list[ComparisonSummary]) -> go.Figure:
    """Forward passes, engine time and mean time to finish for the two set-ups, side by side."""
    from plotly.subplots import make_subplots

    colors = [TECHNIQUE_COLOR, BASELINE_COLOR]
    # Titles short enough for a third of a projector-width chart: a longer one ran over its panel's edge and
    # onto the top y tick label when that tick happened to sit under it.
    fig = make_subplots(rows=1, cols=3, subplot_titles=("forward passes", "engine time (s)",
                                                        "mean finish time (s)"))
    # Three figures with their trailing zeros: "7" beside "4.58" read as a count beside a time.
    def seconds(v: float) -> str:
        return f"{v:#.3g}".rstrip(".")

    panels = ((lambda s: s.forward_passes, lambda v: f"{v:.0f}"), (lambda s: s.seconds, seconds),
              (lambda s: s.mean_finish_s, seconds))
    for col, (value, fmt) in enumerate(panels, 1):
        for s, color in zip(summaries, colors):
            # One trace per set-up, named in the legend: the set-ups' long names would collide as tick labels.
            fig.add_bar(x=[s.name], y=[value(s)], marker_color=color, name=s.name, legendgroup=s.name,
                        showlegend=col == 1, text=[fmt(value(s))], textposition="inside", row=1, col=col)
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.08, x=0), bargap=0.25)
    return fig
