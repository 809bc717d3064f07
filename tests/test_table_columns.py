"""Shares shown in whole percent points: the frame shown is a scaled copy, the analysis frame keeps fractions."""
from __future__ import annotations

import math

import pandas as pd

from app.table_columns import in_percent_points, share_column


def test_shares_become_percent_points_in_a_copy() -> None:
    frame = pd.DataFrame({"name": ["a", "b"], "top-1": [0.7647, float("nan")], "KL": [0.1, 0.2]})
    shown = in_percent_points(frame, "top-1")
    assert shown["top-1"].iloc[0] == 76.47 and math.isnan(shown["top-1"].iloc[1])
    assert list(shown["KL"]) == [0.1, 0.2] and frame["top-1"].iloc[0] == 0.7647  # the rest, and the original, kept


def test_a_share_column_formats_whole_percent_points() -> None:
    bar, plain = share_column("share"), share_column("busy", bar=False)
    assert {k: bar["type_config"][k] for k in ("type", "format", "min_value", "max_value")} == {
        "type": "progress", "format": "%.0f%%", "min_value": 0, "max_value": 100}
    assert plain["type_config"]["type"] == "number" and plain["type_config"]["format"] == "%.0f%%"
