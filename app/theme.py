"""One Plotly look for every chart, so screenshots from different pages sit well together.

Chart builders return plain figures and never pick fonts or sizes; `show_figure` applies the
registered template (normal or presentation), a fixed height and the 3x PNG export before the
figure reaches Streamlit.
"""
from __future__ import annotations

import hashlib

import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st

from app.presentation import presentation_on

TEMPLATE = "inferscope"
PRESENT_TEMPLATE = "inferscope_present"
# "Source Sans" is the webfont Streamlit serves with every page, so charts are set in the UI's font on any
# machine; without it a browser with no Arial-like font (Debian's chromium alone) falls back to the wider
# DejaVu Sans and titles sized for the app run past their charts' edges.
FONT = "'Source Sans', 'Source Sans Pro', Inter, 'Helvetica Neue', Arial, sans-serif"

# One colour means one thing on a screen, across the app:
# - STATUS_COLORS are the phases (orange prefill, blue decode, red preempted, pale tints for the rest),
#   shared by every Gantt, the roofline and the chunked-prefill charts;
# - TECHNIQUE_COLOR / BASELINE_COLOR are the two runs of an A/B comparison (continuous vs static batching,
#   cache on vs off, chunked vs unchunked);
# - REQUEST_COLORS tell requests apart and use none of those hues: with r0 in decode blue and r1 in prefill
#   orange, the continuous batching page's "Tokens per request" bars read as phases next to its Gantt.
# Picked with CIEDE2000 distances under normal vision and simulated deuteranopia/protanopia
# (tests/color_distance.py): the first six (the largest scenario) differ from each other, from the phases and
# from the comparison pair; dark, mid and light entries are mixed so they still differ where hues collapse.
# Olive comes late: next to the block pool's yellow shared tiles and the prefill orange it is the weakest.
# Only eight: a ninth request repeats r0's colour rather than getting a near-copy of a phase or of r0.
REQUEST_COLORS: tuple[str, ...] = (
    "#800080",  # purple
    "#006D6F",  # dark teal
    "#A78BFA",  # light violet
    "#9C755F",  # brown
    "#4D4D4D",  # charcoal
    "#999933",  # olive
    "#17BECF",  # turquoise
    "#CF1C90",  # magenta
)
STATUS_COLORS: dict[str, str] = {
    "waiting": "#C9CED6",
    "prefill": "#E69F00",
    "decode": "#0072B2",
    "stalled": "#F3D9A4",
    "preempted": "#D62728",
    "finished": "#9BD3AE",
}
TECHNIQUE_COLOR = "#009E73"  # Okabe-Ito bluish green
BASELINE_COLOR = "#CC79A7"  # Okabe-Ito reddish purple
SHARED_COLOR = "#F0C808"  # copy-on-write shared blocks stand out in yellow
CACHE_COLOR = "#8E8E8E"
FREE_COLOR = "#F1F3F6"
ACCENT = "#D55E00"
MUTED = "#6B7280"

FONT_SIZE = 15  # chart text; titles are 4 points larger
PRESENT_FONT_SIZE = 20
TREE_LABEL_PX = 13  # node labels of the radix tree and the draft tree: one size, readable on a projector

# Exported PNGs always have this size (x3 scale), whatever the browser window was.
EXPORT_WIDTH = 1400


def _template(font_size: int) -> go.layout.Template:
    t = go.layout.Template(pio.templates["plotly_white"])
    t.layout.update(
        font=dict(family=FONT, size=font_size, color="#1F2937"),
        # Title (and subtitle) at the top, the legend under them (place_legend pins it there), then the plot.
        # A subtitle carries the details of a long title: on one line it was cut off in half-width columns.
        title=dict(font=dict(size=font_size + 4), x=0.0, xanchor="left", xref="container",
                   y=1.0, yanchor="top", yref="container", pad=dict(t=10, l=12),
                   subtitle=dict(font=dict(size=font_size, color=MUTED))),
        colorway=list(REQUEST_COLORS),
        margin=dict(l=60, r=20, t=34 + 3 * font_size, b=48),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0,
                    font=dict(size=font_size - 1)),
        hoverlabel=dict(font=dict(family=FONT, size=font_size)),
        xaxis=dict(gridcolor="#E5E7EB", zerolinecolor="#D1D5DB"),
        yaxis=dict(gridcolor="#E5E7EB", zerolinecolor="#D1D5DB"),
        paper_bgcolor="white",
        plot_bgcolor="white",
    )
    return t


def register_templates() -> None:
    """Idempotent; called at import so any page importing charts gets the templates."""
    pio.templates[TEMPLATE] = _template(FONT_SIZE)
    pio.templates[PRESENT_TEMPLATE] = _template(PRESENT_FONT_SIZE)
    pio.templates.default = TEMPLATE


register_templates()


