"""Block-id lists written short: runs of three or more consecutive ids become a range, and reading the
text back gives the same ids in the same order."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.formatting import fmt_block_ids


def _parse(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(", ")):
        a, _, b = part.partition("–")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


@given(st.lists(st.integers(0, 200), max_size=40))
def test_block_ids_read_back(blocks: list[int]) -> None:
    text = fmt_block_ids(blocks)
    assert _parse(text) == blocks
    assert len(text) <= len(", ".join(map(str, blocks)))


def test_examples() -> None:
    assert fmt_block_ids(list(range(9, 28))) == "9–27"
    assert fmt_block_ids([6, 7, 0]) == "6, 7, 0"
    assert fmt_block_ids([3, 4, 5, 12]) == "3–5, 12"
