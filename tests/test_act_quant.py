"""Activation quantization: the formats' grids (property tests), SmoothQuant's identity, the dense pass's input
transform, the lab on the tiny model, and on the real model that SmoothQuant helps W8A8 per-tensor and FP4 is
worse than FP8."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from engine.act_quant.formats import (FORMATS, FP4_VALUES, FP8_MAX, fake_fp4, fake_quant, mxfp4_scales,
                                      nvfp4_scales, round_e2m1)
from engine.act_quant.lab import (ALPHAS, EVAL_CHAT, VARIANTS, ActLabSettings, chat_only, channel_max, dense_greedy,
                                  prepare, run_lab, smoothing)
from engine.act_quant.smoothquant import smooth, smooth_scales
from engine.weight_quant.dense import LINEAR_INPUTS, greedy_answer, sequence_logits, weight_key
from engine.weight_quant.lab import (activation_profile, build_eval_set, calibration_windows, fp32_state,
                                     reference_texts, score)

FP4 = torch.tensor(FP4_VALUES)
# Tensors of 2-4 rows and 64 columns (divisible by both FP4 blocks), values spanning several orders of magnitude.
values = st.floats(-1e3, 1e3, allow_nan=False, width=32).map(lambda v: v if abs(v) > 1e-3 else 0.0)
matrices = st.integers(2, 4).flatmap(lambda r: arrays(np.float32, (r, 64), elements=values)).map(torch.from_numpy)


def _on_fp4_grid(y: torch.Tensor) -> bool:
    return bool(torch.isclose(y.abs()[..., None], FP4, rtol=1e-5, atol=1e-6).any(-1).all())


@settings(max_examples=60, deadline=None)
@given(matrices, st.sampled_from(["tensor", "row"]))
def test_int8_values_are_integers_times_the_scale_within_half_a_step(x: torch.Tensor, gran: str) -> None:
    q = fake_quant(x, "int8", gran)
    amax = x.abs().amax() if gran == "tensor" else x.abs().amax(-1, keepdim=True)
    s = amax.clamp(min=1e-12) / 127
    codes = q / s
    assert torch.allclose(codes, codes.round(), atol=1e-3) and codes.abs().max() <= 127 + 1e-3
    assert ((q - x).abs() <= s / 2 * (1 + 1e-5) + 1e-7).all()
    assert torch.allclose(fake_quant(q, "int8", gran), q, rtol=1e-5, atol=1e-6)  # idempotent


@settings(max_examples=60, deadline=None)
@given(matrices, st.sampled_from(["tensor", "row"]))
def test_fp8_values_are_e4m3_numbers_times_the_scale(x: torch.Tensor, gran: str) -> None:
    q = fake_quant(x, "fp8", gran)
    amax = x.abs().amax() if gran == "tensor" else x.abs().amax(-1, keepdim=True)
    s = amax.clamp(min=1e-12) / FP8_MAX
    y = q / s
    assert torch.allclose(y.to(torch.float8_e4m3fn).float(), y, rtol=1e-5) and y.abs().max() <= FP8_MAX * (1 + 1e-5)
    # Half a step of E4M3: 2^-4 relative for normal numbers, half of 2^-9 below the smallest normal (2^-6).
    bound = torch.maximum(x.abs() / s * 2 ** -4, torch.full_like(x, 2 ** -10)) * s
    assert ((q - x).abs() <= bound * (1 + 1e-4) + 1e-7).all()
    assert torch.allclose(fake_quant(q, "fp8", gran), q, rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(matrices, st.sampled_from(["nvfp4", "mxfp4"]))
def test_fp4_values_lie_on_e2m1_times_the_block_scale(x: torch.Tensor, fmt: str) -> None:
    q = fake_quant(x, fmt)
    block = FORMATS[fmt].block
    scales = nvfp4_scales(x) if fmt == "nvfp4" else mxfp4_scales(x)
    y = q.reshape(*x.shape[:-1], -1, block) / scales
    assert _on_fp4_grid(y)
    xs = x.reshape(*x.shape[:-1], -1, block) / scales
    # Half the gap to the neighbouring E2M1 value (0.25 up to 2, 0.5 up to 4, 1 up to 6); above 6 the value
    # saturates, and the scale keeps every block's largest value below 6 · (1 + 2^-4) (NVFP4: an FP8 scale rounded
    # down at most that much) or 8 (MXFP4: 2^(floor(log2 amax) - 2) leaves amax / scale in [4, 8)).
    half = torch.where(xs.abs() <= 2, 0.25, torch.where(xs.abs() <= 4, 0.5, 1.0))
    bound = torch.where(xs.abs() > 6, xs.abs() - 6, half)
    assert ((y - xs).abs() <= bound + 1e-4).all()
    assert xs.abs().max() < (6 * (1 + 2 ** -4) + 1e-4 if fmt == "nvfp4" else 8)
    if fmt == "mxfp4":
        assert torch.allclose(torch.log2(scales), torch.log2(scales).round())  # powers of two
    assert torch.allclose(fake_quant(q, fmt), q, rtol=1e-5, atol=1e-6)


def test_formats_known_values_and_bits() -> None:
    assert round_e2m1(torch.tensor([0.2, 0.3, 1.2, 2.6, 5.1, 7.0, -4.9])).tolist() == [0.0, 0.5, 1.0, 3.0, 6.0, 6.0, -4.0]
    x = torch.tensor([[448.0, 1.0, -0.5, 100.0]])
    assert fake_quant(x, "fp8", "tensor").tolist() == [[448.0, 1.0, -0.5, 96.0]]  # 100 -> 96 (3 mantissa bits)
    assert fake_quant(x, "int8", "tensor", amax=torch.tensor([[127.0]])).tolist() == [[127.0, 1.0, -0.0, 100.0]]
    assert FORMATS["nvfp4"].bits == 4.5 and FORMATS["mxfp4"].bits == 4.25 and FORMATS["fp8"].bits == 8
    with pytest.raises(ValueError):
        fake_fp4(torch.ones(2, 24), "mxfp4")  # 32 does not divide 24
    assert torch.equal(fake_quant(torch.zeros(2, 32), "nvfp4"), torch.zeros(2, 32))
    # NVFP4 with a static (calibrated) range: a block beyond it saturates its FP8 scale at 448 and clips there.
    y = torch.linspace(-3, 3, 32).reshape(1, 32)
    assert torch.equal(fake_quant(y, "nvfp4", amax=y.abs().amax()), fake_quant(y, "nvfp4"))
    clipped = fake_quant(y * 10, "nvfp4", amax=torch.tensor(3.0))
    assert clipped.abs().max() <= 3.0 * (1 + 1e-6) and clipped.abs().max() >= 3.0 * (1 - 2 ** -3)


@settings(max_examples=30, deadline=None)
@given(matrices, st.floats(0.0, 1.0))
def test_smoothing_leaves_the_product_unchanged(x: torch.Tensor, alpha: float) -> None:
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    s = smooth_scales(x.abs().amax(0), w, alpha)
    xs, ws = smooth(x.double(), w.double(), s.double())
    assert torch.allclose(xs @ ws.T, x.double() @ w.double().T, rtol=1e-9, atol=1e-9)


def test_smoothing_flattens_the_outlier_channels() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g)
    x[:, 5] *= 300  # one channel hundreds of times larger, on every token
    w = torch.randn(32, 64, generator=g) * 0.05
    s = smooth_scales(x.abs().amax(0), w, 0.5)
    ratio = lambda m: float(m.max() / m.median())  # noqa: E731
    # alpha = 0.5: each channel's max becomes sqrt(max|X_j| · max|W_j|), so the ratio is about its square root.
    before, after = ratio(x.abs().amax(0)), ratio((x / s).abs().amax(0))
    assert before > 100 and after < 3 * before ** 0.5
    # W8A8 per-tensor error drops a lot once the outlier moved into the weights.
    ref = x @ w.T
    plain = fake_quant(x, "int8") @ fake_quant(w, "int8", "row").T
    xs, ws = smooth(x, w, s)
    smoothed = fake_quant(xs, "int8") @ fake_quant(ws, "int8", "row").T
    assert (smoothed - ref).norm() < 0.5 * (plain - ref).norm()
    # alpha = 1 moves all of it into the weights: the smoothed activation's channels all peak at max|W_j|.
    s1 = smooth_scales(x.abs().amax(0), w, 1.0)
    assert torch.allclose((x / s1).abs().amax(0), torch.ones(64), rtol=1e-5)
    with pytest.raises(ValueError):
        smooth_scales(x.abs().amax(0), w, 1.5)


def test_the_dense_pass_transform(tiny_weights) -> None:  # noqa: ANN001
    cfg, sd = tiny_weights.config, fp32_state(tiny_weights)
    ids = list(range(100, 120))
    seen = []
    identity = lambda layer, inp, x: (seen.append((layer, inp)), x)[1]  # noqa: E731
    assert torch.equal(sequence_logits(cfg, sd, ids, identity), sequence_logits(cfg, sd, ids))
    assert seen == [(i, n) for i in range(cfg.num_layers) for n in ("qkv", "o", "gate_up", "down")]
    zero = sequence_logits(cfg, sd, ids, lambda layer, inp, x: x * 0 if inp == "down" else x)
    assert not torch.allclose(zero, sequence_logits(cfg, sd, ids))


def test_smoothing_in_the_dense_pass_changes_nothing_but_rounding(tiny_weights) -> None:  # noqa: ANN001
    """Weights times s and inputs divided by s, with no rounding: the full model's logits (X Wᵀ unchanged)."""
    texts = reference_texts(tiny_weights)
    windows = calibration_windows(tiny_weights, "chat", 128, texts)
    amax = channel_max(tiny_weights, windows)
    mean = activation_profile(tiny_weights, windows)
    assert amax.keys() == mean.keys() and all((amax[k] >= mean[k] - 1e-6).all() for k in amax)
    scales = smoothing(tiny_weights, amax, 0.5)
    full = fp32_state(tiny_weights)
    sd = dict(full)
    for (layer, inp), s in scales.items():
        for n in LINEAR_INPUTS[inp]:
            sd[weight_key(layer, n)] = full[weight_key(layer, n)] * s
    ids = list(range(100, 120))
    out = sequence_logits(tiny_weights.config, sd, ids, lambda layer, inp, x: x / scales[(layer, inp)])
    assert torch.allclose(out, sequence_logits(tiny_weights.config, full, ids), rtol=1e-4, atol=1e-3)


