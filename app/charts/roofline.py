"""Roofline charts: the live kernels against the measured ceilings, the decode batch calculator, and
the latency a request sees (TTFT from the prefill step, TPOT from decode steps)."""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.config import ModelConfig
from engine.trace import StepRecord
from kernels.ceilings import Ceilings

from app.analysis.roofline_math import (FAMILY_OF, KernelPoint, attention_decode_intensity, crossing_batch, decode_step,
                                        linear_intensity, log_integers, log_range, step_phase)
from app.charts.axes import log_axis
from app.formatting import fmt_duration
from app.theme import MUTED, STATUS_COLORS

PHASE_COLORS = {"prefill": STATUS_COLORS["prefill"], "decode": STATUS_COLORS["decode"], "mixed": "#7A5195",
                "idle": MUTED}
FAMILY_SYMBOLS = {"linear": "circle", "lm_head": "diamond", "attention": "star", "elementwise": "square",
                  "other": "triangle-up"}
FAMILY_NAMES = {"linear": "linear layers", "lm_head": "LM head", "attention": "attention",
                "elementwise": "norm / RoPE / SiLU", "other": "other kernels"}
MEMORY_FILL = "rgba(0,114,178,0.06)"
COMPUTE_FILL = "rgba(230,159,0,0.08)"


def fmt_rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def point_label(p: KernelPoint) -> str:
    """A kernel's own name, or its family's for a point that sums several kernels."""
    if p.name not in FAMILY_OF:
        return FAMILY_NAMES[p.family]
    return p.name.replace("attention.", "attn.").replace("linear.", "")


_RIGHT = ("middle right", "top right", "bottom right", "middle left", "top left", "bottom left")
_LEFT = ("middle left", "top left", "bottom left", "middle right", "top right", "bottom right")


Box = tuple[float, float, float, float]  # x0, x1, y0, y1 in log10 data units

# The roofline's plot area at its narrowest, measured in Chromium: 590 x 351 px in its 692 x 640 chart on a
# 1024-pixel projector with the sidebar open, the legend under the plot in a margin of its own (LEGEND_MARGIN_PX),
# so the plot is 351 high at every width. Label boxes and the bandwidth label's angle are estimated for this size:
# estimated for 780 px, a label that fitted at 1600 px ran into the compute roof's label at 1280 once the measured
# π put them near each other; and while the margin (160 px) could not hold four rows of legend, Plotly grew it and
# the plot was 300 high, not the 350 estimated, so a CI run found the summed "linear layers" on the bandwidth label.
PLOT_PX = (590.0, 351.0)
LEGEND_MARGIN_PX = 210  # the x-axis title and four rows of legend entries


# How Plotly sets a marker's text off its centre (plotly.js Drawing.textPointPosition): r = radius / 0.8 + 1
# pixels sideways for a left / right label; the baseline 0.75 font + s·r + (s - 1)·font / 2 below the centre,
# s = -1 / 0 / +1 for top / middle / bottom. Chromium's box of a Source Sans line reaches 1.0 font above its
# baseline and 0.36 below. (Modelled as 9 px sideways and 3 px up or down for every marker, a "top" label sat
# 6 px higher than estimated: at 1280 pixels the summed "linear layers" ran into "lm_head" on a CI run.)
CURRENT_MARKER = (15.0, 11.0)  # marker size and font of the selected step's points, px
EARLIER_MARKER = (11.0, 10.0)  # the run's other steps
# The bandwidth label runs along the slope this far clear of it: a memory-bound kernel at the roof sits on the slope
# itself (the LM head often does), and with the label's bottom on the line its marker covered the text. Plotly
# draws a size-15 diamond 19.5 px across, so 10 px is its reach; 3 more keep the text off its outline.
SLOPE_LABEL_CLEARANCE_PX = 13.0
SLOPE_LABEL_FONT_PX = 12
LINE_HEIGHT_EM = 1.4  # the height of a one-line label's box, per px of font


