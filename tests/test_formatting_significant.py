"""`fmt_two_significant`: the table cells for KL and drafting costs, where Streamlit's printf formats have no "#"
flag and "%.2g" printed "3" beside "1.3"."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.formatting import fmt_two_significant


def test_examples() -> None:
    cases = {0.0: "0", 3.0: "3.0", 1.3: "1.3", 0.6: "0.60", 0.523: "0.52", 4.2e-5: "4.2e-05", 1.4e-4: "1.4e-04",
             0.001: "0.0010", 9.96: "10", 12.34: "12", 123.4: "123", 4321.0: "4,321"}
    assert {x: fmt_two_significant(x) for x in cases} == cases


@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_reads_back_within_rounding(x: float) -> None:
    """What the cell says is the number to two significant figures (whole numbers from 10 on), never a
    trailing "." or an exponent above 1."""
    text = fmt_two_significant(x)
    assert not text.endswith(".") and "e+" not in text
    assert abs(float(text.replace(",", "")) - x) <= 0.05 * x + 1e-12