def request_color(request_id: str, order: list[str] | None = None) -> str:
    """A stable colour per request: by position in `order` when given (so the first requests get
    the most distinct colours), else by a hash of the id."""
    if order and request_id in order:
        return REQUEST_COLORS[order.index(request_id) % len(REQUEST_COLORS)]
    digest = int(hashlib.md5(request_id.encode()).hexdigest(), 16)
    return REQUEST_COLORS[digest % len(REQUEST_COLORS)]


def plotly_config(filename: str, height: int, width: int = EXPORT_WIDTH) -> dict:
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "scale": 3, "filename": filename,
                                 "width": width, "height": height},
        # Download, zoom, pan and reset only: the full bar is as wide as a half-width chart's title and
        # covered it whenever the pointer was over the chart.
        "modeBarButtonsToRemove": ["lasso2d", "select2d", "zoomIn2d", "zoomOut2d", "autoScale2d"],
    }


def _title_block_px(fig: go.Figure, font_size: int) -> float:
    """Pixels from the figure's top edge to below its title and subtitle (the template's pad, a title
    line, then Plotly's gap and a subtitle line); 0 without a title."""
    if not fig.layout.title.text:
        return 0.0
    px = 10 + 1.35 * (font_size + 4)
    if fig.layout.title.subtitle.text:
        px += 14 + 1.35 * font_size
    return px


def place_legend(fig: go.Figure, height: int, font_size: int) -> None:
    """Pin a horizontal legend above or below the plot to the figure's own edges, in pixels, so that a
    legend wrapping onto several lines in a narrow column (a 1280-pixel projector, a half-width chart)
    pushes the plot aside instead of covering the title or the x-axis title: Plotly widens the margin
    for a legend placed in container coordinates, but not for one hung off the plot at y = 1 or y < 0.
    Legends placed anywhere else (beside the plot, inside it), and legends a builder hung off the plot with an
    explicit yref="paper" (in a bottom margin it made big enough itself), are left alone."""
    legend = fig.layout.legend
    if legend.orientation == "v" or fig.layout.showlegend is False or legend.yref in ("container", "paper"):
        return
    y = 1.0 if legend.y is None else legend.y  # None: the template's place, above the plot
    if y >= 1.0 and legend.yanchor in (None, "bottom"):
        top = _title_block_px(fig, font_size) + 6
        fig.update_layout(legend=dict(yref="container", y=1 - top / height, yanchor="top"))
    elif y < 0 and legend.yanchor == "top":
        fig.update_layout(legend=dict(yref="container", y=4 / height, yanchor="bottom"))


def make_room_for_subtitle(fig: go.Figure, font_size: int) -> None:
    """A chart that narrows its top margin (grids, graphs) still leaves room for a subtitle under its title."""
    if not (fig.layout.title.text and fig.layout.title.subtitle.text):
        return
    need = _title_block_px(fig, font_size) + 8
    top = fig.layout.margin.t
    if top is not None and top < need:
        fig.update_layout(margin=dict(t=round(need)))


def scale_explicit_fonts(fig: go.Figure, factor: float) -> None:
    """Multiply every font size a chart builder set itself (annotations, marker labels, axis titles and
    ticks): the template's size reaches only text that sets none, so in presentation mode a chart's
    12-point annotations stayed 12 points on the projector while the page around them grew."""
    def scaled(font) -> None:  # noqa: ANN001 - any Plotly font object
        if font is not None and isinstance(font.size, (int, float)):
            font.size = round(font.size * factor)

    for ann in fig.layout.annotations:
        scaled(ann.font)
    for trace in fig.data:
        scaled(getattr(trace, "textfont", None))
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        scaled(axis.tickfont)
        scaled(axis.title.font)


def chart_font_scale() -> float:
    """How much larger `show_figure` will draw the fonts a chart builder set itself (1 outside presentation
    mode): for builders that must fit text into shapes of their own, such as the radix tree's boxes."""
    return PRESENT_FONT_SIZE / FONT_SIZE if presentation_on() else 1.0


def titled_top_margin(px: int = 110) -> int:
    """A top margin that holds a title, its subtitle and what sits above the plot (subplot titles, a label), grown
    by `chart_font_scale()`: in presentation mode at 1024 pixels a fixed margin let the subtitle run into them."""
    return round(px * chart_font_scale())


def show_figure(fig: go.Figure, key: str, height: int = 380, export_width: int = EXPORT_WIDTH) -> None:
    """Render with the house template, a fixed height and a 3x PNG export named after `key`.

    On screen the width follows the column; the exported PNG always has `export_width` x height
    (x3), so slides made from different screens match. Pass a smaller `export_width` for charts
    that sit in a half-width column."""
    present = presentation_on()
    h = int(height * 1.25) if present else height
    font_size = PRESENT_FONT_SIZE if present else FONT_SIZE
    fig.update_layout(template=PRESENT_TEMPLATE if present else TEMPLATE, height=h)
    if present:
        scale_explicit_fonts(fig, chart_font_scale())
    place_legend(fig, h, font_size)
    make_room_for_subtitle(fig, font_size)
    st.plotly_chart(fig, key=key, theme=None, config=plotly_config(f"inferscope-{key}", h, export_width))
