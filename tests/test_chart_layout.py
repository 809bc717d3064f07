"""Legend placement by `app.theme.place_legend`: legends above or below the plot move into the figure's
own coordinates (so Plotly makes room for them when they wrap), others stay where the chart put them."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from app.theme import FONT_SIZE, PRESENT_FONT_SIZE, TEMPLATE, make_room_for_subtitle, place_legend


def _figure(**layout) -> go.Figure:  # noqa: ANN003
    fig = go.Figure()
    for name in ("r0", "r1"):
        fig.add_bar(x=[0, 1], y=[1, 2], name=name)
    fig.update_layout(template=TEMPLATE, **layout)
    return fig


def test_top_legend_goes_under_the_title() -> None:
    fig = _figure(title="A title")
    place_legend(fig, 400, FONT_SIZE)
    assert (fig.layout.legend.yref, fig.layout.legend.yanchor) == ("container", "top")
    title_px = (1 - fig.layout.legend.y) * 400
    assert 1.35 * (FONT_SIZE + 4) < title_px < 60  # below the title's line, well above a 79-pixel top margin

    with_subtitle = _figure(title=dict(text="A title", subtitle=dict(text="its details")))
    place_legend(with_subtitle, 400, FONT_SIZE)
    assert (1 - with_subtitle.layout.legend.y) * 400 > title_px + FONT_SIZE  # and below the subtitle too

    untitled = _figure()
    place_legend(untitled, 400, FONT_SIZE)
    assert (1 - untitled.layout.legend.y) * 400 < title_px


def test_bottom_legend_goes_to_the_figure_bottom() -> None:
    fig = _figure(legend=dict(yanchor="top", y=-0.2, x=0.0))
    place_legend(fig, 400, FONT_SIZE)
    assert (fig.layout.legend.yref, fig.layout.legend.yanchor) == ("container", "bottom")
    assert 0 < fig.layout.legend.y * 400 <= 8


@pytest.mark.parametrize("legend", [dict(orientation="v", yanchor="top", y=1, x=1.02),  # beside the plot
                                    dict(yanchor="top", y=0.98, x=0.02),  # inside it
                                    dict(yref="container", yanchor="bottom", y=0.0),  # already placed
                                    # hung under the axis title on purpose, in a margin the chart made big enough
                                    dict(yref="paper", yanchor="top", y=-0.3, x=0)])
def test_other_legends_stay(legend: dict) -> None:
    fig = _figure(title="t", legend=legend)
    before = fig.layout.legend.to_plotly_json()
    place_legend(fig, 400, FONT_SIZE)
    assert fig.layout.legend.to_plotly_json() == before


@pytest.mark.parametrize("font_size", [FONT_SIZE, PRESENT_FONT_SIZE])
def test_a_narrow_top_margin_grows_for_a_subtitle(font_size: int) -> None:
    fig = _figure(title=dict(text="Block tables", subtitle=dict(text="each cell holds a physical block id")),
                  margin=dict(t=60))
    make_room_for_subtitle(fig, font_size)
    assert fig.layout.margin.t >= 1.35 * (2 * font_size + 4) + 24
    plain = _figure(title="Block tables", margin=dict(t=60))
    make_room_for_subtitle(plain, font_size)
    assert plain.layout.margin.t == 60
