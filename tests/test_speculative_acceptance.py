"""The acceptance rule on synthetic distributions: exact in law, and the test has teeth.

Thousands of seeded rounds over a small vocabulary; a chi-square test compares the histogram of
the first two emitted tokens with the target's own joint law p1(x1) p2(x2 | x1). The same statistic
run with a deliberately wrong rule (on rejection resample from p instead of the residual
max(0, p - q)) must be rejected, so a silently broken rule cannot pass.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.speculative.acceptance import exact_residual, verify_greedy, verify_sampled
from engine.speculative.drafters import PromptLookupDrafter
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

V = 6
N = 8_000


def _dist(g: torch.Generator, sharp: float) -> torch.Tensor:
    return torch.softmax(sharp * torch.randn(V, generator=g), dim=-1)


def _world(seed: int = 0):
    """Target p1, p2(.|x1), p3(.|x1, x2) and drafter q1, q2(.|x1): different enough that the wrong
    rule's bias is large, with no cell so small the chi-square approximation breaks."""
    g = torch.Generator().manual_seed(seed)
    p1 = _dist(g, 0.8)
    p2 = torch.stack([_dist(g, 0.8) for _ in range(V)])
    p3 = _dist(g, 0.8)
    q1 = _dist(g, 1.5)
    q2 = torch.stack([_dist(g, 1.5) for _ in range(V)])
    return p1, p2, p3, q1, q2


def _joint_histogram(stochastic_q: bool, residual=exact_residual, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    p1, p2, p3, q1, q2 = _world()
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(N):
        if stochastic_q:  # a model drafter: d1 ~ q1, d2 ~ q2(.|d1)
            d1 = int(torch.multinomial(q1, 1, generator=gen))
            d2 = int(torch.multinomial(q2[d1], 1, generator=gen))
            q = torch.stack([q1, q2[d1]])
        else:  # a deterministic drafter (prompt lookup): fixed proposal, one-hot q
            d1, d2, q = 2, 4, None
        p = torch.stack([p1, p2[d1], p3])
        v = verify_sampled(p, [d1, d2], q, gen, residual=residual)
        x1 = v.tokens[0]
        # One token emitted: the second comes from the next round, whose first token is (by the
        # very property under test, for the correct rule) a draw from p2(.|x1).
        x2 = v.tokens[1] if len(v.tokens) > 1 else int(torch.multinomial(p2[x1], 1, generator=gen))
        counts[x1, x2] += 1
    expected = N * p1[:, None] * p2
    return counts, expected


def _pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    obs = counts.flatten().double()
    exp = expected.flatten().double()
    return float(chisquare(obs.numpy(), (exp / exp.sum() * obs.sum()).numpy()).pvalue)


@pytest.mark.parametrize("stochastic_q", [True, False], ids=["model-drafter", "one-hot-drafter"])
def test_first_two_tokens_follow_the_target(stochastic_q):
    counts, expected = _joint_histogram(stochastic_q)
    assert expected.min() > 5  # the chi-square approximation is valid on every cell
    assert _pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("stochastic_q", [True, False], ids=["model-drafter", "one-hot-drafter"])
def test_negative_control_plain_resample_from_p_is_caught(stochastic_q):
    counts, expected = _joint_histogram(stochastic_q, residual=lambda p, q: p)
    assert _pvalue(counts, expected) < 1e-6


def test_acceptance_probability_is_min_one_p_over_q():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.25, 0.25, 0.5]])
    gen = torch.Generator().manual_seed(0)
    # draft 0: p/q = 2 -> always accepted; draft 2: p/q = 0.4 -> accepted 40% of the time
    assert all(verify_sampled(p, [0], q, gen).num_accepted == 1 for _ in range(200))
    acc = sum(verify_sampled(p, [2], q, gen).num_accepted for _ in range(4000)) / 4000
    assert abs(acc - 0.4) < 0.03
    # On rejection of draft 2 the residual is max(0, p - q) = [0.25, 0.05, 0] / 0.3: never token 2.
    for _ in range(300):
        v = verify_sampled(p, [2], q, gen)
        if v.num_accepted == 0:
            assert v.tokens[0] != 2 and v.final_kind == "resampled"
            assert v.residual_mass == pytest.approx(0.3)


