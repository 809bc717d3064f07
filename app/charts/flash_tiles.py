"""FlashAttention charts: the tile schedule, one row's online softmax, the score matrix naive
attention would write, and time/error against other implementations."""
from __future__ import annotations

import math

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from kernels.flash_trace import FlashTrace

from app.analysis.flash_compare import MethodResult
from app.charts.axes import index_ticks, log_axis
from app.charts.colors import HALO  # readable over a line without hiding a stretch of it
from app.theme import ACCENT, MUTED

TILE_COLORS = {"full": "#0072B2", "diagonal": "#E69F00", "skipped": "#EEF0F3"}
TILE_LABELS = {"full": "no mask", "diagonal": "diagonal: masked", "skipped": "skipped"}
FUTURE_FILL = TILE_COLORS["skipped"]  # a K tile wholly in the traced row's future


def tile_grid(trace: FlashTrace) -> go.Figure:
    """Query tiles (rows) x key tiles (columns): computed fully, diagonal-masked, or skipped."""
    nq, nk = trace.num_q_tiles, trace.num_k_tiles
    code = {"skipped": 0, "diagonal": 1, "full": 2}
    z = [[0] * nk for _ in range(nq)]
    hover = [[""] * nk for _ in range(nq)]
    for t in trace.tiles:
        z[t.q_tile][t.k_tile] = code[t.status]
        hover[t.q_tile][t.k_tile] = (f"Q tile {t.q_tile} (rows {t.q_start}–{t.q_end - 1}) × K tile {t.k_tile} "
                                     f"(keys {t.k_start}–{t.k_end - 1})<br><b>{TILE_LABELS[t.status]}</b>"
                                     + (f": {t.scores:,} scores" if t.scores else ": every key is in the future"))
    scale = [[0, TILE_COLORS["skipped"]], [1 / 3, TILE_COLORS["skipped"]], [1 / 3, TILE_COLORS["diagonal"]],
             [2 / 3, TILE_COLORS["diagonal"]], [2 / 3, TILE_COLORS["full"]], [1, TILE_COLORS["full"]]]
    gap = 2 if max(nq, nk) <= 40 else 0
    fig = go.Figure(go.Heatmap(z=z, x=list(range(nk)), y=list(range(nq)), zmin=-0.5, zmax=2.5, colorscale=scale,
                               showscale=False, xgap=gap, ygap=gap, customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>"))
    for status in ("full", "diagonal", "skipped"):  # legend entries for the three colours
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"{TILE_LABELS[status]} ({trace.count(status)})",
                        marker=dict(size=12, symbol="square", color=TILE_COLORS[status],
                                    line=dict(color="#9CA3AF", width=1)))
    if trace.row is not None:
        qt = trace.row // trace.block_m
        visited = [t.k_tile for t in trace.tiles if t.q_tile == qt and t.status != "skipped"]
        fig.add_shape(type="rect", x0=-0.5, x1=max(visited) + 0.5, y0=qt - 0.5, y1=qt + 0.5,
                      line=dict(color=ACCENT, width=3))
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"Q tile of row {trace.row}",
                        marker=dict(size=12, symbol="square-open", color=ACCENT, line=dict(width=3)))
    # A short title (it must fit a half-width column); the tile sizes are on the axes.
    fig.update_layout(title=f"{nq} × {nk} tile pairs",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0))
    fig.update_xaxes(title_text=f"K/V tile j of {trace.block_n} keys (streams past →)", range=[-0.5, nk - 0.5],
                     **index_ticks(nk), showgrid=False, zeroline=False, constrain="domain")
    fig.update_yaxes(title_text=f"Q tile i of {trace.block_m} rows (one program)", range=[nq - 0.5, -0.5],
                     **index_ticks(nq, 12), showgrid=False, zeroline=False,
                     scaleanchor="x", scaleratio=_tile_aspect(trace), constrain="domain")
    return fig


def _tile_aspect(trace: FlashTrace) -> float:
    """Height over width of a tile as the prompt fills it: 64 × 8 tiles of a 1-token prompt both hold one
    token, and drawn 8:1 they made a single square cell a tall sliver."""
    return min(trace.block_m, trace.seq_len) / min(trace.block_n, trace.seq_len) if trace.seq_len else 1.0


# The running-max panel spans at least this many score units: with one visible tile (or a max that never
# moves) the span was 0 and Plotly zoomed to a thousandth, labelling the axis -0.3639 ... -0.3642.
MIN_SCORE_SPAN = 1.0
# Rescale factors are written over their bars up to this many K tiles: "×0.54" at 12 pixels needs about
# 30 pixels, a tile's width in a half-width chart at 1280 pixels with 10-16 tiles.
RESCALE_LABELS_MAX_TILES = 16


