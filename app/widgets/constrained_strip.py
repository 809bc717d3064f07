"""A constrained sample's output tokens as chips, coloured by what decided each one: the model's own first
choice, a choice the grammar steered away from the model's favourite, the only token the grammar allowed,
or text jump-forward wrote without sampling. Hovering a chip lists the model's five favourites there."""
from __future__ import annotations

import html
from typing import Any

import streamlit as st

from engine.tokenizer import Tokenizer

from app.analysis.constrained import KIND_NAMES

_CSS = """
<style>
.cd-row { margin: 0 0 8px 0; }
.cd-head { font-size:0.85rem; color:#374151; margin-bottom:2px; }
.cd-strip { display:flex; flex-wrap:wrap; gap:2px; line-height:1.1; }
.cd-tok { font-family: 'JetBrains Mono', Menlo, Consolas, monospace; font-size:0.76rem; padding:2px 3px;
          border-radius:4px; border:1px solid transparent; white-space:pre; }
.cd-free, .cd-unconstrained { background:#DCEBF7; color:#0B3B60; }
.cd-steered { background:#FDE7D4; border-color:#D55E00; color:#7A2E00; font-weight:700; }
.cd-only { background:#E5E7EB; border-color:#6B7280; color:#374151; }
.cd-forced { background:#D1F0E4; border-color:#009E73; color:#00563F; font-weight:700; }
.cd-new { box-shadow: 0 0 0 2px #F0C808; }
</style>
"""
LEGEND = ("blue: the model's first choice was allowed (greedy: and taken) · orange: steered (the model's first choice "
          "was forbidden) · grey: "
          "the only token the grammar allowed (a forward pass with no choice) · green: written by jump-forward, "
          "no sampling · yellow ring: new in this step · hover a token for the model's five favourites there")


def _title(pos: int, ev: dict[str, Any], tokenizer: Tokenizer) -> str:
    head = f"#{pos}, token {ev['token']}: {KIND_NAMES[ev['kind']]}"
    if ev["allowed"] is not None:
        head += f"; {ev['allowed']:,} tokens allowed"
    if ev["masked_mass"] is not None:
        head += f"; p forbidden {ev['masked_mass']:.2f}"
    lines = [f"{'✓' if ok else '✗'} {tokenizer.decode_token(t)!s}  p = {p:.3f}" for t, p, ok in ev["top"]]
    return head + ("\nthe model's favourites (✗ = forbidden):\n" + "\n".join(lines) if lines else "")


def strip_html(sample: dict[str, Any], tokenizer: Tokenizer, new_from: int = 1 << 30) -> str:
    chips = []
    for pos, ev in enumerate(sample["events"]):
        cls = f"cd-tok cd-{ev['kind']}" + (" cd-new" if pos >= new_from else "")
        text = tokenizer.decode_token(ev["token"])
        chips.append(f'<span class="{cls}" title="{html.escape(_title(pos, ev, tokenizer))}">'
                     f'{html.escape(text) or "∅"}</span>')
    return f'<div class="cd-strip">{"".join(chips)}</div>'


def constrained_strips(samples: list[dict[str, Any]], previous: dict[str, int], tokenizer: Tokenizer) -> None:
    """`previous`: each sample's output length one step earlier (what is new now)."""
    rows = [_CSS]
    for s in samples:
        if s["valid"] is not None:
            state = "valid ✓" if s["valid"] else "not valid ✗"
        elif s["status"] == "finished":
            state = "finished"
        else:
            state = "running, the grammar could end here" if s["accepting"] else "running"
        head = f"<b>{html.escape(s['label'])}</b> · {len(s['events'])} tokens · {state}"
        if s["finish_reason"] == "length" and s["valid"] is False:
            head += " · ended by length: max tokens ran out before the grammar could finish"
        elif s["finish_reason"]:
            head += f" · ended by {html.escape(s['finish_reason'])}"
        rows.append(f'<div class="cd-row"><div class="cd-head">{head}</div>'
                    f'{strip_html(s, tokenizer, previous.get(s["label"], 0))}</div>')
    st.markdown("".join(rows), unsafe_allow_html=True)
    st.caption(LEGEND)
