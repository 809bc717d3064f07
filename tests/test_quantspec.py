"""Self-speculation with a quantized KV cache (QuantSpec): lossless (the target's own greedy text, the paged
engine's too) in every format and draft length, the caches roll back to the committed tokens, fewer bits keep
fewer drafts, and the cost model's arithmetic."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.kv_compression.lab import KVLab, Variant, _RowCache
from engine.speculative.quantspec import (SELF_SPEC_FORMATS, SelfSpecRound, SelfSpecRun, check_self_spec,
                                          int4_weights, plain_greedy, run_self_spec_lab, self_speculate)
from engine.weight_quant.lab import greedy_answers

from app.analysis.kv_math import weights_bytes
from app.analysis.quantspec import cost_ratio, draft_step, modeled_speedup, runs_frame, speedup_frame


@pytest.fixture(scope="module")
def real_lab(real_weights) -> KVLab:  # noqa: ANN001
    return KVLab(real_weights)


@pytest.mark.parametrize("kv_format, gamma", [("int4", 3), ("int2", 5), ("fp8", 1)])
def test_self_speculation_writes_the_engines_greedy_text(real_weights, real_lab, kv_format: str,  # noqa: ANN001
                                                         gamma: int) -> None:
    prompt = real_weights.tokenizer.chat_prompt_ids("Give me three facts about honey bees.")
    run = self_speculate(real_lab, prompt, kv_format, gamma, 40)
    assert list(run.tokens) == greedy_answers(real_weights, [prompt], 40)[0]
    assert list(run.tokens) == list(plain_greedy(real_lab, prompt, 40)[0])
    assert all(len(r.drafted) <= gamma and 0 <= r.accepted <= len(r.drafted) for r in run.rounds)
    assert all(r.committed[:r.accepted] == r.drafted[:r.accepted] for r in run.rounds)
    assert 1.0 <= run.tokens_per_pass <= gamma + 1
    assert run.draft_bytes_per_token < run.target_bytes_per_token
    # The rounds add up to the answer: no bonus token past the 40-token budget or past an end of turn counts
    # toward tokens per pass (a last all-accepted round made FP8 read 4.00 where 3.75 was written).
    written = [run.tokens[0], *(t for r in run.rounds for t in r.committed)]
    eos = set(real_weights.config.eos_token_ids)
    assert written[:len(run.tokens)] == list(run.tokens) and len(written) <= 40
    assert len(written) == len(run.tokens) or (len(written) == len(run.tokens) + 1 and written[-1] in eos)


def test_fewer_bits_keep_fewer_drafts(real_weights, real_lab) -> None:  # noqa: ANN001
    prompt = real_weights.tokenizer.chat_prompt_ids("Explain in two sentences why the sky is blue.")
    seen: list[float] = []
    r = run_self_spec_lab(real_lab, prompt, 4, 32, draft_lab=KVLab(int4_weights(real_weights)),
                          progress=lambda _m, f: seen.append(f))
    assert [(x.kv_format, x.draft_weight_bits) for x in r.runs] == [(f, b) for b in (16, 4) for f in SELF_SPEC_FORMATS]
    assert seen == sorted(seen) and r.weight_bits == (16, 4)
    assert all(x.tokens == r.plain for x in r.runs)  # INT4 weights in the draft change nothing in the text
    by = {x.kv_format: x for x in r.runs if x.draft_weight_bits == 16}
    assert by["int8"].acceptance > by["int2"].acceptance and by["int4"].acceptance > by["int2"].acceptance
    assert by["int8"].tokens_per_pass > 2.0 > by["int2"].tokens_per_pass
    assert r.run("int8", 4).acceptance < by["int8"].acceptance  # rounded weights guess worse
    frame = runs_frame(r)
    assert list(frame["same text"]) == ["yes"] * 8 and set(frame["draft's weights"]) == {"the target's", "INT4"}


def test_truncate_keeps_the_first_tokens() -> None:
    cache = _RowCache(Variant("int4"), 2, torch.float32, torch.device("cpu"))
    k = torch.randn(2, 7, 64)
    for layer in range(2):
        cache.append(layer, k, k * 2, torch.arange(7))
    cache.truncate(4)
    assert cache.tokens == 4 and cache.positions[1].tolist() == [[0, 1, 2, 3]] * 2
    full = _RowCache(Variant("int4"), 1, torch.float32, torch.device("cpu"))
    full.append(0, k[:, :4], k[:, :4] * 2, torch.arange(4))
    assert torch.equal(cache.k[0].read(), full.k[0].read())


@pytest.mark.parametrize("fmt, gamma, message", [("int2-kivi", 4, "must be one of"), ("bf16", 4, "must be one of"),
                                                 ("int4", 0, "γ must be 1 to"), ("int4", 9, "γ must be 1 to")])
def test_bad_settings_are_refused(fmt: str, gamma: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_self_spec(fmt, gamma)


def _run(accepted_per_round: list[int], gamma: int, draft_bytes: float) -> SelfSpecRun:
    rounds = tuple(SelfSpecRound(tuple(range(gamma)), a, tuple(range(a + 1))) for a in accepted_per_round)
    return SelfSpecRun("int4", gamma, 10, tuple(range(sum(a + 1 for a in accepted_per_round))), rounds, draft_bytes,
                       46080.0, 1.0)


def test_the_cost_model(random_weights) -> None:  # noqa: ANN001
    cfg = random_weights.config
    full = _run([4, 4, 4], 4, cfg.kv_bytes_per_token(2))  # a draft as expensive as the target
    assert cost_ratio(cfg, 8192, full) == pytest.approx(1.0)
    assert modeled_speedup(cfg, 8192, full) == pytest.approx(15 / 15)  # 5 tokens a round for 4 c + 1 = 5 steps
    cheap = dataclasses.replace(full, draft_bytes_per_token=cfg.kv_bytes_per_token(2) / 4)
    long, short = cost_ratio(cfg, 131072, cheap), cost_ratio(cfg, 1024, cheap)
    assert 0.25 < long < short < 1.0  # the weights dominate short contexts
    w = weights_bytes(cfg, 2)
    assert short == pytest.approx((w + 1024 * cfg.kv_bytes_per_token(2) / 4) / (w + 1024 * cfg.kv_bytes_per_token(2)))
    assert modeled_speedup(cfg, 131072, cheap) == pytest.approx(15 / (3 * (4 * long + 1)))
    cheap_w4 = dataclasses.replace(cheap, draft_weight_bits=4)
    assert modeled_speedup(cfg, 1024, cheap_w4) > modeled_speedup(cfg, 1024, cheap)
    emb = cfg.vocab_size * cfg.hidden_size * 2  # the embedding (also the LM head) stays 16-bit in the draft
    assert draft_step(cfg, 0, cheap_w4).weights == pytest.approx(emb + (w - emb) * 5 / 16)  # 4 bits + group scales
    none_kept = _run([0, 0], 4, cfg.kv_bytes_per_token(2) / 4)
    assert modeled_speedup(cfg, 131072, none_kept) < 1.0  # drafts that are always wrong only cost


def test_speedup_frame_has_every_format_context_and_weight_width(random_weights) -> None:  # noqa: ANN001
    from engine.speculative.quantspec import SelfSpecLabResult
    runs = tuple(dataclasses.replace(_run([2, 3], 4, 7200.0), kv_format=f, draft_weight_bits=b)
                 for b in (16, 4) for f in SELF_SPEC_FORMATS)
    frame = speedup_frame(random_weights.config, SelfSpecLabResult(10, 4, runs[0].tokens, 0.1, runs))
    assert len(frame) == 4 * 6 * 2 and set(frame["weights"]) == {16, 4}