def _label_box(lx: float, ly: float, pos: str, text: str, marker_px: float, font_px: float, dx: float,
               dy: float) -> Box:
    """The log-space box of `text` drawn at textposition `pos` beside a marker of size `marker_px`."""
    vert, horiz = pos.split()
    r = marker_px / 2 / 0.8 + 1
    w = len(text) * 0.564 * font_px * dx  # 6.2 px a character at 11 px
    x0 = lx + r * dx if horiz == "right" else lx - r * dx - w
    s = {"top": -1, "middle": 0, "bottom": 1}[vert]
    baseline_below = 0.75 * font_px + s * r + (s - 1) * font_px / 2
    top, bottom = font_px - baseline_below, -baseline_below - 0.36 * font_px  # px above the centre
    return (x0, x0 + w, ly + bottom * dy, ly + top * dy)


def place_labels(items: list[tuple[float, float, str, bool]], x_span: tuple[float, float],
                 y_span: tuple[float, float], width_px: float = PLOT_PX[0], height_px: float = PLOT_PX[1],
                 obstacles: list[Box] = (), markers: list[tuple[float, float]] | None = None,
                 soft_obstacles: list[Box] = ()) -> list[str]:
    """A Plotly textposition per labelled point (x, y, text, prefer_right) so labels avoid each other,
    the markers and `obstacles` (the roof's own labels, the ridge marker) and stay inside the plot: greedy, in
    log space, with each box placed where Plotly draws it (`markers`: each point's marker size and font in px,
    CURRENT_MARKER for all by default). A label that finds no free place gets "" (no text; the hover still
    names the point): overlapping text is worse on a projector than a point without a label.

    `soft_obstacles` (the roof line) are avoided where any place is free of them; a label with prefer_right
    (this step's kernels, which the page talks about) may still cross one rather than go unlabelled, the
    others (faded earlier steps) may not."""
    dx, dy = _decades_per_px(x_span, y_span, width_px, height_px)
    markers = markers or [CURRENT_MARKER] * len(items)
    marker = [(math.log10(x) - 8 * dx, math.log10(x) + 8 * dx, math.log10(y) - 8 * dy, math.log10(y) + 8 * dy)
              for x, y, _, _ in items]
    placed: list[Box] = list(obstacles)
    inside = (math.log10(x_span[0]), math.log10(x_span[1]), math.log10(y_span[0]), math.log10(y_span[1]))
    px, py = 3 * dx, 3 * dy

    def overlaps(box: Box, o: Box, pad_x: float = 0.0, pad_y: float = 0.0) -> bool:
        return box[0] - pad_x < o[1] and o[0] < box[1] + pad_x and box[2] - pad_y < o[3] and o[2] < box[3] + pad_y

    out = []
    for i, ((x, y, text, right), (marker_px, font_px)) in enumerate(zip(items, markers)):
        lx, ly = math.log10(x), math.log10(y)
        best, best_cost, best_box = "", None, None
        for pos in (_RIGHT if right else _LEFT):
            box = _label_box(lx, ly, pos, text, marker_px, font_px, dx, dy)
            # 3 px to spare between texts: Plotly offsets text from a marker by its radius, which the estimate
            # does not model, and two labels 2 px into each other read as one. Markers are boxes of their own.
            hits = sum(1 for o in placed if overlaps(box, o, px, py))
            hits += sum(1 for j, o in enumerate(marker) if j != i and overlaps(box, o))
            # Past the plot's edge a label lands on the axis' tick labels ("linear layers" on "10G").
            hits += not (inside[0] <= box[0] and box[1] <= inside[1] and inside[2] <= box[2] and box[3] <= inside[3])
            soft = any(overlaps(box, o) for o in soft_obstacles)
            cost = (hits, soft)
            if best_cost is None or cost < best_cost:
                best, best_cost, best_box = pos, cost, box
            if cost == (0, False):
                break
        if best_cost[0] or (best_cost[1] and not right):
            out.append("")
            continue
        placed.append(best_box)
        out.append(best)
    return out


