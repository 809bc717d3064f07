"""Draft trees on synthetic distributions: mask shape, greedy path walk, and the sampled rule's law.

The sampled tree rule must emit its first token exactly from the target's p, whatever the tree: a
chi-square test over thousands of seeded rounds checks it, and the same statistic run with a
deliberately broken rule (a rejected sibling stays in the distribution) must be rejected.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.speculative.tree import DraftTree, verify_tree_greedy, verify_tree_sampled
from engine.speculative.tree_drafters import medusa_paths, rank_priors

V = 6
N = 8_000


def _tree() -> DraftTree:
    #        root
    #      /   |   \
    #    0:3  1:1  2:4          depth 1
    #    / \    |
    #  3:2 4:5 5:0              depth 2
    #   |
    #  6:1                      depth 3
    return DraftTree(tokens=(3, 1, 4, 2, 5, 0, 1), parents=(-1, -1, -1, 0, 0, 1, 3),
                     probs=(0.5, 0.3, 0.1, 0.6, 0.2, 0.9, 0.7), scores=(0.5, 0.3, 0.1, 0.3, 0.1, 0.27, 0.21))


def test_depths_children_paths_and_mask():
    t = _tree()
    assert t.depths == [1, 1, 1, 2, 2, 2, 3]
    assert t.children(-1) == [0, 1, 2] and t.children(0) == [3, 4] and t.children(2) == []
    assert t.path_to(6) == [0, 3, 6]
    m = t.mask()
    assert m.shape == (8, 8)
    assert m[:, 0].all()  # everyone sees the root
    # row of node 6 (row 7) sees the root, nodes 0, 3 and itself only
    assert m[7].nonzero().flatten().tolist() == [0, 1, 4, 7]
    # siblings never see each other; nothing sees a later row
    assert not m[2, 1] and not m[1, 2]
    assert not torch.triu(m, diagonal=1).any()
    with pytest.raises(ValueError):
        DraftTree((1, 2), (1, -1), (0.5, 0.5), (0.5, 0.5))  # a child before its parent


def test_truncated_tree_stays_a_tree():
    t = _tree().truncated(4)
    assert t.tokens == (3, 1, 4, 2) and t.parents == (-1, -1, -1, 0)


def _logits_argmax(rows: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(rows), V)
    for r, tok in enumerate(rows):
        logits[r, tok] = 5.0
    return logits


def test_greedy_walk_follows_the_target_argmax():
    t = _tree()
    # root row wants 3 (node 0), node 0's row wants 2 (node 3), node 3's row wants 1 (node 6), node 6 wants 4
    rows = [3, 5, 5, 5, 1, 5, 5, 4]
    rows[1] = 2
    v = verify_tree_greedy(_logits_argmax(rows), t)
    assert v.path == [0, 3, 6] and v.tokens == [3, 2, 1, 4] and v.final_kind == "bonus"
    # root wants 4 (node 2, a leaf): one accepted, bonus from node 2's row
    rows = [4, 0, 0, 0, 0, 0, 0, 0]
    rows[3] = 5
    v = verify_tree_greedy(_logits_argmax(rows), t)
    assert v.path == [2] and v.tokens == [4, 5]
    # root wants 0: no child matches, the target's own token replaces the tree
    v = verify_tree_greedy(_logits_argmax([0] * 8), t)
    assert v.path == [] and v.tokens == [0] and v.final_kind == "resampled"


def _broken(probs, tree, gen):
    """A wrong rule: rejected siblings are not removed before the next one is tried."""
    p = probs[0].double()
    for c in tree.children(-1):
        if float(torch.rand((), generator=gen, dtype=torch.float64)) < float(p[tree.tokens[c]]):
            return tree.tokens[c]
    return int(torch.multinomial(p.float(), 1, generator=gen))


@pytest.mark.parametrize("rule", ["exact", "broken"])
def test_sampled_tree_rule_emits_the_target_distribution(rule):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(0.8 * torch.randn(8, V, generator=g), dim=-1)
    tree = _tree()
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(V)
    for _ in range(N):
        tok = verify_tree_sampled(probs, tree, gen).tokens[0] if rule == "exact" else _broken(probs, tree, gen)
        counts[tok] += 1
    p_value = chisquare(counts.numpy(), (N * probs[0]).numpy()).pvalue
    if rule == "exact":
        assert p_value > 1e-3
    else:
        assert p_value < 1e-6


def test_sampled_second_token_follows_the_target_given_the_first():
    """Conditioned on an accepted first node, the next token is drawn from that node's row."""
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(0.8 * torch.randn(8, V, generator=g), dim=-1)
    probs[0] = torch.tensor([0.05, 0.05, 0.05, 0.75, 0.05, 0.05])  # node 0 (token 3) usually accepted
    tree = _tree()
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(V)
    for _ in range(N):
        v = verify_tree_sampled(probs, tree, gen)
        if v.tokens[0] == 3:
            counts[v.tokens[1]] += 1
    n = counts.sum()
    assert chisquare(counts.numpy(), (n * probs[1]).numpy()).pvalue > 1e-3


def test_medusa_static_tree_is_best_first_and_parent_closed():
    meta = {"held_out_top1_head0": 0.6, "held_out_top3_head0": 0.8, "held_out_top1_head1": 0.4,
            "held_out_top3_head1": 0.6}
    paths = medusa_paths(rank_priors(meta, 2, 3), 6)
    assert len(paths) == 6 and paths[0] == (0,)
    assert all(p[:-1] in paths for p in paths if len(p) > 1)
    assert [len(p) for p in paths] == sorted(len(p) for p in paths)  # parents first
    assert (0, 0) in paths  # 0.6 * 0.4 beats head 0's third rank (0.1)


def test_draft_vocabulary_head_only_proposes_its_tokens():
    from engine.speculative.draft_vocab import VOCAB_FILE, DraftLMHead

    if not VOCAB_FILE.exists():
        pytest.skip("draft vocabulary not built (python -m training.draft_vocab)")
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(49152, 16, generator=g)
    head = DraftLMHead(embed, 512)
    assert head.size == 512 and head.ids is not None
    hidden = torch.randn(3, 16, generator=g)
    probs = head.probs(hidden)
    assert probs.shape == (3, 49152)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    outside = torch.ones(49152, dtype=torch.bool)
    outside[head.ids] = False
    assert float(probs[:, outside].abs().max()) == 0.0
    # On its own tokens it agrees with the full head's logits.
    full = hidden @ embed.T
    assert torch.allclose(head.logits(hidden)[:, head.ids], full[:, head.ids], atol=1e-5)
    assert DraftLMHead(embed, 0).size == 49152  # 0 = the full vocabulary
