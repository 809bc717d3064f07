"""Block tables: each sequence's logical blocks and the physical blocks they map to.

`block_table_grid` draws the tables themselves (one row per sequence, one cell per logical block,
labelled with its physical id); `mapping_graph` draws the same map as a networkx bipartite graph,
so sharing (two arrows into one physical block) and scattering are visible at a glance.
"""
from __future__ import annotations

import math

import networkx as nx
import plotly.graph_objects as go

from engine.trace import StepRecord

from app.charts.colors import ink_on, owner_color, tint
from app.theme import MUTED, SHARED_COLOR, request_color


def _ordered_tables(record: StepRecord, order: list[str]):
    rank = {rid: i for i, rid in enumerate(order)}
    return sorted(record.block_tables, key=lambda t: rank.get(t.request_id, len(rank)))


def empty_tables_text(record: StepRecord) -> str:
    """Why no table is drawn: at the end of a run "no sequence holds blocks" read like a broken panel."""
    if record.requests and all(q.status == "finished" for q in record.requests):
        return "all requests finished: their blocks are on the free list"
    return "no sequence holds blocks at this step"


def block_table_grid(record: StepRecord, order: list[str]) -> go.Figure:
    tables = _ordered_tables(record, order)
    bs = record.pool.block_size
    fig = go.Figure()
    if not tables:  # a lone "0" tick under an empty plot read as a broken chart
        fig.update_layout(title=dict(text="Block tables", subtitle=dict(text="each cell holds a physical block id")),
                          xaxis=dict(visible=False), yaxis=dict(visible=False), margin=dict(l=70, r=10, t=60, b=50))
        fig.add_annotation(text=empty_tables_text(record), x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(color=MUTED, size=14))
        return fig
    xs, ys, texts, hovers, inks = [], [], [], [], []
    labels = [t.request_id for t in tables]
    width = max((len(t.block_ids) for t in tables), default=1)
    for row, t in enumerate(tables):
        y = len(tables) - 1 - row
        for i, (b, f) in enumerate(zip(t.block_ids, t.fills)):
            refs = record.pool.ref_counts[b]
            color = SHARED_COLOR if refs > 1 else request_color(t.request_id, order)
            fill = tint(color, 0.3 + 0.7 * f / bs)
            fig.add_shape(type="rect", x0=i + 0.06, x1=i + 0.94, y0=y + 0.1, y1=y + 0.9,
                          fillcolor=fill, line=dict(color=color, width=1.5), layer="below")
            inks.append(ink_on(fill))
            xs.append(i + 0.5)
            ys.append(y + 0.5)
            texts.append(str(b))
            hovers.append(f"{t.request_id}: logical block {i} → physical block {b}<br>"
                          f"{f}/{bs} slots filled, ref count {refs}")
    fig.add_scatter(x=xs, y=ys, mode="text", text=texts, hovertext=hovers, hoverinfo="text", showlegend=False,
                    textfont=dict(color=inks))
    fig.update_xaxes(title="logical block index (position ÷ block size)", range=[0, max(width, 4)],
                     tickvals=[i + 0.5 for i in range(width)], ticktext=[str(i) for i in range(width)],
                     showgrid=False, zeroline=False, fixedrange=True)
    fig.update_yaxes(tickvals=[len(tables) - 1 - r + 0.5 for r in range(len(tables))], ticktext=labels,
                     range=[0, max(len(tables), 1)], showgrid=False, zeroline=False, fixedrange=True)
    fig.update_layout(title=dict(text="Block tables", subtitle=dict(text="each cell holds a physical block id")),
                      margin=dict(l=70, r=10, t=60, b=50))
    return fig


# The graph's vertical room: its margins (top 60, bottom 10) and its y range (1.16 units for the unit
# between the first and the last block). A block label is the template's 15-pixel text, a box about 19
# pixels tall, and presentation mode draws it 4/3 larger in a 1.25x taller chart, so 24 pixels apart keep
# labels clear in both: at 1280 pixels the labels of 11 blocks in a 276-pixel chart ran into each other.
GRAPH_MARGIN_PX = 70
GRAPH_Y_SPAN = 1.16
BLOCK_LABEL_PX = 24
GRAPH_MAX_PX = 560


def _blocks_in_tables(record: StepRecord) -> list[int]:
    return sorted({b for t in record.block_tables for b in t.block_ids})


