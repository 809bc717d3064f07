"""Colour helpers shared by chart families."""
from __future__ import annotations

from app.theme import CACHE_COLOR, FREE_COLOR, SHARED_COLOR, request_color


def tint(hex_color: str, alpha: float) -> str:
    """The colour blended towards white (alpha 1 = the colour itself); opaque, so tiles overlap cleanly."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    mix = lambda c: round(255 - (255 - c) * alpha)  # noqa: E731
    return f"rgb({mix(r)},{mix(g)},{mix(b)})"


def owner_color(owner: str, order: list[str]) -> str:
    if owner == "shared":
        return SHARED_COLOR
    if owner == "cache":
        return CACHE_COLOR
    if not owner:
        return FREE_COLOR
    return request_color(owner, order)