def future_tiles(trace: FlashTrace) -> list[int]:
    """K tiles the traced row's Q tile computes but that lie wholly in the row's own future (the row sees
    none of their keys; the later rows of its tile do)."""
    return [s.k_tile for s in trace.row_steps if s.visible_keys == 0]


def online_softmax_chart(trace: FlashTrace, exact_m: float, exact_l: float) -> go.Figure:
    """For the traced row: running max m and running sum l after each K tile, and the rescale factor
    exp(m_old - m_new) whenever the max grows."""
    steps = trace.row_steps
    xs = [s.k_tile for s in steps]
    dot = 9 if len(steps) <= 40 else 5  # 128 K tiles of 9-pixel dots ran together into a bar
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.5, 0.5],
                        specs=[[{}], [{"secondary_y": True}]],
                        subplot_titles=(f"Running max m of row {trace.row} (head {trace.head}) after each K tile",
                                        "Running sum l = Σ exp(s − m), rescaled when m grows"))
    for title in fig.layout.annotations:  # make_subplots fixes them at 16 px: follow the theme's (presentation) size
        title.font.size = None
    hover = [f"K tile {s.k_tile}: keys {s.k_start}–{s.k_end - 1} ({s.status}), {s.visible_keys} visible to this row"
             for s in steps]
    fig.add_scatter(x=xs, y=[s.tile_max if s.visible_keys else None for s in steps], mode="markers",
                    name="max score in the tile", marker=dict(size=dot + 1, symbol="circle-open", color=MUTED,
                                                              line=dict(width=2)),
                    customdata=hover, hovertemplate="%{customdata}<br>tile max %{y:.3f}<extra></extra>", row=1, col=1)
    fig.add_scatter(x=xs, y=[s.m for s in steps], mode="lines+markers", name="running max m",
                    line=dict(color="#0072B2", width=3, shape="hv"), marker=dict(size=dot),
                    customdata=hover, hovertemplate="%{customdata}<br>m = %{y:.3f}<extra></extra>", row=1, col=1)
    grew = [s for s in steps[1:] if s.rescale < 1]
    fig.add_bar(x=[s.k_tile for s in grew], y=[s.rescale for s in grew], name="rescale exp(m_old − m_new)",
                marker_color="rgba(213,94,0,0.35)", marker_line=dict(color="#D55E00", width=1.5),
                hovertemplate="K tile %{x}: the max grew, so l and O were multiplied by %{y:.3f}<extra></extra>",
                row=2, col=1, secondary_y=True)
    # The factors are written over their bars with a white halo round each letter (as bar text the
    # running-sum line ran through them unreadably; on a white box they cut gaps into the line) at a fixed
    # readable size (Plotly shrank bar text to a thin bar's width), one line up where the tile before also
    # rescaled so neighbours do not cover each other, and left to the hover and the right axis once the
    # tiles are too close for that.
    if len(xs) <= RESCALE_LABELS_MAX_TILES:
        before, raised = None, False
        for s in grew:
            # A neighbour's label is one line up from the higher of the two bars.
            raised = before is not None and before.k_tile == s.k_tile - 1 and not raised
            fig.add_annotation(x=s.k_tile, y=max(s.rescale, before.rescale) if raised else s.rescale,
                               text=f"×{s.rescale:.2g}", showarrow=False, yanchor="bottom", yshift=20 if raised else 2,
                               font=dict(color="#D55E00", size=12, shadow=HALO), row=2, col=1, secondary_y=True)
            before = s
    fig.add_scatter(x=xs, y=[s.l for s in steps], mode="lines+markers", name="running sum l",
                    line=dict(color="#009E73", width=3), marker=dict(size=dot),
                    customdata=hover, hovertemplate="%{customdata}<br>l = %{y:.3f}<extra></extra>",
                    row=2, col=1, secondary_y=False)
    future = future_tiles(trace)
    for j in future:
        fig.add_vrect(x0=j - 0.5, x1=j + 0.5, fillcolor=FUTURE_FILL, line_width=0, layer="below")
    if future:  # the grey band gets a legend entry: unexplained, it read as a rendering fault
        fig.add_scatter(x=[None], y=[None], mode="markers", name="tile wholly in this row's future",
                        marker=dict(size=12, symbol="square", color=FUTURE_FILL, line=dict(color="#9CA3AF", width=1)),
                        row=1, col=1)
    for s in grew:
        fig.add_vline(x=s.k_tile, line=dict(color="rgba(213,94,0,0.45)", width=1, dash="dot"))
    lo = min([s.tile_max for s in steps if s.visible_keys] + [exact_m])
    span = max(exact_m - lo, MIN_SCORE_SPAN)
    # Room over the whole-row line for its label, lifted off the line (below), under the panel's title.
    fig.update_yaxes(range=[exact_m - 1.1 * span, exact_m + 0.6 * span], row=1, col=1)
    # Annotations without a font size follow the theme (larger in presentation mode), like every other label.
    # Lifted off the line like l's label below: on it, the box covered the running max's dot where m reaches it.
    fig.add_annotation(x=xs[0], y=exact_m, xanchor="left", yanchor="bottom", yshift=7, showarrow=False, row=1, col=1,
                       text=f"max of the whole row = {exact_m:.3f}", font=dict(color=MUTED),
                       bgcolor="rgba(255,255,255,0.85)")
    fig.add_hline(y=exact_m, line=dict(color=MUTED, dash="dot"), row=1, col=1)
    fig.add_hline(y=exact_l, line=dict(color=MUTED, dash="dot"), row=2, col=1)
    fig.add_annotation(x=xs[0], y=exact_l, xanchor="left", yanchor="bottom", yshift=7, showarrow=False, row=2, col=1,
                       text=f"l of the whole row = {exact_l:.3f}", font=dict(color=MUTED),
                       bgcolor="rgba(255,255,255,0.85)")
    x_range = [min(xs) - 0.6, max(xs) + 0.6]
    # No zero line: at tile 0 it read as a data line through the first point.
    fig.update_xaxes(title_text="K tile j streamed so far", range=x_range, **index_ticks(len(xs)), zeroline=False,
                     row=2, col=1)
    fig.update_xaxes(range=x_range, **index_ticks(len(xs)), zeroline=False, row=1, col=1)
    fig.update_yaxes(title_text="scaled score", row=1, col=1)
    fig.update_yaxes(title_text="l", range=[0, max([s.l for s in steps] + [exact_l]) * 1.3], row=2, col=1,
                     secondary_y=False)
    # Factors fill the panel's lower half: up to 1.3 they reached the whole-row line and its label.
    fig.update_yaxes(title_text="rescale", range=[0, 2.1], tickvals=[0, 0.5, 1], row=2, col=1, secondary_y=True,
                     showgrid=False)
    # Below the plot; app.theme.place_legend pins it to the figure's bottom edge, where Plotly makes room for
    # the up to four lines its entries wrap onto in a half-width column (at a fixed offset under the plot
    # they covered the x-axis title).
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.14, xanchor="left", x=0), bargap=0.55,
                      margin=dict(b=70))
    return fig


