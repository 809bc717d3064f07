"""Answers side by side, each with the part that left the reference's answer highlighted (the KV compression
and weight quantization pages)."""
from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import streamlit as st

from engine.kv_compression.lab import first_difference


def text_segments(tokens: Sequence[int], reference: Sequence[int],
                  decode: Callable[[list[int]], str]) -> list[tuple[str, bool]]:
    """The answer as (piece, same as the reference so far): the shared start, then the rest."""
    div = first_difference(tokens, reference)
    if div is None:
        div = len(tokens)
    same, rest = decode(list(tokens[:div])), decode(list(tokens[div:]))
    return [(s, flag) for s, flag in ((same, True), (rest, False)) if s]


def answer_rows(rows: Sequence[tuple[str, str, Sequence[int]]], reference: Sequence[int],
                decode: Callable[[list[int]], str], css: str) -> None:
    """rows: (label, colour, tokens). `css` prefixes the classes (`{css}-row` per answer) so a page's tests can
    find its rows."""
    lines = []
    for label, color, tokens in rows:
        # Newlines as <br>: a blank line inside st.markdown's HTML ends the block, and the rest of the answer
        # fell out of its row as plain markdown, unhighlighted.
        parts = "".join(f'<span class="{css}-{"same" if same else "diff"}">{html.escape(text).replace(chr(10), "<br>")}'
                        '</span>' for text, same in text_segments(tokens, reference, decode))
        lines.append(f'<div class="{css}-row"><span class="{css}-name" style="border-color:{color}">'
                     f'{html.escape(label)}</span>{parts or "<i>(no text)</i>"}</div>')
    style = (f"<style>.{css}-row{{margin:0.25rem 0 0.6rem 0;line-height:1.55;white-space:pre-wrap}}"
             f".{css}-name{{display:inline-block;font-weight:600;border-left:6px solid;padding-left:0.4rem;"
             f"margin-right:0.5rem}}.{css}-diff{{background:#FDE2CC;border-radius:3px}}</style>")
    st.markdown(style + "".join(lines), unsafe_allow_html=True)
