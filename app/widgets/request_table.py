"""A compact table of every request's state at the selected step (status, tokens, text so far)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.trace import StepRecord

from app.formatting import fmt_duration


def request_state_table(record: StepRecord, bytes_per_token: int | None = None) -> None:
    rows = []
    for q in record.requests:
        row = {"request": q.request_id, "status": q.status, "arrives": q.arrival_step, "prompt": q.prompt_len,
               "generated": q.output_len, "in cache": q.num_computed_tokens}
        if bytes_per_token:
            row["KV KiB"] = q.num_computed_tokens * bytes_per_token / 1024 if q.status != "finished" else 0.0
        row.update({"preempted": q.num_preemptions, "TTFT": fmt_duration(q.ttft_seconds) if q.ttft_seconds >= 0 else "–",
                    "text so far": q.text})
        rows.append(row)
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={"KV KiB": st.column_config.NumberColumn(format="%.0f"),
                                "text so far": st.column_config.TextColumn(width="large")})
    # Text after an end-of-turn token only happens when the request ignores EOS (the library's scenarios do).
    if any("<|im_end|>" in q.text.rstrip().removesuffix("<|im_end|>") for q in record.requests):
        st.caption("“<|im_end|>” is the model's end-of-turn token. Requests that set ignore_eos run to their "
                   "max_tokens and the batch keeps a fixed shape to look at; the text carries on past the end of "
                   "the answer.")
