"""Colour helpers shared by chart families."""
from __future__ import annotations

from app.theme import CACHE_COLOR, FREE_COLOR, SHARED_COLOR, request_color


def rgb_channels(color: str) -> tuple[int, int, int]:
    """0-255 channels of "#RRGGBB" or "rgb(r,g,b)" (what `tint` returns)."""
    if color.startswith("rgb("):
        r, g, b = (int(c) for c in color[4:-1].split(","))
    else:
        h = color.lstrip("#")
        r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return r, g, b


def tint(hex_color: str, alpha: float) -> str:
    """The colour blended towards white (alpha 1 = the colour itself); opaque, so tiles overlap cleanly."""
    mix = lambda c: round(255 - (255 - c) * alpha)  # noqa: E731
    r, g, b = (mix(c) for c in rgb_channels(hex_color))
    return f"rgb({r},{g},{b})"


INK = "#111827"
# A white outline for dark text that sits on mixed or dark ground (Plotly font.shadow, CSS text-shadow syntax).
HALO = "1px 1px 1px #fff, -1px -1px 1px #fff, 1px -1px 1px #fff, -1px 1px 1px #fff"


def relative_luminance(color: str) -> float:
    """WCAG relative luminance of "#RRGGBB" or "rgb(r,g,b)"."""
    chans = [c / 255 for c in rgb_channels(color)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in chans]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def ink_on(fill: str) -> str:
    """Near-black or white text, whichever contrasts more with `fill`: block numbers in near-black were
    unreadable on the dark request colours (purple, teal, charcoal)."""
    lum = relative_luminance(fill)
    return "white" if 1.05 / (lum + 0.05) > (lum + 0.05) / (relative_luminance(INK) + 0.05) else INK


def owner_color(owner: str, order: list[str]) -> str:
    if owner == "shared":
        return SHARED_COLOR
    if owner == "cache":
        return CACHE_COLOR
    if not owner:
        return FREE_COLOR
    return request_color(owner, order)


# The bundled LoRA adapters keep one colour each across the LoRA pages (and the base model a neutral grey);
# any other adapter name takes a request colour by its place in `order`.
ADAPTER_COLORS: dict[str, str] = {"base model": "#B5BBC4", "pirate": "#C85200", "terse": "#1170AA",
                                  "bullets": "#3E8E41"}


def adapter_color(name: str | None, order: list[str] | None = None) -> str:
    key = name or "base model"
    if key in ADAPTER_COLORS:
        return ADAPTER_COLORS[key]
    return request_color(key, order or [key])