def _decades_per_px(x_span: tuple[float, float], y_span: tuple[float, float], width_px: float = PLOT_PX[0],
                    height_px: float = PLOT_PX[1]) -> tuple[float, float]:
    """How many decades of each log axis one pixel of a plot of about that size spans."""
    return ((math.log10(x_span[1]) - math.log10(x_span[0])) / width_px,
            (math.log10(y_span[1]) - math.log10(y_span[0])) / height_px)


def _text_box(lx: float, ly: float, text: str, dx: float, dy: float, angle_deg: float = 0.0,
              font_px: float = 12) -> Box:
    """The log-space box a label anchored at its bottom-left (lx, ly, in log10 units) covers, rotated
    `angle_deg` upwards; dx, dy from `_decades_per_px`."""
    w_px, h_px = len(text) * 0.55 * font_px, LINE_HEIGHT_EM * font_px
    a = math.radians(angle_deg)
    return (lx, lx + (w_px * math.cos(a) + h_px * math.sin(a)) * dx, ly,
            ly + (w_px * math.sin(a) + h_px * math.cos(a)) * dy)


def _roof_line_boxes(c: Ceilings, x_span: tuple[float, float], dx: float, dy: float, step_px: float = 6.0,
                     half_px: float = 2.5) -> list[Box]:
    """Small log-space boxes along the roof line as drawn (3 px wide), `step_px` apart: a label placed across
    the line read as struck through ("linear layers" on the bandwidth slope)."""
    lo, hi = math.log10(x_span[0]), math.log10(x_span[1])
    n = max(2, int((hi - lo) / dx / step_px) + 1)
    boxes = []
    for i in range(n):
        lx = lo + (hi - lo) * i / (n - 1)
        ly = math.log10(c.attainable(10 ** lx))
        # Along the slope the line climbs one decade per decade: a box as tall as one step's rise covers it.
        rise = (hi - lo) / (n - 1) if 10 ** lx < c.ridge else 0.0
        boxes.append((lx - step_px / 2 * dx, lx + step_px / 2 * dx, ly - half_px * dy - rise / 2,
                      ly + half_px * dy + rise / 2))
    return boxes


def _log_span(values: list[float], lo_default: float, hi_default: float, pad: float = 2.5) -> tuple[float, float]:
    lo = min([lo_default] + [v / pad for v in values if v > 0])
    hi = max([hi_default] + [v * pad for v in values if v > 0])
    return lo, hi