@pytest.fixture(scope="module")
def tiny_run(tiny_weights):  # noqa: ANN001, ANN201
    return run_lab(tiny_weights, ActLabSettings(variants=tuple(VARIANTS), calibration_tokens=128, max_new_tokens=5,
                                                sweep="nvfp4"))


def test_the_lab_runs_from_bf16_weights(tiny_weights) -> None:  # noqa: ANN001
    """A GPU server holds the weights in bf16 (on the GPU): the lab runs in fp32 on the CPU all the same. (On an
    H200 the page failed with 'expected mat1 and mat2 to have the same dtype': the full model's answer read
    the server's bf16 weights directly.)"""
    from engine.weights import LoadedWeights
    half = LoadedWeights(tiny_weights.config, {k: v.to(torch.bfloat16) for k, v in tiny_weights.state_dict.items()},
                         "tiny, bf16", tiny_weights.tokenizer)
    r = run_lab(half, ActLabSettings(variants=("int8-tensor", "nvfp4-sq"), calibration_tokens=128,
                                     max_new_tokens=3, sweep="int8-tensor"))
    assert len(r.variants) == 2 and r.sweep and r.reference.scores["chat"].kl == pytest.approx(0, abs=1e-9)


def test_the_lab_on_the_tiny_model(tiny_run, tiny_weights) -> None:  # noqa: ANN001
    r = tiny_run
    assert [v.key for v in r.variants] == list(VARIANTS)
    assert r.reference.scores["chat"].kl == pytest.approx(0, abs=1e-9) and r.reference.first_difference is None
    assert all(v.scores["chat"].kl > 0 and 0 <= v.scores["chat"].top1 <= 1 for v in r.variants)
    assert {v.scores["chat"].tokens for v in r.outcomes} == {r.reference.scores["chat"].tokens}
    assert all(len(v.answer_ids) <= 5 for v in r.outcomes)
    by = {v.key: v for v in r.variants}
    # Four bits are much further from the full model than eight, per token or per tensor.
    assert by["nvfp4"].scores["chat"].kl > 5 * by["int8-token"].scores["chat"].kl
    assert by["w8"].bits_per_activation == 16 and by["nvfp4"].bits_per_weight == 4.5
    assert [p.alpha for p in r.sweep] == list(ALPHAS) and r.sweep_baseline is not None
    assert r.best_alpha in r.sweep
    assert len(r.outliers) == 2 * 4 and all(o.max_ratio >= 1 for o in r.outliers)
    assert r.calibration_tokens == 128 and len(r.reference.scores) == 2
    texts = reference_texts(tiny_weights)
    chat = chat_only(build_eval_set(tiny_weights, [(list(q), list(a)) for q, a in texts.chat_eval[:EVAL_CHAT]]))
    assert {t.domain for t in chat.texts} == {"chat"}


