"""Scoring N samples of one prompt and the three ways of choosing among them.

- Self-consistency (majority vote): the most frequent final answer wins; needs no model at all.
- Self-certainty: the sample whose sampled tokens the model itself found most likely (highest mean
  log-probability). It stands in for a process reward model (PRM), which would score each reasoning
  step with a separately trained model: no reward model can be downloaded here.
- Oracle (pass@N): a checker that knows the right answer says whether *any* sample is right: the
  ceiling a perfect verifier could reach, and what "accuracy vs N" is bounded by.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.test_time.answers import extract_answer, majority_vote

RULES: tuple[str, ...] = ("majority vote", "self-certainty", "oracle (pass@N)")


@dataclass(frozen=True, slots=True)
class ScoredSample:
    index: int
    text: str
    answer: str | None
    mean_logprob: float  # over the tokens the model sampled (forced tokens excluded); -inf if none
    num_tokens: int  # output tokens, forced ones included: what the sample cost
    correct: bool | None  # None when the right answer is unknown (a free-form prompt)


@dataclass(frozen=True, slots=True)
class Selection:
    """The index each rule picks (None: the rule has nothing to pick)."""

    majority: int | None
    self_certainty: int | None
    oracle: int | None  # the first correct sample, if any

    def pick(self, rule: str) -> int | None:
        return {RULES[0]: self.majority, RULES[1]: self.self_certainty, RULES[2]: self.oracle}[rule]


def mean_logprob(logprobs: Sequence[float | None]) -> float:
    sampled = [lp for lp in logprobs if lp is not None]
    return sum(sampled) / len(sampled) if sampled else -math.inf


def score_sample(index: int, text: str, logprobs: Sequence[float | None], num_tokens: int,
                 truth: str | None, answer_text: str | None = None) -> ScoredSample:
    """`answer_text`: the part of `text` the answer is read from (None: all of it). Under a thinking budget it
    is what follows the answer cue, so a number written while thinking is never taken for the answer."""
    answer = extract_answer(text if answer_text is None else answer_text)
    correct = None if truth is None else answer == truth
    return ScoredSample(index, text, answer, mean_logprob(logprobs), num_tokens, correct)


def select(samples: Sequence[ScoredSample]) -> Selection:
    answered = [s for s in samples if s.answer is not None]
    vote = majority_vote([s.answer for s in samples])
    certain = max(answered, key=lambda s: s.mean_logprob).index if answered else None
    oracle = next((s.index for s in samples if s.correct), None)
    return Selection(samples[vote].index if vote is not None else None, certain, oracle)


def rule_correct(samples: Sequence[ScoredSample], rule: str) -> bool:
    """Whether `rule` ends up with a right answer on this group of samples."""
    picked = select(samples).pick(rule)
    return picked is not None and bool(next(s for s in samples if s.index == picked).correct)