def roofline_chart(c: Ceilings, now: list[KernelPoint], earlier: list[KernelPoint], title: str) -> go.Figure:
    """Log-log roofline: the roof from the measured ceilings, the selected step's kernels large and
    labelled (colour = the step's phase, symbol = kernel family), the run's other steps faded (one
    point per phase and kernel, see `phase_points`)."""
    every = now + earlier
    x_lo, x_hi = _log_span([p.intensity for p in every], c.ridge / 30, c.ridge * 60)
    y_lo, y_hi = _log_span([p.flops_per_s for p in every], c.peak_flops / 3000, c.peak_flops * 3)
    y_lo = max(y_lo, c.peak_flops / 1e6)
    fig = go.Figure()
    # Regions: left of the ridge every kernel is memory-bound, right of it compute-bound.
    fig.add_shape(type="rect", xref="x", yref="paper", x0=x_lo, x1=c.ridge, y0=0, y1=1, fillcolor=MEMORY_FILL,
                  line_width=0, layer="below")
    fig.add_shape(type="rect", xref="x", yref="paper", x0=c.ridge, x1=x_hi, y0=0, y1=1, fillcolor=COMPUTE_FILL,
                  line_width=0, layer="below")
    xs = log_range(x_lo, x_hi)
    fig.add_scatter(x=xs, y=[c.attainable(x) for x in xs], mode="lines", name="roof: min(π, β·I)",
                    line=dict(color="#111827", width=3), hoverinfo="skip")
    fig.add_scatter(x=[c.ridge, c.ridge], y=[y_lo, c.peak_flops], mode="lines", showlegend=False,
                    line=dict(color=MUTED, width=1.5, dash="dot"), hoverinfo="skip")
    fig.add_scatter(x=[c.ridge], y=[c.peak_flops], mode="markers", name="ridge point",
                    marker=dict(size=12, color="white", line=dict(color="#111827", width=2.5)),
                    hovertemplate=f"ridge: I* = π/β = {c.ridge:.3g} FLOP/byte<extra></extra>")
    fig.add_annotation(x=math.log10(c.ridge), y=math.log10(c.peak_flops), text=f"<b>ridge</b> {c.ridge:.3g} FLOP/B",
                       showarrow=True, arrowhead=0, ax=-20, ay=-34, font=dict(size=12, color="#111827"))
    roof_text = f"compute roof π = {fmt_rate(c.peak_flops, 'FLOP/s')}"
    fig.add_annotation(x=math.log10(c.ridge * 1.6), y=math.log10(c.peak_flops), xanchor="left", yanchor="bottom",
                       text=roof_text, showarrow=False, font=dict(size=12, color="#374151"))
    dx, dy = _decades_per_px((x_lo, x_hi), (y_lo, y_hi))
    slope_x = max(x_lo * 3, c.ridge / 40)
    slope_text = f"bandwidth β = {fmt_rate(c.peak_bytes_per_s, 'B/s')}"
    # Parallel to the slope as drawn: one decade up per decade across is dx / dy pixels up per pixel across.
    slope = math.atan(dx / dy)
    # Plotly anchors the rotated text's bounding box, whose bottom-left corner is left of the text's own by
    # h·sin θ, where the line is h·sin θ·tan θ higher; the text's bottom edge then runs parallel to the line.
    text_h = LINE_HEIGHT_EM * SLOPE_LABEL_FONT_PX
    lift = SLOPE_LABEL_CLEARANCE_PX / math.cos(slope) + text_h * math.sin(slope) * math.tan(slope)
    fig.add_annotation(x=math.log10(slope_x), y=math.log10(c.attainable(slope_x)), xanchor="left", yanchor="bottom",
                       yshift=lift, text=slope_text, showarrow=False, textangle=-math.degrees(slope),
                       font=dict(size=SLOPE_LABEL_FONT_PX, color="#374151"))
    lr, lp = math.log10(c.ridge), math.log10(c.peak_flops)
    ridge_text = f"ridge {c.ridge:.3g} FLOP/B"
    obstacles = [_text_box(lr + math.log10(1.6), lp, roof_text, dx, dy),
                 _text_box(math.log10(slope_x), math.log10(c.attainable(slope_x)) + lift * dy, slope_text, dx, dy,
                           angle_deg=math.degrees(slope), font_px=SLOPE_LABEL_FONT_PX),
                 (lr - 9 * dx, lr + 9 * dx, lp - 9 * dy, lp + 9 * dy),  # the ridge marker
                 # its label, centred 20 px left of it and 34 px above
                 _text_box(lr - (20 + 3.3 * len(ridge_text)) * dx, lp + 30 * dy, ridge_text, dx, dy)]
    # The two region names in the plot's bottom corners (placed below at 1 % and 99 % across, 2 % up).
    lx0, lx1, ly0, ly1 = math.log10(x_lo), math.log10(x_hi), math.log10(y_lo), math.log10(y_hi)
    bottom = ly0 + 0.02 * (ly1 - ly0)
    obstacles += [_text_box(lx0 + 0.01 * (lx1 - lx0), bottom, "memory-bound", dx, dy, font_px=13),
                  _text_box(lx1 - 0.01 * (lx1 - lx0) - len("compute-bound") * 0.55 * 13 * dx, bottom, "compute-bound",
                            dx, dy, font_px=13)]
    fig.add_annotation(x=0.01, y=0.02, xref="paper", yref="paper", xanchor="left", yanchor="bottom",
                       text="memory-bound", showarrow=False, font=dict(color="#0072B2", size=13))
    fig.add_annotation(x=0.99, y=0.02, xref="paper", yref="paper", xanchor="right", yanchor="bottom",
                       text="compute-bound", showarrow=False, font=dict(color="#B07800", size=13))

    # Current kernels are labelled first (to the right); the other steps only for the two families the
    # story is about (linear layers, attention), to the left, where there is room.
    # Not one that sits under this step's point of the same name (a decode step beside the summed other
    # decode steps): two "attn.decode" labels a few pixels apart read as a glitch.
    others_labelled = [p for p in earlier if (p.family == "attention"
                       or (p.family == "linear" and p.name not in FAMILY_OF))  # the summed "linear layers" point
                       and not any(point_label(q) == point_label(p) and _near_in_log(p, q) for q in now)]
    items = [(p.intensity, p.flops_per_s, point_label(p), True) for p in now]
    items += [(p.intensity, p.flops_per_s, point_label(p), False) for p in others_labelled]
    markers = [CURRENT_MARKER] * len(now) + [EARLIER_MARKER] * len(others_labelled)
    line = _roof_line_boxes(c, (x_lo, x_hi), dx, dy)
    positions = dict(zip([id(p) for p in now + others_labelled],
                         place_labels(items, (x_lo, x_hi), (y_lo, y_hi), obstacles=obstacles, markers=markers,
                                      soft_obstacles=line)))
    for phase in ("prefill", "mixed", "decode"):
        pts = [p for p in earlier if p.phase == phase]
        if not pts:
            continue
        # The legend shows a trace's first symbol, which would make "other steps" look like one family: a
        # marker-less proxy carries the legend entry (a faded circle), the real points stay out of it.
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"other {phase} steps (summed)",
                        legendgroup=f"other-{phase}", hoverinfo="skip",
                        marker=dict(size=11, color=PHASE_COLORS[phase], opacity=0.35, symbol="circle"))
        fig.add_scatter(
            x=[p.intensity for p in pts], y=[p.flops_per_s for p in pts], mode="markers+text",
            name=f"other {phase} steps (summed)", legendgroup=f"other-{phase}", showlegend=False,
            text=[point_label(p) if positions.get(id(p)) else "" for p in pts],
            textposition=[positions.get(id(p)) or "middle left" for p in pts],
            textfont=dict(size=EARLIER_MARKER[1], color=PHASE_COLORS[phase]),
            marker=dict(size=EARLIER_MARKER[0], color=PHASE_COLORS[phase], opacity=0.35,
                        symbol=[FAMILY_SYMBOLS[p.family] for p in pts]),
            customdata=[[p.name, p.calls, p.bytes_per_s] for p in pts],
            hovertemplate=f"all other {phase} steps: " + "%{customdata[0]} × %{customdata[1]} calls"
                          "<br>I = %{x:.3g} FLOP/B · %{y:.3s}FLOP/s · %{customdata[2]:.3s}B/s<extra></extra>",
        )
    for family in ("linear", "lm_head", "attention", "elementwise", "other"):
        pts = [p for p in now if p.family == family]
        if not pts:
            continue
        color = PHASE_COLORS[pts[0].phase]
        fig.add_scatter(
            x=[p.intensity for p in pts], y=[p.flops_per_s for p in pts], mode="markers+text",
            name=f"{FAMILY_NAMES[family]} (this step)", text=[point_label(p) if positions[id(p)] else "" for p in pts],
            textposition=[positions[id(p)] or "middle right" for p in pts],
            textfont=dict(size=CURRENT_MARKER[1], color="#1F2937"),
            marker=dict(size=CURRENT_MARKER[0], color=color, symbol=FAMILY_SYMBOLS[family],
                        line=dict(color="#1F2937", width=1)),
            customdata=[[p.name, p.calls, p.seconds * 1e3, p.bytes_per_s, c.attainable(p.intensity)] for p in pts],
            hovertemplate="<b>%{customdata[0]}</b> × %{customdata[1]} calls, %{customdata[2]:.2f} ms"
                          "<br>I = %{x:.3g} FLOP/byte<br>achieved %{y:.3s}FLOP/s (%{customdata[3]:.3s}B/s)"
                          "<br>roof here: %{customdata[4]:.3s}FLOP/s<extra></extra>",
        )
    fig.update_xaxes(**log_axis(), range=[math.log10(x_lo), math.log10(x_hi)],
                     title_text="arithmetic intensity I = FLOPs / bytes moved  (FLOP per byte, log)")
    fig.update_yaxes(**log_axis(si=True), range=[math.log10(y_lo), math.log10(y_hi)],
                     title_text="achieved FLOP/s (log; M = 10⁶, G = 10⁹, T = 10¹²)")
    # The legend under the plot, not beside it: beside, it took 300 of a 690-pixel chart on a 1024-pixel
    # projector, and the plot left was too narrow for the ridge's and the roof's labels. Its margin is fixed, room
    # for the axis title and four rows of entries, so the plot's height does not change with the number of
    # entries: the bandwidth label's angle is computed from the plot's shape (PLOT_PX).
    fig.update_layout(title=title, legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0),
                      margin=dict(r=20, b=LEGEND_MARGIN_PX))
    return fig