def test_the_answer_with_a_kv_cache_is_the_answer_rerunning_the_sequence(tiny_weights) -> None:  # noqa: ANN001
    """Every variant quantizes each token's activations without looking at the others' (static per-tensor scales,
    NVFP4's included; per-token scales; block scales along the features): one row quantized alone is that row
    quantized within the sequence, exactly, so its answer through a KV cache is the answer rerunning the whole
    sequence each step. That answer check runs in fp64: in fp32 the cached step and the rerun sum in different
    orders, and a code that rounding tips can part the answers where two tokens are near a tie (int8-sq did on
    one CPU: logits 6.098 vs 6.077)."""
    texts = reference_texts(tiny_weights)
    act_max = channel_max(tiny_weights, calibration_windows(tiny_weights, "chat", 128, texts))
    scales = smoothing(tiny_weights, act_max, 0.5)
    prompt = tiny_weights.tokenizer.chat_prompt_ids("Why is the sky blue?")
    cfg, eos = tiny_weights.config, set(tiny_weights.tokenizer.eos_token_ids)
    assert dense_greedy(tiny_weights, prompt, 10) == dense_greedy(tiny_weights, prompt, 10, whole_sequence=True)
    rows = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 3
    rows[2, 5] = 40.0  # an outlier channel in one token: a per-tensor scale from the tensor itself would move
    for variant in VARIANTS.values():
        run = prepare(tiny_weights, variant, act_max, scales)
        if run.act is not None:
            together = run.act(0, "qkv", rows)
            assert all(torch.equal(run.act(0, "qkv", rows[i:i + 1]), together[i:i + 1]) for i in range(6)), variant.key
        sd64 = {k: v.double() for k, v in run.weights.state_dict.items()}
        cached = greedy_answer(cfg, sd64, prompt, 10, eos, run.act)
        assert len(cached) == 10 and cached == greedy_answer(cfg, sd64, prompt, 10, eos, run.act,
                                                             whole_sequence=True), variant.key
    # Why NVFP4's per-tensor scale is calibrated, not taken from the tensor: with x's own range one token's row
    # quantized alone is not that row quantized within the sequence; with the static range it is.
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(0))
    x[3] *= 40
    assert not torch.equal(fake_quant(x[:1], "nvfp4"), fake_quant(x, "nvfp4")[:1])
    static = x.abs().amax().reshape(1, 1)
    assert torch.equal(fake_quant(x[:1], "nvfp4", amax=static), fake_quant(x, "nvfp4", amax=static)[:1])
    assert torch.equal(fake_quant(x[:1], "mxfp4"), fake_quant(x, "mxfp4")[:1])


