"""What is in one sequence's KV cache right now, token by token, as small chips.

The cache after a step holds the prompt plus every generated token except the newest (which is
computed, and cached, by the next step). Chips added by the selected step are highlighted.
"""
from __future__ import annotations

import html

import streamlit as st

from engine.trace import StepRecord

from app.session import EngineSession

_CSS = """
<style>
.kv-strip { display:flex; flex-wrap:wrap; gap:3px; line-height:1.1; }
.kv-tok { font-family: 'JetBrains Mono', Menlo, Consolas, monospace; font-size:0.78rem; padding:2px 4px;
          border-radius:4px; border:1px solid transparent; white-space:pre; }
.kv-prompt { background:#EEF0F3; color:#374151; }
.kv-gen { background:#DCEBF7; color:#0B3B60; }
.kv-new { background:#FDE7D4; border-color:#D55E00; color:#7A2E00; font-weight:600; }
.kv-next { background:#FFFFFF; border:1px dashed #9CA3AF; color:#6B7280; }
</style>
"""


def _chip(text: str, cls: str, title: str) -> str:
    return f'<span class="kv-tok {cls}" title="{html.escape(title)}">{html.escape(text) or "∅"}</span>'


def cache_token_strip(session: EngineSession, record: StepRecord, key: str) -> None:
    states = {q.request_id: q for q in record.requests}
    labels = [r for r in session.request_order if r in states and r in session.specs]
    if not labels:
        return
    label = st.selectbox("Show the cached tokens of", labels, key=f"{key}-strip-req")
    state = states[label]
    prev = session.records[record.step - 1] if record.step > 0 else None  # records[i].step == i
    before = next((q.num_computed_tokens for q in prev.requests if q.request_id == label), 0) if prev else 0
    ids = session.prompt_token_ids(label) + session.generated_token_ids(label, record.step)
    cached = state.num_computed_tokens if state.status != "finished" else 0
    tok = session.weights.tokenizer
    chips = []
    for pos, tid in enumerate(ids[:cached]):
        cls = "kv-new" if pos >= before else ("kv-prompt" if pos < state.prompt_len else "kv-gen")
        chips.append(_chip(tok.decode_token(tid), cls, f"position {pos}, token id {tid}"))
    if state.status != "finished" and len(ids) > cached:
        chips.append(_chip(tok.decode_token(ids[cached]), "kv-next", "sampled, not cached yet: the next step computes it"))
    if state.status == "finished":
        st.caption(f"{label} has finished: its blocks went back to the free list, so nothing of it is cached.")
        return
    st.markdown(_CSS + f'<div class="kv-strip">{"".join(chips)}</div>', unsafe_allow_html=True)
    generated = max(cached - state.prompt_len, 0)
    # Orange wins over grey and blue: the count says how many it covers (at step 0 every prompt chip is orange).
    written = max(cached - before, 0)
    st.caption(f"{cached} tokens cached for {label} ({state.prompt_len} prompt, grey; {generated} generated, blue); "
               f"orange = the {written} written by step {record.step}; dashed = the newest token, which the next "
               "step will cache.")
