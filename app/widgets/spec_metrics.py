"""The two metrics the speculative and the Medusa/EAGLE pages share in their five-metric row.

Values stay short (one line in a fifth of the page) and labels fit one line on a 1280 px projector
in presentation mode; the second number goes in the grey delta chip under the value.
"""
from __future__ import annotations

from streamlit.delta_generator import DeltaGenerator

from app.formatting import NO_VALUE, fmt_duration


def drafting_time_metric(col: DeltaGenerator, draft_seconds: float, verify_seconds: float, help_text: str) -> None:
    """Time the drafter took so far, with the verification time in the chip: the split the speedup rests on.
    Before the first round (the prefill, or plain decoding) there is nothing to time: a dash, as the α and τ
    beside it show, not "0 µs" that reads as a measurement."""
    if draft_seconds == 0 and verify_seconds == 0:
        col.metric("Time drafting", NO_VALUE, delta="no rounds", delta_color="off", delta_arrow="off",
                   help=help_text)
        return
    col.metric("Time drafting", fmt_duration(draft_seconds), delta=f"verifying {fmt_duration(verify_seconds)}",
               delta_color="off", delta_arrow="off", help=help_text)


def step_tokens_metric(col: DeltaGenerator, tokens: int, rounds: int, wall_seconds: float, what: str) -> None:
    """Tokens emitted / rounds verified in the selected step (`what` names a round: chains or trees)."""
    col.metric("This step", f"{tokens} / {rounds}", delta="tokens / rounds", delta_color="off", delta_arrow="off",
               help=f"tokens emitted / {what} verified in the selected step; wall {wall_seconds * 1e3:.0f} ms")
