"""The latent KV cache (MLA's idea retrofitted onto the live model): the factorisation is exact at full rank and
optimal in its own norm below it, MQA written as a latent is mean-pooling, the latent decoder really holds only
the latent and writes what the dense model with the factored weights writes, and on the real model the
activation-aware latent beats plain SVD and beats MQA at the same cache size. Plus the KV page's arithmetic."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv_latent.decode import LatentCacheModel, latent_greedy
from engine.kv_latent.factor import (decompose, equivalent_state, identity_layer, input_covariance, kv_weight,
                                     mean_pooled_layer)
from engine.kv_latent.lab import RANKS, LatentSettings, full_rank, run_latent_lab
from engine.weight_quant.dense import sequence_logits, weight_key
from engine.weight_quant.lab import fp32_state, greedy_answers

from app.analysis.kv_math import PUBLISHED_CACHES, attention_variants, mla_latent_dims, variant_bytes_per_token


def _inputs(seed: int, n: int = 256, hidden: int = 48) -> torch.Tensor:
    """Activations with a few channels far larger than the rest, as a real model's are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g)
    x[:, :3] *= 30
    return x


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), rank=st.integers(1, 31))
def test_truncation_is_exact_at_full_rank_and_each_svd_wins_its_own_norm(seed: int, rank: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.randn(32, 48, generator=g)  # [2 x kv rows, hidden], as W_kv
    x = _inputs(seed)
    plain, aware = decompose(w), decompose(w, input_covariance(x))
    for svd in (plain, aware):
        f = svd.truncate(32)
        assert torch.allclose(torch.cat([f.up_k, f.up_v]) @ f.down, w, atol=1e-4)
    p, a = plain.truncate(rank), aware.truncate(rank)
    wp, wa = torch.cat([p.up_k, p.up_v]) @ p.down, torch.cat([a.up_k, a.up_v]) @ a.down
    # Plain SVD is the closest rank-r matrix to W; activation-aware the closest in what it does to the inputs.
    assert (wp - w).norm() <= (wa - w).norm() * (1 + 1e-4)
    assert ((wa - w) @ x.T).norm() <= ((wp - w) @ x.T).norm() * (1 + 1e-4)
    assert p.rank == a.rank == rank and 0.0 < float(plain.cumulative_energy[rank - 1]) <= 1.0


def test_rank_out_of_range_is_refused() -> None:
    svd = decompose(torch.randn(8, 12))
    with pytest.raises(ValueError, match="rank must be 1 to 8"):
        svd.truncate(9)


def test_mqa_as_a_latent_is_mean_pooling(tiny_weights) -> None:  # noqa: ANN001
    cfg, sd = tiny_weights.config, tiny_weights.state_dict
    layer = mean_pooled_layer(cfg, sd, 1)
    assert layer.rank == 2 * cfg.head_dim
    pooled = equivalent_state(cfg, sd, [mean_pooled_layer(cfg, sd, i) for i in range(cfg.num_layers)])
    k = sd[weight_key(1, "self_attn.k_proj")].reshape(cfg.num_kv_heads, cfg.head_dim, -1)
    got = pooled[weight_key(1, "self_attn.k_proj")].reshape(cfg.num_kv_heads, cfg.head_dim, -1)
    for h in range(cfg.num_kv_heads):
        assert torch.allclose(got[h], k.mean(0), atol=1e-6)


def test_latent_decoder_holds_only_the_latent(tiny_weights) -> None:  # noqa: ANN001
    cfg, sd = tiny_weights.config, tiny_weights.state_dict
    svds = [decompose(kv_weight(cfg, sd, i)) for i in range(cfg.num_layers)]
    layers = [s.truncate(5) for s in svds]
    model = LatentCacheModel(cfg, sd, layers, 32)
    model.forward([5, 6, 7, 8])
    model.forward([9])
    assert [tuple(c.shape) for c in model.cache] == [(5, 5)] * cfg.num_layers
    assert model.cache_bytes == cfg.num_layers * 5 * 5 * 4
    with pytest.raises(ValueError, match="exceed"):
        model.forward(list(range(40)))


def test_absorbing_up_v_is_the_same_attention_for_less(tiny_weights) -> None:  # noqa: ANN001
    """Σ p_t (up_v c_t) = up_v (Σ p_t c_t): averaging the latents and applying up_v after gives the same logits
    as rebuilding V, and the rebuild FLOPs halve (only K is rebuilt)."""
    cfg, sd = tiny_weights.config, tiny_weights.state_dict
    x = torch.randn(128, cfg.hidden_size)
    layers = [decompose(kv_weight(cfg, sd, i), input_covariance(x)).truncate(24) for i in range(cfg.num_layers)]
    models = [LatentCacheModel(cfg, sd, layers, 16, absorb_v=a) for a in (True, False)]
    for ids in ([3, 14, 15, 92, 65], [35], [89]):
        absorbed, rebuilt = (m.forward(ids) for m in models)
        assert torch.allclose(absorbed, rebuilt, rtol=1e-4, atol=1e-4)
    assert 2 * models[0].rebuild_flops == models[1].rebuild_flops > 0


def test_full_rank_latent_decoder_is_the_engine(real_weights) -> None:  # noqa: ANN001
    """The 'latent' that is K and V themselves: the same greedy answer as the paged engine, and the cache the
    engine's size (384 numbers a token and layer)."""
    cfg, sd = real_weights.config, fp32_state(real_weights)
    prompt = real_weights.tokenizer.chat_prompt_ids("Name three colours of the rainbow.")
    run = latent_greedy(cfg, sd, [identity_layer(cfg, sd, i) for i in range(cfg.num_layers)], prompt, 16,
                        cfg.eos_token_ids)
    assert list(run.tokens) == greedy_answers(real_weights, [prompt], 16)[0]
    assert run.cache_numbers_per_token == cfg.num_layers * full_rank(cfg) == cfg.kv_bytes_per_token(1)
    assert run.rebuild_flops == 0  # its "up" only copies K and V


def test_low_rank_latent_decoder_computes_what_the_factored_dense_model_computes(real_weights) -> None:  # noqa: ANN001
    """Fed the same tokens, the decoder with a rank-192 latent cache gives, at every step, the logits the dense model
    with W_k, W_v = up_k·down, up_v·down gives for the whole sequence at once. Compared in fp64: the two are the
    same arithmetic in different orders (up_k·(down·x) against (up_k·down)·x, up_v after the average or before),
    and in fp32 their rounding, carried through 30 layers, differs from CPU to CPU: 2e-4 at most on one machine,
    past a 1e-3 tolerance on a CI machine. In fp64 the gap is ~4e-13, so 1e-8 leaves no room for a real error."""
    cfg, sd = real_weights.config, fp32_state(real_weights)
    prompt = real_weights.tokenizer.chat_prompt_ids("What is a prime number?")
    x = torch.randn(512, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    layers = [decompose(kv_weight(cfg, sd, i), input_covariance(x)).truncate(192) for i in range(cfg.num_layers)]
    run = latent_greedy(cfg, sd, layers, prompt, 8, cfg.eos_token_ids)
    seq = prompt + list(run.tokens)
    sd64 = {k: v.double() for k, v in sd.items()}
    layers64 = [dataclasses.replace(f, down=f.down.double(), up_k=f.up_k.double(), up_v=f.up_v.double())
                for f in layers]
    dense = sequence_logits(cfg, equivalent_state(cfg, sd64, layers64), seq)
    model = LatentCacheModel(cfg, sd64, layers64, len(seq))
    steps = [model.forward(prompt)] + [model.forward([t]) for t in run.tokens]
    for n, logits in enumerate(steps):
        assert logits.dtype == torch.float64
        assert torch.allclose(logits, dense[len(prompt) - 1 + n], rtol=1e-8, atol=1e-8)
    assert model.cache_bytes == cfg.num_layers * 192 * len(seq) * 8
    fed = len(seq) - (len(run.tokens) == 8)  # the last token is not run when the answer hits the limit
    assert run.cache_bytes == cfg.num_layers * 192 * fed * 4 and run.rebuild_flops > 0


def test_on_the_real_model_aware_beats_plain_and_a_latent_beats_mqa(real_weights) -> None:  # noqa: ANN001
    seen: list[float] = []
    r = run_latent_lab(real_weights, LatentSettings(max_new_tokens=8, answer_rank=128), lambda _m, f: seen.append(f),
                       ranks=(256, 128))
    assert seen == sorted(seen) and seen[-1] == 1.0
    full = r.point("full", full_rank(real_weights.config))
    assert full is not None and full.scores["chat"].kl == 0.0 and full.scores["chat"].top1 == 1.0
    for rank in (256, 128):
        plain, aware = r.point("plain", rank), r.point("aware", rank)
        for d in ("chat", "prose"):
            assert aware.scores[d].kl < plain.scores[d].kl
        assert aware.kept_energy > plain.kept_energy
    assert r.point("aware", 256).scores["chat"].kl < r.point("aware", 128).scores["chat"].kl
    mqa = r.point("mqa", 128)
    assert r.point("aware", 128).scores["chat"].kl < mqa.scores["chat"].kl
    trained, chosen, pooled = r.answers
    assert trained.differs_at is None and chosen.run.cache_numbers_per_token == 128 * r.layers
    assert pooled.run.cache_numbers_per_token == 128 * r.layers
    assert r.spectra["aware"].shape == (r.layers, full_rank(real_weights.config))


@pytest.mark.parametrize("change, message", [
    (dict(prompt="  "), "prompt is empty"), (dict(prompt="x" * 5000), "at most"),
    (dict(max_new_tokens=0), "tokens to generate"), (dict(answer_rank=400), "rank must be"),
    (dict(answer_method="qr"), "unknown factorisation")])
def test_settings_refuse_bad_input(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(LatentSettings(), **change).check()


def test_ranks_are_below_the_full_cache() -> None:
    assert all(0 < r < 384 for r in RANKS) and 128 in RANKS


def test_kv_arithmetic_has_mla(random_weights) -> None:  # noqa: ANN001
    cfg = random_weights.config
    variants = {v.name: v for v in attention_variants(cfg)}
    assert mla_latent_dims(cfg) == (256, 32) and variants["MLA"].numbers_per_layer == 288
    assert variant_bytes_per_token(cfg, variants["GQA"], 2) == cfg.kv_bytes_per_token(2)
    assert variants["MLA"].kv_heads is None and variants["MLA"].short == "latent of 288"
    v3 = next(m for m in PUBLISHED_CACHES if m.kind == "MLA")
    assert v3.bytes_per_token(2) == 61 * 576 * 2 == 70_272


def test_the_lab_runs_from_bf16_weights(tiny_weights) -> None:  # noqa: ANN001
    """A GPU server holds the weights in bf16 (on the GPU): the lab factors and scores in fp32 on the CPU all the
    same (the activation lab once failed there by reading the server's bf16 weights)."""
    from engine.weights import LoadedWeights
    half = LoadedWeights(tiny_weights.config, {k: v.to(torch.bfloat16) for k, v in tiny_weights.state_dict.items()},
                         "tiny, bf16", tiny_weights.tokenizer)
    r = run_latent_lab(half, LatentSettings(max_new_tokens=3, answer_rank=16), ranks=(16,))
    assert {(p.kind, p.rank) for p in r.points} == {("full", 64), ("plain", 16), ("aware", 16), ("plain", 32),
                                                    ("aware", 32), ("mqa", 32)}
    assert r.point("full", 64).scores["chat"].kl == pytest.approx(0, abs=1e-9)
    assert r.answers[0].differs_at is None and len(r.answers[1].run.tokens) <= 3