# Both calculator charts leave this much room under the plot (ticks, axis title and the intensity chart's legend,
# five rows at half a 1280-pixel page: at 150 Plotly grew that chart's margin and its plot came out 40 pixels
# shorter than its neighbour's), so their plots are the same height side by side.
CALC_BOTTOM_PX = 200


def _calc_batches() -> list[int]:
    return log_integers(1, 4096, 120)


def decode_intensity_chart(cfg: ModelConfig, elem: int, c: Ceilings, batch: int, context: int) -> go.Figure:
    """Intensity vs batch for the decode linear layers, the whole decode step (with the KV read at `context`)
    and decode attention, against the ridge. One figure per chart, not two subplots: a row of two figures
    stacks on a narrow page (each then gets the whole width), one figure's two panels cannot."""
    batches = _calc_batches()
    lin = [linear_intensity(cfg, b, elem) for b in batches]
    whole = [decode_step(cfg, b, context, elem).intensity for b in batches]
    attn = attention_decode_intensity(cfg, elem)
    cross = crossing_batch(cfg, elem, c.ridge)
    fig = go.Figure()
    fig.add_scatter(x=batches, y=lin, mode="lines", name="linear layers (weights read once per step)",
                    line=dict(color=PHASE_COLORS["decode"], width=3),
                    hovertemplate="batch %{x}: %{y:.3g} FLOP/B<extra>linear layers</extra>")
    fig.add_scatter(x=batches, y=whole, mode="lines", name=f"whole step incl. KV read at {context} tokens",
                    line=dict(color="#7A5195", width=2.5, dash="dash"),
                    hovertemplate="batch %{x}: %{y:.3g} FLOP/B<extra>whole step</extra>")
    fig.add_scatter(x=[1, 4096], y=[attn, attn], mode="lines", name="decode attention (any batch)",
                    line=dict(color="#009E73", width=2.5, dash="dot"),
                    hovertemplate=f"{attn:.3g} FLOP/B<extra>attention</extra>")
    fig.add_scatter(x=[1, 4096], y=[c.ridge, c.ridge], mode="lines", name=f"ridge {c.ridge:.3g} FLOP/B",
                    line=dict(color="#111827", width=1.5), hoverinfo="skip")
    fig.add_scatter(x=[batch], y=[linear_intensity(cfg, batch, elem)], mode="markers", name=f"batch {batch}",
                    marker=dict(size=14, color=PHASE_COLORS["decode"], line=dict(color="#111827", width=2)),
                    hovertemplate="batch %{x}: linear I = %{y:.3g} FLOP/B<extra></extra>")
    if cross is not None:
        fig.add_vline(x=cross, line=dict(color=MUTED, dash="dot"))
        fig.add_annotation(x=math.log10(cross), y=math.log10(c.ridge), text=f"crosses at batch {cross}",
                           showarrow=True, ax=-60, ay=-40, font=dict(size=12))
    fig.update_xaxes(**log_axis(), title_text="batch size (sequences decoding together)")
    fig.update_yaxes(**log_axis(), title_text="FLOP per byte")
    fig.update_layout(title="Arithmetic intensity of a decode step",
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0),
                      margin=dict(b=CALC_BOTTOM_PX))
    return fig