def graph_height(num_blocks: int, at_least: int) -> int:
    """Pixels the mapping graph needs for every block label to stand clear of its neighbours (at least
    `at_least`, at most GRAPH_MAX_PX: past that `mapping_graph` labels every k-th block)."""
    need = GRAPH_MARGIN_PX + math.ceil(GRAPH_Y_SPAN * BLOCK_LABEL_PX * max(num_blocks - 1, 0))
    return min(max(at_least, need), max(at_least, GRAPH_MAX_PX))


def mapping_graph_height(record: StepRecord, at_least: int) -> int:
    return graph_height(len(_blocks_in_tables(record)), at_least)


def label_stride(num_blocks: int, height: int) -> int:
    """Label every k-th block so labels `height` pixels apart stay BLOCK_LABEL_PX apart."""
    if num_blocks < 2:
        return 1
    spacing = (height - GRAPH_MARGIN_PX) / GRAPH_Y_SPAN / (num_blocks - 1)
    return max(1, math.ceil(BLOCK_LABEL_PX / max(spacing, 1e-9) - 1e-6))


def mapping_graph(record: StepRecord, order: list[str], height: int = GRAPH_MAX_PX) -> go.Figure:
    """Sequences on the left, physical blocks on the right (in id order); one edge per table entry. `height`
    is the chart's height in pixels: where the blocks are too many for it, every k-th block is labelled
    (the hover names each one)."""
    tables = _ordered_tables(record, order)
    g = nx.DiGraph()
    seq_nodes = [("seq", t.request_id) for t in tables]
    blocks = _blocks_in_tables(record)
    g.add_nodes_from(seq_nodes)
    g.add_nodes_from(("blk", b) for b in blocks)
    for t in tables:
        for i, b in enumerate(t.block_ids):
            g.add_edge(("seq", t.request_id), ("blk", b), logical=i)
    fig = go.Figure()
    if not tables:
        # Bare axes with a 0-4 grid read as a broken chart: say it inside an empty frame instead.
        # The same title and subtitle lines as with tables (and as the tables' panel beside it): a lone title
        # sat at another height than its neighbour's.
        fig.update_layout(title=dict(text="Logical → physical",
                                     subtitle=dict(text="no sequence holds blocks at this step")),
                          xaxis=dict(visible=False), yaxis=dict(visible=False), margin=dict(l=10, r=10, t=60, b=10))
        fig.add_annotation(text="every block is on the free list", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(color=MUTED, size=14))
        return fig
    # Fixed columns in a chosen order (networkx's bipartite layout would sort nodes arbitrarily).
    pos = {n: (0.0, 1 - i / max(len(seq_nodes) - 1, 1)) for i, n in enumerate(seq_nodes)}
    pos.update({("blk", b): (1.0, 1 - j / max(len(blocks) - 1, 1)) for j, b in enumerate(blocks)})
    for u, v in g.edges():
        (x0, y0), (x1, y1) = pos[u], pos[v]
        fig.add_scatter(x=[x0, x1], y=[y0, y1], mode="lines", showlegend=False, hoverinfo="skip",
                        line=dict(color=request_color(u[1], order), width=2), opacity=0.7)
    fig.add_scatter(
        x=[pos[n][0] for n in seq_nodes], y=[pos[n][1] for n in seq_nodes], mode="markers+text",
        text=[n[1] for n in seq_nodes], textposition="middle left", showlegend=False,
        marker=dict(size=22, color=[request_color(n[1], order) for n in seq_nodes]),
        hovertext=[f"{n[1]}: {g.out_degree(n)} blocks" for n in seq_nodes], hoverinfo="text")
    indeg = {b: g.in_degree(("blk", b)) for b in blocks}
    stride = label_stride(len(blocks), height)
    fig.add_scatter(
        x=[1.0] * len(blocks), y=[pos[("blk", b)][1] for b in blocks], mode="markers+text",
        text=[str(b) if j % stride == 0 else "" for j, b in enumerate(blocks)], textposition="middle right",
        showlegend=False,
        marker=dict(size=[14 + 6 * (indeg[b] - 1) for b in blocks], symbol="square",
                    color=[SHARED_COLOR if indeg[b] > 1 else owner_color(record.pool.owners[b], order) for b in blocks],
                    line=dict(color="#111827", width=[2 if indeg[b] > 1 else 0 for b in blocks])),
        hovertext=[f"physical block {b}: {indeg[b]} table entr{'ies' if indeg[b] > 1 else 'y'} point here"
                   for b in blocks], hoverinfo="text")
    fig.update_xaxes(visible=False, range=[-0.35, 1.2], fixedrange=True)
    fig.update_yaxes(visible=False, range=[-0.08, 1.08], fixedrange=True)
    fig.update_layout(title=dict(text="Logical → physical", subtitle=dict(text="yellow: one block, several owners")),
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig
