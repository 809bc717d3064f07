"""Reading a final answer out of a sample's text, and voting over answers (self-consistency).

The task set's answers are small whole numbers, so an answer is a normalised integer string. The
135M model writes "four" as often as "4", so number words count too.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
          "sixteen seventeen eighteen nineteen twenty").split()
_NUMBER = re.compile(r"-?\d+|\b(?:" + "|".join(_WORDS) + r")\b", re.IGNORECASE)
ANSWER_MARKERS = ("final answer", "answer is", "answer:")


def _normalise(token: str) -> str:
    low = token.lower()
    return str(_WORDS.index(low)) if low in _WORDS else str(int(low))


def extract_answer(text: str) -> str | None:
    """The sample's final answer: the first number after the last answer marker ("Final answer:",
    "the answer is"), else the last number in the text; None when the text has no number at all."""
    clean = text.replace(",", "")
    low = clean.lower()
    cut = max((low.rfind(m) + len(m) for m in ANSWER_MARKERS if m in low), default=-1)
    if cut >= 0:
        after = _NUMBER.search(clean, cut)
        if after:
            return _normalise(after.group())
    found = _NUMBER.findall(clean)
    return _normalise(found[-1]) if found else None


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """Index of the sample self-consistency picks: one holding the most frequent answer (ties go to the
    answer seen first, so the vote is deterministic); None when no sample has an answer."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    winner = next(a for a in answers if a is not None and counts[a] == top)
    return answers.index(winner)