def decode_throughput_chart(cfg: ModelConfig, elem: int, c: Ceilings, batch: int, context: int) -> go.Figure:
    """The roofline-predicted decode throughput vs batch, the chosen batch marked."""
    batches = _calc_batches()
    here_tps = batch / decode_step(cfg, batch, context, elem).seconds(c)
    tps = [b / decode_step(cfg, b, context, elem).seconds(c) for b in batches]
    fig = go.Figure()
    fig.add_scatter(x=batches, y=tps, mode="lines", name="tokens/s = batch / max(FLOPs/π, bytes/β)",
                    line=dict(color="#D55E00", width=3),
                    hovertemplate="batch %{x}: %{y:.3s} tokens/s<extra></extra>")
    fig.add_scatter(x=[batch], y=[here_tps], mode="markers", name=f"batch {batch}: {here_tps:,.0f} tokens/s",
                    marker=dict(size=14, color="#D55E00", line=dict(color="#111827", width=2)),
                    hovertemplate="batch %{x}: %{y:.3s} tokens/s<extra></extra>")
    # The batch axis starts a little left of batch 1, so its "1" and the y axis's "0" are not one label.
    fig.update_xaxes(**log_axis(), title_text="batch size (sequences decoding together)",
                     range=[math.log10(0.7), math.log10(4096 / 0.7)])
    # Linear from zero: the curve's flattening is the lesson, and a log axis over a narrow range
    # (a slow CPU's 60-140 tokens/s) had no labelled tick at all and made a small change look big.
    fig.update_yaxes(rangemode="tozero", tickformat="~s", title_text="output tokens per second")
    # Its two-entry legend hangs just under the axis title, not at the foot of the margin kept for the other
    # chart's five rows: stacked on a narrow page, that left a 100-pixel gap between the axis and the legend.
    fig.update_layout(title="Roofline-predicted decode throughput",
                      legend=dict(orientation="h", yref="paper", yanchor="top", y=-0.3, xanchor="left", x=0),
                      margin=dict(b=CALC_BOTTOM_PX))
    return fig