def _pool(matrix: torch.Tensor, max_cells: int) -> tuple[torch.Tensor, int]:
    """Max-pool an [N, N] matrix (NaN = masked) to at most max_cells per side for display."""
    n = matrix.shape[0]
    f = max(1, math.ceil(n / max_cells))
    if f == 1:
        return matrix, 1
    masked = torch.isnan(matrix)
    filled = matrix.masked_fill(masked, float("-inf"))[None, None]
    pooled = F.max_pool2d(filled, f, f, ceil_mode=True)[0, 0]
    return pooled.masked_fill(torch.isinf(pooled) & (pooled < 0), float("nan")), f


def score_matrix(probs: torch.Tensor, scores: torch.Tensor, trace: FlashTrace, show: str,
                 max_cells: int = 320) -> go.Figure:
    """The [N, N] matrix of one head that naive attention writes to memory and FA2 never does.
    show = "probabilities" (log10 P) or "scores" (S = QKᵀ/√d); future keys blank."""
    n = probs.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)
    if show == "probabilities":
        m = probs.float().clamp_min(1e-8).log10().masked_fill(causal, float("nan"))
        colorbar, zmin, zmax, cs = "log₁₀ P", -4.0, 0.0, "Viridis"
    else:
        m = scores.float().masked_fill(causal, float("nan"))
        finite = m[~torch.isnan(m)]
        colorbar, cs = "S", "RdBu_r"
        bound = float(finite.abs().quantile(0.995)) if finite.numel() else 1.0
        zmin, zmax = -bound, bound
    shown, f = _pool(m, max_cells)
    # A pooled cell covers positions i·f ... i·f + f − 1: centred there, row r's line crosses its own cell.
    centres = [i * f + (f - 1) / 2 for i in range(shown.shape[0])]
    fig = go.Figure(go.Heatmap(z=shown.tolist(), x=centres, y=centres, colorscale=cs, zmin=zmin, zmax=zmax,
                               # The title beside the bar: above it, it sat on the top tick label.
                               colorbar=dict(title=dict(text=colorbar, side="right"), thickness=12),
                               hovertemplate="query %{y:.0f} · key %{x:.0f}: %{z:.3f}<extra></extra>",
                               hoverongaps=False))
    # Tile boundaries as the kernel sees them (only when they stay readable), drawn in data coordinates so
    # that they, like the followed row, end at the matrix's edges.
    line = dict(color="rgba(255,255,255,0.55)", width=1)
    if n / trace.block_m <= 48:
        for r in range(trace.block_m, n, trace.block_m):
            fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=r - 0.5, y1=r - 0.5, line=line)
    if n / trace.block_n <= 48:
        for c in range(trace.block_n, n, trace.block_n):
            fig.add_shape(type="line", x0=c - 0.5, x1=c - 0.5, y0=-0.5, y1=n - 0.5, line=line)
    if trace.row is not None:
        fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=trace.row, y1=trace.row, line=dict(color=ACCENT, width=2))
    what = "softmax probabilities P, log scale" if show == "probabilities" else "scores S = QKᵀ/√d"
    pooled = f", shown max-pooled {f}×{f}" if f > 1 else ""
    fig.update_layout(title=dict(text=f"The {n}×{n} matrix naive attention writes", subtitle=dict(text=f"{what}{pooled}")))
    # constrain="domain": the plot area shrinks to the square matrix instead of padding the x range (past the
    # matrix, where the followed row's line used to run on).
    fig.update_xaxes(title_text="key position", range=[-0.5, n - 0.5], **index_ticks(n, 8), showgrid=False,
                     zeroline=False, constrain="domain")
    # The top 4 % left free: where the matrix filled the plot's height (a wide chart, in presentation mode at 1024
    # pixels) the "0" label of its first row rose half out of the plot, into the subtitle.
    fig.update_yaxes(title_text="query position", range=[n - 0.5, -0.5], **index_ticks(n, 8), showgrid=False,
                     zeroline=False, scaleanchor="x", constrain="domain", domain=[0, 0.96])
    return fig


