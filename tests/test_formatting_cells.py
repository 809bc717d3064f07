"""Table cells with no value read "–" (a data table prints None or NaN as "None"), the others as formatted."""
from __future__ import annotations

import math

import pandas as pd

from app.formatting import cells_or_dash


def test_missing_values_read_as_a_dash() -> None:
    assert cells_or_dash([7.56, None, math.nan, 0.0], "{:.1f}") == ["7.6", "–", "–", "0.0"]


def test_a_float_column_with_a_missing_value() -> None:
    # pandas stores the None of a float column as NaN: the weight-quantization table's full-precision row.
    column = pd.DataFrame([{"s": None}, {"s": 12.06}])["s"]
    assert cells_or_dash(column, "{:.1f}") == ["–", "12.1"]
    assert cells_or_dash([0.123], "{:.1%}") == ["12.3%"]