def _time_unit(seconds: list[float], over: float = 10.0) -> tuple[float, str]:
    """Milliseconds, or seconds once the longest value passes `over` (a CPU prefill of thousands of
    tokens), so neither axis nor labels read '108529 ms'."""
    return (1.0, "s") if max(seconds, default=0.0) > over else (1e3, "ms")


def step_latency_chart(history: list[StepRecord], selected: int) -> go.Figure:
    """Forward time of every step so far, coloured by phase: the prefill step is the TTFT spike,
    the flat decode steps are the TPOT."""
    scale, unit = _time_unit([r.wall_seconds for r in history])
    fig = go.Figure()
    for phase in ("prefill", "mixed", "decode", "idle"):
        recs = [r for r in history if step_phase(r) == phase]
        if not recs:
            continue
        fig.add_bar(x=[r.step for r in recs], y=[r.wall_seconds * scale for r in recs], name=phase,
                    marker=dict(color=PHASE_COLORS[phase],
                                line=dict(color=["#111827" if r.step == selected else "rgba(0,0,0,0)" for r in recs],
                                          width=2.5)),
                    customdata=[[r.num_prefill_tokens, r.num_decode_tokens, fmt_duration(r.wall_seconds)]
                                for r in recs],
                    hovertemplate="step %{x}: %{customdata[2]}<br>%{customdata[0]} prefill + %{customdata[1]} decode "
                                  "tokens<extra></extra>")
    fig.update_layout(title="Time of every step so far", xaxis_title="engine step",
                      yaxis_title="seconds" if unit == "s" else "milliseconds", barmode="overlay", bargap=0.15)
    last = max((r.step for r in history), default=0)
    fig.update_xaxes(range=[-0.6, max(last, 7) + 0.6], dtick=1 if last <= 20 else None)
    return fig


