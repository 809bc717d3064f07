"""A compact table of every request's state at the selected step (status, tokens, text so far)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.trace import StepRecord

from app.formatting import NO_VALUE

# TTFT as a number in milliseconds, so the column sorts by value (adaptive-unit text sorted "1.2 s" before "80 ms");
# one decimal keeps a GPU's few-millisecond TTFTs readable beside a CPU's seconds.
TTFT_COLUMN = st.column_config.NumberColumn("TTFT (ms)", format="%.1f",
                                            help="time to first token, from arrival; empty until the first token")


def ttft_ms(seconds: float) -> float | None:
    """A request's TTFT in ms for a table cell; None (printed as the placeholder) before its first token (the
    records hold -1 seconds until then)."""
    return seconds * 1e3 if seconds >= 0 else None


def request_state_table(record: StepRecord, bytes_per_token: int | None = None) -> None:
    rows = []
    for q in record.requests:
        row = {"request": q.request_id, "status": q.status, "arrives": q.arrival_step, "prompt": q.prompt_len,
               "generated": q.output_len, "in cache": q.num_computed_tokens}
        if bytes_per_token:
            row["KV KiB"] = q.num_computed_tokens * bytes_per_token / 1024 if q.status != "finished" else 0.0
        row.update({"preempted": q.num_preemptions, "TTFT": ttft_ms(q.ttft_seconds),
                    "text so far": q.text})
        rows.append(row)
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", placeholder=NO_VALUE,
                 column_config={"KV KiB": st.column_config.NumberColumn(format="%.0f"), "TTFT": TTFT_COLUMN,
                                "text so far": st.column_config.TextColumn(width="large")})
    # Text after an end-of-turn token only happens when the request ignores EOS (the library's scenarios do).
    if any("<|im_end|>" in q.text.rstrip().removesuffix("<|im_end|>") for q in record.requests):
        st.caption("“<|im_end|>” is the model's end-of-turn token. Requests that set ignore_eos run to their "
                   "max_tokens and the batch keeps a fixed shape to look at; the text carries on past the end of "
                   "the answer.")
