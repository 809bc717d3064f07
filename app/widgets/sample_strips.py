"""Each best-of-N sample's tokens as chips: sampled tokens, forced " Wait," / answer cue / end of turn
in their own colours, and a struck-through chip where the model tried to end its turn too early."""
from __future__ import annotations

import html
from typing import Any

import streamlit as st

from engine.tokenizer import Tokenizer

from app.analysis.test_time import finished
from app.formatting import plural

_CSS = """
<style>
.tt-row { margin: 0 0 8px 0; }
.tt-head { font-size:0.85rem; color:#374151; margin-bottom:2px; }
.tt-strip { display:flex; flex-wrap:wrap; gap:2px; line-height:1.1; }
.tt-tok { font-family: 'JetBrains Mono', Menlo, Consolas, monospace; font-size:0.76rem; padding:2px 3px;
          border-radius:4px; border:1px solid transparent; white-space:pre; }
.tt-sampled { background:#DCEBF7; color:#0B3B60; }
.tt-wait { background:#FDE7D4; border-color:#D55E00; color:#7A2E00; font-weight:700; }
.tt-cue { background:#D1F0E4; border-color:#009E73; color:#00563F; font-weight:700; }
.tt-end { background:#E5E7EB; border-color:#6B7280; color:#374151; font-weight:700; }
.tt-dropped { background:#FFFFFF; border:1px dashed #9CA3AF; color:#9CA3AF; text-decoration:line-through; }
.tt-new { box-shadow: 0 0 0 2px #F0C808; }
</style>
"""
LEGEND = ("blue: sampled by the model · orange: forced “ Wait,” · green: forced answer cue · grey: forced end of "
          "turn · struck through: an end of turn the model sampled and the engine dropped · yellow ring: new in "
          "this step")


def _chip(text: str, cls: str, title: str) -> str:
    return f'<span class="tt-tok {cls}" title="{html.escape(title)}">{html.escape(text) or "∅"}</span>'


def strip_html(sample: dict[str, Any], tokenizer: Tokenizer, new_from: int = 1 << 30) -> str:
    """`new_from`: output position from which tokens count as new in the selected step."""
    forced = dict(sample["forced"])
    dropped = set(sample["replaced_eos"])
    chips = []
    for pos, tid in enumerate(sample["token_ids"]):
        if pos in dropped:
            chips.append(_chip("<|im_end|>", "tt-dropped", f"position {pos}: the model ended its turn here; "
                                                            "the engine dropped it"))
        label = forced.get(pos)
        cls = f"tt-{label}" if label else "tt-sampled"
        lp = sample["logprobs"][pos] if pos < len(sample["logprobs"]) else None
        title = f"position {pos}, token {tid}" + (f", forced ({label})" if label else
                                                  (f", log p = {lp:.2f}" if lp is not None else ""))
        if pos >= new_from:
            cls += " tt-new"
        chips.append(_chip(tokenizer.decode_token(tid), cls, title))
    return f'<div class="tt-strip">{"".join(chips)}</div>'


def sample_head_html(s: dict[str, Any], picked_by: list[str]) -> str:
    """A sample's line above its tokens: label, answer (with "so far" while it writes), mark, score, length."""
    tag = f" · picked by {', '.join(picked_by)}" if picked_by else ""
    # "none yet" while it writes; a finished sample without a number ("Final answer: x") has none for good.
    answer = s["answer"] if s["answer"] is not None else ("none" if finished(s) else "none yet")
    # No mark before a sample has an answer: "none yet ✗" read as a wrong answer.
    right = "" if s["correct"] is None or s["answer"] is None else (" ✓" if s["correct"] else " ✗")
    score = "–" if s["mean_logprob"] == float("-inf") else f"{s['mean_logprob']:.2f}"
    # A running sample's answer is what its text says so far ("10" after "1 0 ↵" may become "10 apples").
    so_far = " so far" if s["answer"] is not None and not finished(s) else ""
    return (f"<b>{html.escape(s['label'])}</b> · answer <b>{html.escape(answer)}</b>{so_far}{right} · mean log p "
            f"{score} · {plural(s['num_tokens'], 'token')}{html.escape(tag)}")


def sample_strips(samples: list[dict[str, Any]], previous: dict[str, int], picks: dict[int, list[str]],
                  tokenizer: Tokenizer) -> None:
    """`previous`: each sample's output length one step earlier (what is new now)."""
    rows = [_CSS]
    for i, s in enumerate(samples):
        head = sample_head_html(s, picks.get(i, []))
        rows.append(f'<div class="tt-row"><div class="tt-head">{head}</div>'
                    f'{strip_html(s, tokenizer, previous.get(s["label"], 0))}</div>')
    st.markdown("".join(rows), unsafe_allow_html=True)
    st.caption(LEGEND)