def _near_in_log(a: KernelPoint, b: KernelPoint, decades: float = 0.3) -> bool:
    """Two points within `decades` of each other on both log axes."""
    if min(a.intensity, b.intensity, a.flops_per_s, b.flops_per_s) <= 0:
        return False
    return (abs(math.log10(a.intensity / b.intensity)) < decades
            and abs(math.log10(a.flops_per_s / b.flops_per_s)) < decades)


def request_latency_chart(record: StepRecord, order: list[str]) -> go.Figure:
    """TTFT and TPOT of every request that has them at the selected step."""
    reqs = sorted(record.requests, key=lambda q: order.index(q.request_id) if q.request_id in order else 1e9)
    ids = [q.request_id for q in reqs]
    ttft_s = [q.ttft_seconds if q.ttft_seconds >= 0 else None for q in reqs]
    tpot_s = [q.tpot_seconds if q.tpot_seconds >= 0 else None for q in reqs]
    # Seconds past 1 s here: the bars carry fmt_duration labels, which switch to seconds there too.
    (s1, u1), (s2, u2) = (_time_unit([v for v in vals if v is not None], over=1.0) for vals in (ttft_s, tpot_s))
    # Two short lines each, the unit in the first: on one line the two titles ran into each other in the page's
    # right-hand column at a projector's 1280 pixels, and the second panel's y-axis title sat on the first
    # panel's bars.
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"TTFT ({u1})<br>to the first token", f"TPOT ({u2})<br>per later token"))
    ttft = [v * s1 if v is not None else None for v in ttft_s]
    tpot = [v * s2 if v is not None else None for v in tpot_s]
    fig.add_bar(x=ids, y=ttft, marker_color=PHASE_COLORS["prefill"], name="TTFT", row=1, col=1,
                text=[fmt_duration(v) if v is not None else "" for v in ttft_s], textposition="outside",
                customdata=[q.prompt_len for q in reqs],
                hovertemplate="%{x}: %{text} (prompt %{customdata} tokens)<extra></extra>")
    fig.add_bar(x=ids, y=tpot, marker_color=PHASE_COLORS["decode"], name="TPOT", row=1, col=2,
                text=[fmt_duration(v) if v is not None else "" for v in tpot_s], textposition="outside",
                customdata=[q.output_len for q in reqs],
                hovertemplate="%{x}: %{text} per token (%{customdata} generated)<extra></extra>")
    top1 = max([v for v in ttft if v is not None] + [1])
    top2 = max([v for v in tpot if v is not None] + [1])
    fig.update_yaxes(range=[0, top1 * 1.25], row=1, col=1)
    fig.update_yaxes(range=[0, top2 * 1.25], row=1, col=2)
    if not any(v is not None for v in tpot):
        # No ticks on an axis with nothing on it: a made-up 0-1.2 scale read as data, and its "0.6" sat under
        # the note.
        fig.update_yaxes(showticklabels=False, showgrid=False, row=1, col=2)
        fig.add_annotation(x=0.5, y=0.5, xref="x2 domain", yref="y2 domain", showarrow=False,
                           text="no request has two tokens<br>at this step", font=dict(color=MUTED, size=13))
    fig.update_layout(showlegend=False)
    return fig
