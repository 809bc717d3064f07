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


# An arithmetic step after a number: the number starts an expression ("3 + 4 = 7"), not the answer.
_OPERATOR = re.compile(r"\s*([-+*/×÷=]|\b(?:plus|minus|times|equals)\b)\s*", re.IGNORECASE)


def _value(clean: str, first: re.Match[str]) -> str | None:
    """What the expression starting at the number `first` comes to: the number itself when nothing
    arithmetic follows it, the number after its last "=" ("3 + 4 = 7" is 7), and None for an expression
    with no result (a sample cut off at "Final answer: 3 + 4 =" or "3 +" had answered 3)."""
    last, equals = first, False
    while op := _OPERATOR.match(clean, last.end()):
        nxt = _NUMBER.match(clean, op.end())
        if nxt is None:
            if not clean[op.end():].strip():
                return None  # cut off mid-expression
            break  # a dash or sign in the prose after the number, not arithmetic
        last, equals = nxt, op.group(1).lower() in ("=", "equals")
    return _normalise(last.group()) if last is first or equals else None


def extract_answer(text: str) -> str | None:
    """The sample's final answer: the value of what follows the last answer marker ("Final answer:",
    "the answer is"), else of the last number in the text (see `_value`); None when the text has no
    number, or its answer is an expression without a result."""
    clean = text.replace(",", "")
    low = clean.lower()
    cut = max((low.rfind(m) + len(m) for m in ANSWER_MARKERS if m in low), default=-1)
    if cut >= 0:
        after = _NUMBER.search(clean, cut)
        if after:
            return _value(clean, after)
    found = list(_NUMBER.finditer(clean))
    if not found:
        return None
    # The last number may end an expression ("2 + 6 = 8"): read from where that expression starts.
    start = found[-1]
    for m in reversed(found[:-1]):
        if not _OPERATOR.fullmatch(clean, m.end(), start.start()):
            break
        start = m
    return _value(clean, start)


def vote_counts(answers: Sequence[str | None]) -> dict[str, int]:
    """Samples per answer, most votes first; ties keep the order the answers first appear, which is
    the order self-consistency breaks them in. Samples without an answer cast no vote."""
    return dict(Counter(a for a in answers if a is not None).most_common())


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """Index of the sample self-consistency picks: the first holding the answer `vote_counts` puts
    first (so the vote is deterministic); None when no sample has an answer."""
    counts = vote_counts(answers)
    return answers.index(next(iter(counts))) if counts else None
