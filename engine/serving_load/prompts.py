"""Prompt token ids of an exact length, cut from a few paragraphs of real text.

A load test needs prompts of chosen lengths, not particular questions; windows of real text keep the
model on ordinary tokens. Each request starts at a different offset so no two prompts share a prefix
(the prefix cache is off here, but a shared start would still make lengths misleading to read).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Protocol

CORPUS = (
    "A lighthouse keeper's day began at dusk. He climbed the spiral stairs, trimmed the wick, polished the "
    "great lens and wound the clockwork that turned it, then wrote the weather into the log every four hours. "
    "Ships far out at sea counted the flashes to know which light they were seeing and so where they were. "
    "Bakers start before dawn because dough needs time: flour, water, salt and yeast are mixed, left to rise, "
    "folded, shaped and proved again before the loaves go into an oven hot enough to turn the crust brown. "
    "A river carries sand and silt from the mountains to the sea. Where it slows down, on the inside of a bend "
    "or at its mouth, the grains settle and build beaches, sandbars and in time whole deltas of new land. "
    "Libraries lend books, but they also keep newspapers, maps, recordings and letters, and librarians help "
    "people find what they need, from a recipe to the records of a town's first school. "
    "Bees visit thousands of flowers a day. They carry nectar home in a special stomach, pass it from bee to "
    "bee and fan it with their wings until enough water evaporates and it becomes honey. "
    "The first railways ran on wooden rails and were pulled by horses. Steam locomotives arrived in the early "
    "nineteenth century, and within a few decades timetables had forced towns to agree on a common time. "
    "A good map leaves things out. Its makers choose a scale, decide which roads and rivers matter, and draw "
    "symbols instead of pictures, so that a traveller can find the way at a glance. "
)


class _Encodes(Protocol):
    def encode(self, text: str) -> list[int]: ...


@lru_cache(maxsize=4)
def _corpus_ids(tokenizer: _Encodes) -> tuple[int, ...]:
    return tuple(tokenizer.encode(CORPUS))


def prompt_ids(tokenizer: _Encodes, length: int, index: int) -> list[int]:
    """`length` token ids of the corpus, starting at an offset that depends on the request's index."""
    if length < 1:
        raise ValueError(f"prompt length must be >= 1, got {length}")
    ids = _corpus_ids(tokenizer)
    start = (index * 37) % len(ids)
    return [ids[(start + i) % len(ids)] for i in range(length)]
