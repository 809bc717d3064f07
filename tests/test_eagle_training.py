"""The EAGLE layer's training-time test trains exactly what the engine's tree drafting computes:
row i of unroll step k equals the depth-k node the drafter builds on a context ending at i."""
from __future__ import annotations

import dataclasses

import torch

from engine.speculative.heads import EagleLayer, RopeTables
from engine.tokenizer import default_tokenizer
from engine.weights import default_config
from training.train_eagle import step_rows, unroll_mask, unrolled_features
from training.common import Conversation


def _tiny_layer() -> tuple[EagleLayer, object]:
    cfg = dataclasses.replace(default_config(default_tokenizer()), hidden_size=64, intermediate_size=128,
                              num_heads=4, num_kv_heads=2, head_dim=16)
    torch.manual_seed(0)
    layer = EagleLayer(cfg)
    for p in layer.parameters():  # random, not the zero/one initialisations
        p.data.normal_(0, 0.3)
    return layer.eval(), cfg


def test_unroll_mask_sees_the_context_and_its_own_chain() -> None:
    m = unroll_mask(4, 2)[0]
    assert m.shape == (4, 12)
    assert m[2, :4].tolist() == [True, True, True, False]  # step 0's keys up to its own row
    assert m[2, 4:8].tolist() == [False, False, True, False]  # its own row of step 1
    assert m[2, 8:].tolist() == [False, False, True, False]  # and of step 2 (itself)


def test_step_rows_shift_tokens_targets_and_answer_labels() -> None:
    toks = torch.arange(10, 20)
    conv = Conversation(toks, prompt_len=4, features=torch.arange(10.0)[:, None].repeat(1, 3))
    r = step_rows([conv], k=2, width=9)
    assert r.tokens[0, :7].tolist() == toks[3:].tolist()  # row i reads token i + 3
    assert r.target_features[0, 0, 0] == 3.0  # and predicts the feature at i + 3
    # label token i + 4, only where it is an answer token (position >= 4) and exists
    assert r.labels[0].tolist() == [14, 15, 16, 17, 18, 19, -100, -100, -100]


@torch.no_grad()
def test_unrolled_steps_equal_incremental_tree_drafting() -> None:
    layer, cfg = _tiny_layer()
    t, steps, h = 9, 3, cfg.hidden_size
    rope = RopeTables(cfg, 64)
    feats = torch.randn(1, t, h)
    emb = torch.randn(1, t + steps + 1, h)  # embeddings of tokens 0..t+steps
    unrolled = list(unrolled_features(layer, feats, lambda k: emb[:, k + 1:k + 1 + t], rope, steps))

    def run(x, e, positions, mask, past):
        cos, sin = rope(torch.tensor(positions)[None])
        return layer(x, e, cos, sin, mask[None], past)

    for i in (0, 4, t - 1):  # the context ends at position i, as in EagleDrafter._catch_up
        n = i + 1
        out, k_ctx, v_ctx = run(feats[:, :n], emb[:, 1:n + 1], list(range(n)),
                                torch.ones(n, n, dtype=torch.bool).tril(), None)
        assert torch.allclose(out[0, -1], unrolled[0][0, i], atol=1e-5)
        feat, ks, vs = out[:, -1:], [k_ctx], [v_ctx]
        for depth in range(1, steps):  # a chain of the tree: each node sees the context and its ancestors
            mask = torch.ones(1, n + depth, dtype=torch.bool)
            feat, k, v = run(feat, emb[:, i + depth + 1:i + depth + 2], [i + depth], mask,
                             (torch.cat(ks, 2), torch.cat(vs, 2)))
            ks.append(k)
            vs.append(v)
            assert torch.allclose(feat[0, 0], unrolled[depth][0, i], atol=1e-5), (i, depth)