def test_verdict_bookkeeping_sampled():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    v = verify_sampled(p, [0, 2], None, torch.Generator().manual_seed(0))
    assert v.verdicts == ("accepted", "rejected") and v.num_accepted == 1
    assert v.tokens == (0, 1) and v.final_kind == "resampled"
    assert v.p == (1.0, 0.0) and v.q == (1.0, 1.0)
    assert v.uniforms[0] is not None and v.uniforms[1] is not None
    v = verify_sampled(p, [0, 1], None, torch.Generator().manual_seed(0))
    assert v.tokens == (0, 1, 2) and v.final_kind == "bonus" and v.residual_mass is None
    with pytest.raises(ValueError):
        verify_sampled(p, [0], None, None)  # 3 rows for 1 draft


def test_same_generator_seed_same_round():
    p = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(3)), -1)
    q = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(4)), -1)
    a = verify_sampled(p, [1, 2, 3], q, torch.Generator().manual_seed(9))
    b = verify_sampled(p, [1, 2, 3], q, torch.Generator().manual_seed(9))
    assert a == b


def test_greedy_rule():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 7, 1, 9]):
        logits[row, best] = 5.0
    v = verify_greedy(logits, [3, 7, 2])
    assert v.tokens == (3, 7, 1) and v.num_accepted == 2 and v.final_kind == "resampled"
    assert v.verdicts == ("accepted", "accepted", "rejected")
    assert v.target_argmax == (3, 7, 1, 9)
    v = verify_greedy(logits, [3, 7, 1])
    assert v.tokens == (3, 7, 1, 9) and v.final_kind == "bonus"
    v = verify_greedy(logits, [0, 7, 1])
    assert v.tokens == (3,) and v.verdicts == ("rejected", "unverified", "unverified")
    v = verify_greedy(logits[:1], [])
    assert v.tokens == (3,) and v.final_kind == "bonus"


# ---- prompt lookup (no model needed) ---------------------------------------------------------------
def _seq(tokens: list[int]) -> Sequence:
    s = Sequence("r", list(tokens), 1, SamplingParams(), 0, 0)
    s.num_computed_tokens = len(tokens) - 1
    return s


def test_prompt_lookup_prefers_longest_then_most_recent_match():
    d = PromptLookupDrafter(1, 3)
    # "5 6 7" occurs at 0 (then 8 9) and the suffix "6 7" also occurs at 5 (then 1); the 3-gram wins.
    prop = d.propose(_seq([5, 6, 7, 8, 9, 6, 7, 1, 5, 6, 7]), 2)
    assert prop.tokens == [8, 9] and prop.detail["ngram_n"] == 3 and prop.detail["match_position"] == 0
    # Only the 1-gram "7" matches; the most recent earlier "7" is at 2, followed by 3 4.
    prop = d.propose(_seq([1, 7, 2, 3, 7, 3, 4, 9, 7]), 3)
    assert prop.tokens == [3, 4, 9] and prop.detail["match_position"] == 4
    assert d.propose(_seq([1, 2, 3, 4]), 4).tokens == []  # no earlier occurrence
    # A continuation running into the present keeps copying at the same lag: 1 2 | 1 2 1 2 1.
    assert d.propose(_seq([1, 2, 1, 2]), 5).tokens == [1, 2, 1, 2, 1]
    assert d.propose(_seq([4, 9, 9, 9]), 3).tokens == [9, 9, 9]


def test_prompt_lookup_max_proposal_matches_propose():
    d = PromptLookupDrafter(2, 3)
    s = _seq([4, 5, 6, 1, 2, 4, 5])
    assert d.max_proposal(s, 3) == 3
    assert d.propose_batch([(s, 2)])[0].tokens == [6, 1]
    assert d.max_proposal(_seq([1, 2, 3, 4, 5]), 3) == 0
