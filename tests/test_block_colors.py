"""Block numbers on the PagedAttention tiles stay readable whatever request colour the tile has."""
from __future__ import annotations

import pytest

from app.charts.colors import INK, relative_luminance, ink_on, tint
from app.theme import FREE_COLOR, REQUEST_COLORS, SHARED_COLOR


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("color", [*REQUEST_COLORS, SHARED_COLOR, FREE_COLOR])
@pytest.mark.parametrize("alpha", [1.0, 0.65, 0.28])
def test_tile_numbers_get_the_more_readable_ink(color: str, alpha: float) -> None:
    fill = color if alpha == 1.0 else tint(color, alpha)
    ink = ink_on(fill)
    other = "white" if ink == INK else INK
    to_hex = {"white": "#FFFFFF"}.get
    assert _contrast(fill, to_hex(ink, ink)) >= _contrast(fill, to_hex(other, other))
    assert _contrast(fill, to_hex(ink, ink)) >= 3.0  # WCAG's floor for large text and graphics


def test_dark_request_colours_get_white_numbers() -> None:
    assert ink_on(REQUEST_COLORS[0]) == "white"  # purple: near-black digits were unreadable on it
    assert ink_on(FREE_COLOR) == INK