# Above this ratio of slowest to fastest, a linear time axis would crush the fast methods against zero (a
# GPU's Triton kernel next to the Python re-enactment); below it, a linear axis shows the ratios as they are.
LOG_TIME_SPREAD = 100


def _time_axis(times: list[float]) -> tuple[dict, list[float]]:
    """The x axis for method times (linear from 0, or log for a wide spread) and where each time sits on
    it as a fraction of the plot's width (to put its label on the side with room)."""
    top, low = max(times), min(times)
    if top <= LOG_TIME_SPREAD * low:
        hi = top * 1.08
        return {"range": [0, hi]}, [t / hi for t in times]
    lo, hi = math.log10(low / 1.6), math.log10(top * 1.6)
    return {**log_axis(), "range": [lo, hi]}, [(math.log10(t) - lo) / (hi - lo) for t in times]


def method_chart(results: list[MethodResult]) -> go.Figure:
    """Time per method as a dot plot (a dot, not a bar: on a log axis a bar's length means nothing), each
    dot labelled with its time and its relative error."""
    ok = [r for r in results if not r.error and r.ms == r.ms]
    fig = go.Figure()
    fig.update_layout(title="Time and error ‖out − ref‖/‖ref‖ against exact float64 attention", showlegend=False)
    if not ok:
        fig.add_annotation(text="no method ran", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    colors = {True: "#CC79A7", False: "#0072B2"}
    axis, where = _time_axis([r.ms for r in ok])
    fig.add_scatter(y=[r.method for r in ok], x=[r.ms for r in ok], mode="markers+text",
                    marker=dict(size=16, color=["#D55E00" if "Triton" in r.method else "#9CA3AF"
                                                if "re-enactment" in r.method else colors[r.materialises_scores]
                                                for r in ok], line=dict(color="white", width=1)),
                    text=[f"{r.ms:.3g} ms · err {r.rel_err:.1e}" for r in ok],
                    # Each label on the side of its dot with room, so the axis ends at the data, not at the
                    # end of the slowest method's label.
                    textposition=["middle left" if f > 0.55 else "middle right" for f in where],
                    customdata=[[r.what, r.dtype, r.device] for r in ok], cliponaxis=False,
                    hovertemplate="<b>%{y}</b><br>%{customdata[0]}<br>%{customdata[1]} on %{customdata[2]}: "
                                  "%{x:.3g} ms<extra></extra>")
    scale = ", log scale" if axis.get("type") == "log" else ""
    fig.update_xaxes(title_text=f"time for all heads of the layer (ms, best of repeats{scale})", **axis)
    fig.update_yaxes(autorange="reversed", showgrid=True)
    return fig
