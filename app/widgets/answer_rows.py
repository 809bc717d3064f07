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
    st.markdown(answer_rows_html(rows, reference, decode, css), unsafe_allow_html=True)


def answer_rows_html(rows: Sequence[tuple[str, str, Sequence[int]]], reference: Sequence[int],
                     decode: Callable[[list[int]], str], css: str) -> str:
    """`answer_rows`' HTML: one line of markup per answer, its newlines drawn as ⏎."""
    lines = []
    for label, color, tokens in rows:
        # Newlines as a grey ⏎ inside the line, as the token views show them: a raw blank line ended st.markdown's
        # HTML block (the rest fell out of its row), and line breaks left blank gaps between one row's lines.
        newline = f'<span class="{css}-nl">⏎</span> '
        parts = "".join(f'<span class="{css}-{"same" if same else "diff"}">'
                        f'{html.escape(text).replace(chr(10), newline)}</span>'
                        for text, same in text_segments(tokens, reference, decode))
        lines.append(f'<div class="{css}-row"><span class="{css}-name" style="border-color:{color}">'
                     f'{html.escape(label)}</span>{parts or "<i>(no text)</i>"}</div>')
    style = (f"<style>.{css}-row{{margin:0.25rem 0 0.6rem 0;line-height:1.55}}.{css}-nl{{color:#9CA3AF}}"
             f".{css}-name{{display:inline-block;font-weight:600;border-left:6px solid;padding-left:0.4rem;"
             f"margin-right:0.5rem}}.{css}-diff{{background:#FDE2CC;border-radius:3px}}</style>")
    return style + "".join(lines)