@pytest.mark.parametrize("bad, message", [
    (dict(variants=()), "pick at least one"), (dict(variants=("fp16",)), "unknown format"),
    (dict(alpha=1.5), "α"), (dict(sweep="int8-sq"), "sweep"), (dict(calibration_tokens=100), "multiple"),
    (dict(prompt="  "), "empty"), (dict(max_new_tokens=0), "tokens to generate")])
def test_settings_are_checked(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActLabSettings(**bad).check()


def test_on_the_real_model_smoothquant_helps_and_fp4_is_worse_than_fp8(real_weights, one_torch_thread) -> None:  # noqa: ANN001
    texts = reference_texts(real_weights)
    eval_set = chat_only(build_eval_set(real_weights, [(list(q), list(a)) for q, a in texts.chat_eval[:2]]))
    windows = calibration_windows(real_weights, "chat", 256, texts)
    amax = channel_max(real_weights, windows)
    scales = smoothing(real_weights, amax, 0.5)
    kl = {}
    for key in ("int8-tensor", "int8-sq", "fp8-tensor", "nvfp4", "mxfp4"):
        run = prepare(real_weights, VARIANTS[key], amax, scales)
        kl[key] = score(run.weights, eval_set, run.act)["chat"].kl
    assert kl["int8-sq"] < kl["int8-tensor"], kl
    assert kl["nvfp4"] > kl["fp8-tensor"] and kl["mxfp4"] > kl["fp8-tensor"], kl
