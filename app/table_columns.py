"""Column helpers shared by the pages' data tables.

A share (0..1) is shown as whole percent points, "76%", like the bar labels on the charts beside it: Streamlit's
"percent" format prints "76.47%", and its printf formats cannot multiply by 100, so the frame shown carries
percent points (`in_percent_points`) and the column formats them (`share_column`). The analyses keep fractions.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.formatting import SAME_AS_FULL
from app.presentation import PRESENT_TEXT_SCALE, presentation_on


def in_percent_points(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """A copy of `frame` with the share columns (0..1) times 100, for `share_column`."""
    return frame.assign(**{c: 100 * frame[c] for c in columns})


def share_column(label: str | None = None, bar: bool = True, **kwargs: Any) -> Any:
    """A share in percent points, "76%": a progress bar (0 to 100), or a plain number with `bar=False`."""
    if bar:
        return st.column_config.ProgressColumn(label, format="%.0f%%", min_value=0, max_value=100, **kwargs)
    return st.column_config.NumberColumn(label, format="%.0f%%", **kwargs)


def differs_at_column(answer: str = "its greedy answer") -> Any:
    """The "Differs at" column of a quantization table (`first_difference_text`'s cells), 80 pixels wide, not 70:
    "same as full" (an answer that never left the full model's) needs 79."""
    return st.column_config.TextColumn("Differs at", width=80, help=(
        f"first token where {answer} differs from the full model's (“{SAME_AS_FULL}”: nowhere)"))


def column_px(px: int) -> int:
    """A column's set width, a quarter wider in presentation mode, whose text is a quarter larger: set widths do
    not grow with the text, and a stretched table shares its spare width out evenly, not in proportion, so a
    wide column sized for the normal page cut its longest cells there."""
    return round(px * PRESENT_TEXT_SCALE) if presentation_on() else px
