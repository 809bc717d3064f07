"""KV cache compression (engine/kv_compression): formats, stores, eviction policies and the lab on the real model.

- Formats: every encode/decode round trip stays within its format's error bound (INT8 half a scale,
  INT4/INT2 half a scale plus the fp16 rounding of scale and zero point, FP8 e4m3's relative step);
  float formats are exact casts; INT4/INT2 packing round-trips exactly; `Encoded.nbytes` is the real
  tensors' bytes and equals `KVFormat.bytes_per_token`; constant rows never give NaN.
- ChannelGroupStore (KIVI keys): whole groups of `token_group` tokens quantized per channel, the rest
  in fp16, read back in order; it refuses to drop single tokens.
- Policies: exactly `budget` tokens per head once over budget (window: the newest; sinks: the first
  `sinks` and the newest; H2O: the newest share and the highest-scored older ones); nothing under budget;
  bad policies refused with one sentence.
- The lab on SmolLM2: the reference is LLMEngine's greedy text; BF16 is (nearly) the reference; the
  cache's real bytes are the format's bytes per token; eviction holds exactly the budget, with sinks
  kept; INT2 is worse than INT8; bad input is refused; a second run gives identical results.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv_compression import FORMATS, EvictionPolicy, KVLab, LabResult, Variant, get_format
from engine.kv_compression.formats import (FP8_MAX, SCALE_DTYPE, decode, decode_per_channel, encode,
                                           encode_per_channel, pack, round_trip, unpack)
from engine.kv_compression.lab import MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, MAX_VARIANTS
from engine.kv_compression.policies import MIN_BUDGET
from engine.kv_compression.store import ChannelGroupStore, TokenStore, make_store
from engine.sampling_params import SamplingParams
from engine.weights import LoadedWeights

HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PER_TOKEN = [name for name, f in FORMATS.items() if f.key_axis == "token"]
SCALED_INT = [name for name, f in FORMATS.items() if f.kind == "int" and f.key_axis == "token"]
NEW_TOKENS = 16
BUDGET = 16  # below the prompt's length, so the prompt itself is evicted


def _rows(seed: int, shape: tuple[int, ...], magnitude: float, outliers: bool = False) -> torch.Tensor:
    """Random K/V-like rows: gaussian times `magnitude`, optionally with a few large channels (as keys have)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * magnitude
    if outliers:
        x[..., :: max(1, shape[-1] // 4)] *= 15
    return x


def _fp16_gap(x: torch.Tensor) -> torch.Tensor:
    return (x - x.to(SCALE_DTYPE).float()).abs()


row_shapes = st.tuples(st.integers(1, 3), st.integers(1, 6), st.sampled_from([64, 128]))  # head dims
magnitudes = st.floats(-2.0, 2.0).map(lambda e: 10.0 ** e)  # scales in fp16's normal range


# ---- formats -----------------------------------------------------------------------------------------

@HYP
@given(bits=st.sampled_from([2, 4]), lead=st.lists(st.integers(1, 4), min_size=0, max_size=3),
       bytes_=st.integers(1, 12), data=st.data())
def test_pack_unpack_round_trip_is_exact(bits: int, lead: list[int], bytes_: int, data) -> None:  # noqa: ANN001
    per = 8 // bits
    n = int(np.prod(lead)) * bytes_ * per
    vals = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=n, max_size=n))
    codes = torch.tensor(vals, dtype=torch.uint8).reshape(*lead, bytes_ * per)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*lead, bytes_)  # really 8/bits codes per byte
    assert torch.equal(unpack(packed, bits), codes)


def test_pack_is_identity_for_eight_bits() -> None:
    codes = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    assert torch.equal(pack(codes, 8), codes) and torch.equal(unpack(codes, 8), codes)


@HYP
@given(shape=row_shapes, magnitude=magnitudes, seed=st.integers(0, 2**31 - 1), outliers=st.booleans())
def test_int8_error_is_at_most_half_a_scale(shape, magnitude: float, seed: int, outliers: bool) -> None:  # noqa: ANN001
    fmt = FORMATS["int8"]
    x = _rows(seed, shape, magnitude, outliers)
    enc = encode(x, fmt)
    assert enc.codes.dtype == torch.int8 and enc.codes.abs().max() <= 127
    assert enc.scale.dtype == SCALE_DTYPE and enc.zero is None
    scale = enc.scale.float().repeat_interleave(fmt.group, dim=-1)  # each element's own scale
    err = (decode(enc, fmt, torch.float32) - x).abs()
    assert bool((err <= scale / 2 + 1e-6 * x.abs() + 1e-12).all()), float((err - scale / 2).max())


@pytest.mark.parametrize("name", ["int4", "int2"])
@HYP
@given(shape=row_shapes, magnitude=magnitudes, seed=st.integers(0, 2**31 - 1), outliers=st.booleans(),
       offset=st.floats(-3.0, 3.0))
def test_asymmetric_int_error_is_half_a_scale_plus_fp16_slack(name: str, shape, magnitude: float, seed: int,  # noqa: ANN001
                                                              outliers: bool, offset: float) -> None:
    fmt = FORMATS[name]
    levels = (1 << fmt.bits) - 1
    x = _rows(seed, shape, magnitude, outliers) + offset * magnitude
    enc = encode(x, fmt)
    assert enc.codes.dtype == torch.uint8 and enc.codes.shape[-1] == shape[-1] * fmt.bits // 8
    assert enc.scale.dtype == SCALE_DTYPE and enc.zero.dtype == SCALE_DTYPE
    g = x.reshape(*shape[:-1], shape[-1] // fmt.group, fmt.group)
    lo, hi = g.amin(-1), g.amax(-1)
    s, z = enc.scale.float(), enc.zero.float()
    exact_s = (hi - lo) / levels
    # half a step, plus what storing the zero point (lo) and the scale in fp16 moved
    slack = s / 2 + (lo - z).abs() + levels * (exact_s - s).clamp_min(0) + 1e-6 * g.abs().amax(-1)
    err = (decode(enc, fmt, torch.float32) - x).reshape(g.shape).abs()
    assert bool((err <= slack[..., None]).all())
    assert bool(((s - exact_s).abs() <= exact_s * 2**-10 + 1e-7).all())  # the scale is the range, fp16-rounded


@HYP
@given(shape=row_shapes, magnitude=magnitudes, seed=st.integers(0, 2**31 - 1), outliers=st.booleans())
def test_fp8_relative_error_is_small(shape, magnitude: float, seed: int, outliers: bool) -> None:  # noqa: ANN001
    fmt = FORMATS["fp8"]
    x = _rows(seed, shape, magnitude, outliers)
    enc = encode(x, fmt)
    assert enc.codes.dtype == torch.float8_e4m3fn and enc.scale.shape == (*shape[:-1], 1)
    assert float(enc.codes.float().abs().max()) <= FP8_MAX
    y = decode(enc, fmt, torch.float32)
    s = enc.scale.float()
    # e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the number; below its normals the step is 2^-9 x scale
    assert bool(((y - x).abs() <= 2**-4 * x.abs() + 2**-9 * s + 1e-9).all())
    assert float((y - x).norm() / x.norm()) < 0.05


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_float_formats_are_exact_casts(name: str) -> None:
    fmt = FORMATS[name]
    x = _rows(1, (3, 5, 64), 2.0, outliers=True)
    enc = encode(x, fmt)
    assert enc.scale is None and enc.zero is None
    assert enc.codes.dtype == fmt.dtype and torch.equal(enc.codes, x.to(fmt.dtype))
    assert torch.equal(decode(enc, fmt, torch.float32), x.to(fmt.dtype).float())
    assert enc.nbytes == x.numel() * fmt.bits // 8


@pytest.mark.parametrize("name", PER_TOKEN)
@HYP
@given(layers=st.integers(1, 3), kv_heads=st.integers(1, 4), tokens=st.integers(1, 5),
       head_dim=st.sampled_from([64, 128]))
def test_encoded_bytes_are_the_tensors_and_bytes_per_token(name: str, layers: int, kv_heads: int, tokens: int,
                                                           head_dim: int) -> None:
    fmt = FORMATS[name]
    total = 0
    for layer in range(layers):
        for kv in range(2):  # K and V
            enc = encode(_rows(10 * layer + kv, (kv_heads, tokens, head_dim), 1.0), fmt)
            assert enc.nbytes == sum(t.numel() * t.element_size() for t in enc.tensors())
            total += enc.nbytes
    assert total == tokens * fmt.bytes_per_token(layers, kv_heads, head_dim)


@pytest.mark.parametrize("name", ["int2-kivi", "int4-kivi"])
def test_kivi_bytes_per_token_over_whole_groups(name: str) -> None:
    """Keys per channel over a whole group of tokens plus values per token: the formula, spread over the group."""
    fmt = FORMATS[name]
    h, d, n = 3, 64, fmt.token_group
    k = encode_per_channel(_rows(0, (h, n, d), 1.0, outliers=True), fmt)
    v = encode(_rows(1, (h, n, d), 1.0), fmt)
    assert k.scale.shape == (h, 1, d) and k.zero.shape == (h, 1, d)  # one scale per channel
    assert k.nbytes + v.nbytes == n * fmt.bytes_per_token(1, h, d)


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in ("fp32",)])
@pytest.mark.parametrize("value", [0.0, 1.0, -3.7, 250.0, 1e-5])
def test_constant_rows_decode_without_nan(name: str, value: float) -> None:
    fmt = FORMATS[name]
    x = torch.full((2, 40, 64), value)
    y = round_trip(x, fmt, axis=fmt.key_axis)
    assert torch.isfinite(y).all()
    assert float((y - x).abs().max()) <= 5e-3 * abs(value) + 1e-4
    assert torch.isfinite(round_trip(x, fmt)).all()  # values (per token) too


def test_round_trip_per_channel_keeps_the_partial_group_in_fp16() -> None:
    fmt = FORMATS["int2-kivi"]
    x = _rows(3, (2, 2 * fmt.token_group + 5, 64), 1.0, outliers=True)
    y = round_trip(x, fmt, axis="channel")
    assert y.shape == x.shape
    full = 2 * fmt.token_group
    assert torch.equal(y[:, full:], x[:, full:].to(SCALE_DTYPE).float())
    first = decode_per_channel(encode_per_channel(x[:, :fmt.token_group], fmt), fmt, torch.float32)
    assert torch.equal(y[:, :fmt.token_group], first)


def test_per_channel_keys_beat_per_token_keys_with_outlier_channels() -> None:
    """KIVI's premise: with a few large channels, per-channel scales lose far less than per-token ones."""
    x = _rows(4, (3, 64, 64), 1.0, outliers=True)
    per_token = float((round_trip(x, FORMATS["int2"]) - x).norm() / x.norm())
    per_channel = float((round_trip(x, FORMATS["int2-kivi"], axis="channel") - x).norm() / x.norm())
    assert per_channel < per_token


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV format 'int3'"):
        get_format("int3")
    with pytest.raises(ValueError, match="unknown KV format"):
        Variant("int3")


# ---- stores ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["int2-kivi", "int4-kivi"])
@HYP
@given(chunks=st.lists(st.integers(1, 40), min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_channel_group_store_forms_groups_and_reads_in_order(name: str, chunks: list[int], seed: int) -> None:
    fmt = FORMATS[name]
    g = fmt.token_group
    store = make_store(fmt, torch.float32, keys=True)
    assert isinstance(store, ChannelGroupStore)
    # each token's row has its own offset, so a read out of order would be far off
    x = _rows(seed, (2, sum(chunks), 64), 1.0, outliers=True) + torch.arange(sum(chunks))[None, :, None] * 3.0
    seen = 0
    for c in chunks:
        store.append(x[:, seen:seen + c])
        seen += c
        assert len(store.groups) == seen // g
        r = 0 if store.residual is None else store.residual.shape[1]
        assert r == seen % g and r < g
        assert len(store) == seen
        got = store.read()
        assert got.shape == (2, seen, 64) and got.dtype == torch.float32
        x16 = x[:, :seen].to(SCALE_DTYPE).float()  # the store holds keys in fp16 before quantizing them
        assert torch.equal(got, round_trip(x16, fmt, axis="channel"))
        assert torch.equal(got[:, seen // g * g:], x16[:, seen // g * g:])  # the residual, exactly
        # every group quantized per channel: at most half a step (plus fp16 slack) from its own token
        for i, enc in enumerate(store.groups):
            part = x16[:, i * g:(i + 1) * g]
            slack = enc.scale.float() / 2 + _fp16_gap(part.amin(1, keepdim=True)) + 0.01 * enc.scale.float()
            assert bool(((got[:, i * g:(i + 1) * g] - part).abs() <= slack + 1e-5).all())
    d = 64
    payload = len(store.groups) * (2 * g * d * fmt.bits // 8 + 2 * d * 2 * SCALE_DTYPE.itemsize)
    assert store.nbytes == payload + (seen % g) * 2 * d * SCALE_DTYPE.itemsize


def test_channel_group_store_refuses_to_drop_tokens() -> None:
    store = ChannelGroupStore(FORMATS["int2-kivi"], torch.float32)
    store.append(_rows(0, (2, 40, 64), 1.0))
    with pytest.raises(ValueError, match="cannot drop single tokens"):
        store.keep(torch.zeros((2, 8), dtype=torch.long))


@pytest.mark.parametrize("name", PER_TOKEN)
def test_token_store_keeps_the_chosen_rows(name: str) -> None:
    fmt = FORMATS[name]
    store = TokenStore(fmt, torch.float32)
    store.append(_rows(0, (2, 20, 64), 1.0))
    store.append(_rows(1, (2, 3, 64), 1.0))
    before = store.read()
    idx = torch.tensor([[0, 1, 5, 22], [2, 3, 20, 21]])
    store.keep(idx)
    assert len(store) == 4
    assert torch.equal(store.read(), torch.gather(before, 1, idx[..., None].expand(-1, -1, 64)))
    assert store.nbytes == 4 * fmt.bytes_per_token(1, 2, 64) / 2  # K only: half of a token's K and V


# ---- eviction policies -------------------------------------------------------------------------------

policies = st.one_of(
    st.builds(EvictionPolicy, kind=st.just("window"), budget=st.integers(MIN_BUDGET, 48)),
    st.integers(MIN_BUDGET, 48).flatmap(lambda b: st.builds(
        EvictionPolicy, kind=st.just("sinks"), budget=st.just(b), sinks=st.integers(1, b - 1))),
    st.builds(EvictionPolicy, kind=st.just("h2o"), budget=st.integers(MIN_BUDGET, 48),
              recent_share=st.floats(0.05, 0.95)),
)


@HYP
@given(policy=policies, n=st.integers(1, 120), hkv=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_policies_keep_exactly_the_budget(policy: EvictionPolicy, n: int, hkv: int, seed: int) -> None:
    positions = torch.arange(n).expand(hkv, n)
    scores = torch.rand((hkv, n), generator=torch.Generator().manual_seed(seed))
    idx = policy.select(positions, scores)
    if n <= policy.budget:
        assert idx is None  # nothing evicted under budget
        return
    b = policy.budget
    assert idx.shape == (hkv, b)
    assert bool((idx[:, 1:] > idx[:, :-1]).all())  # ascending, no repeats
    assert int(idx.min()) >= 0 and int(idx.max()) < n
    for h in range(hkv):
        kept = idx[h].tolist()
        if policy.kind == "window":
            assert kept == list(range(n - b, n))
        elif policy.kind == "sinks":
            assert kept == list(range(policy.sinks)) + list(range(n - (b - policy.sinks), n))
        else:
            recent = max(1, int(round(b * policy.recent_share)))
            assert kept[b - recent:] == list(range(n - recent, n))
            heavy = kept[: b - recent]
            assert all(i < n - recent for i in heavy)
            dropped = sorted(set(range(n - recent)) - set(heavy))
            if heavy and dropped:
                assert float(scores[h, heavy].min()) >= float(scores[h, dropped].max())


def test_none_policy_never_evicts() -> None:
    assert EvictionPolicy().select(torch.arange(500).expand(2, 500), torch.rand(2, 500)) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "window", "budget": MIN_BUDGET - 1}, "too small; keep at least 8"),
    ({"kind": "h2o", "budget": 0}, "too small"),
    ({"kind": "sinks", "budget": 16, "sinks": 16}, "fewer than the budget"),
    ({"kind": "sinks", "budget": 16, "sinks": 20}, "fewer than the budget"),
    ({"kind": "sinks", "budget": 16, "sinks": 0}, "at least 1"),
    ({"kind": "lru", "budget": 16}, "unknown eviction policy 'lru'"),
    ({"kind": "h2o", "budget": 16, "recent_share": 0.0}, "between 0 and 1"),
    ({"kind": "h2o", "budget": 16, "recent_share": 1.0}, "between 0 and 1"),
    ({"kind": "h2o", "budget": 16, "recent_share": -0.5}, "between 0 and 1"),
])
def test_bad_policies_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EvictionPolicy(**kwargs)


def test_kivi_with_eviction_is_refused() -> None:
    for name in ("int2-kivi", "int4-kivi"):
        with pytest.raises(ValueError, match="cannot drop single tokens"):
            Variant(name, EvictionPolicy("window", 32))
        Variant(name)  # without eviction it is fine


# ---- the lab on the real model -------------------------------------------------------------------------

FORMAT_VARIANTS = [Variant("bf16"), Variant("fp8"), Variant("int8"), Variant("int4"), Variant("int2"),
                   Variant("int2-kivi")]
EVICTION_VARIANTS = [Variant("fp32", EvictionPolicy("window", BUDGET)), Variant("fp32", EvictionPolicy("sinks", BUDGET)),
                     Variant("fp32", EvictionPolicy("h2o", BUDGET)), Variant("int8", EvictionPolicy("sinks", BUDGET)),
                     Variant("fp8", EvictionPolicy("h2o", BUDGET))]  # FP8 codes are gathered as bytes


def _fingerprint(weights: LoadedWeights) -> dict[str, tuple[float, float]]:
    return {k: (float(v.double().sum()), float(v.reshape(-1)[:64].double().abs().sum()))
            for k, v in weights.state_dict.items()}


@pytest.fixture(scope="module")
def lab_setup(real_weights: LoadedWeights, one_torch_thread: None) -> tuple[KVLab, list[int], dict]:
    before = _fingerprint(real_weights)
    ids = real_weights.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}])
    assert len(ids) > BUDGET
    return KVLab(real_weights), ids, before


@pytest.fixture(scope="module")
def format_run(lab_setup) -> LabResult:  # noqa: ANN001
    lab, ids, _ = lab_setup
    return lab.run(ids, FORMAT_VARIANTS, NEW_TOKENS)


@pytest.fixture(scope="module")
def eviction_run(lab_setup) -> LabResult:  # noqa: ANN001
    lab, ids, _ = lab_setup
    return lab.run(ids, EVICTION_VARIANTS, NEW_TOKENS)


def _by_label(result: LabResult) -> dict[str, object]:
    return {(v.variant.format, v.variant.policy.kind): v for v in result.variants}


def test_reference_is_the_engines_greedy_text(lab_setup, format_run: LabResult, real_weights: LoadedWeights) -> None:  # noqa: ANN001
    _, ids, _ = lab_setup
    engine = LLMEngine(EngineConfig(), real_weights)
    out = engine.generate(ids, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
    assert tuple(out[0].token_ids) == format_run.reference_tokens
    ref = format_run.variants[0]
    assert ref.is_reference and ref.variant == Variant("fp32")
    assert ref.top1_agreement == 1.0 and ref.mean_kl == 0.0 and ref.free_tokens == format_run.reference_tokens


def test_result_shapes(format_run: LabResult, real_weights: LoadedWeights) -> None:
    cfg = real_weights.config
    steps = len(format_run.reference_tokens)
    assert [v.variant for v in format_run.variants] == [Variant("fp32"), *FORMAT_VARIANTS]
    for v in format_run.variants:
        for arr in (v.forced_argmax, v.kl, v.ref_logprob, v.cache_bytes, v.cached_tokens):
            assert arr.shape == (steps,)
        assert v.forced_argmax[0] == format_run.reference_tokens[0]  # the shared prefill's token
        assert np.all(v.kl >= -1e-6) and np.all(np.isfinite(v.ref_logprob))
        assert v.kept is None  # no eviction
    assert format_run.key_absmax.shape == (cfg.num_layers, cfg.head_dim)
    assert set(format_run.roundtrip_error) == set(FORMATS)


def test_bf16_is_nearly_the_reference(format_run: LabResult) -> None:
    bf16 = _by_label(format_run)[("bf16", "none")]
    ref = format_run.reference_tokens
    assert bf16.top1_agreement >= 0.9
    assert bf16.mean_kl < 1e-3
    div = bf16.first_divergence(ref)
    assert div is None or div >= len(ref) // 2, (div, bf16.free_tokens, ref)


def test_cache_bytes_are_the_formats_bytes_per_token(format_run: LabResult, real_weights: LoadedWeights) -> None:
    cfg = real_weights.config
    layers, h, d = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    n_prompt = format_run.prompt_len
    for v in format_run.variants:
        fmt = v.variant.kv_format
        steps = len(v.cached_tokens)
        assert v.cached_tokens.tolist() == list(range(n_prompt, n_prompt + steps))  # nothing evicted
        bpt = fmt.bytes_per_token(layers, h, d)
        if fmt.key_axis == "token":
            assert np.array_equal(v.cache_bytes, v.cached_tokens * int(bpt)), fmt.name
            continue
        # KIVI: whole groups at the formula's price, the newest (fewer than a group) keys in fp16
        g = fmt.token_group
        n = v.cached_tokens
        groups, residual = n // g, n % g
        keys = h * (groups * (g * d * fmt.bits // 8 + d * 2 * SCALE_DTYPE.itemsize) + residual * d * SCALE_DTYPE.itemsize)
        values = n * h * (d * fmt.bits // 8 + d // fmt.group * 2 * SCALE_DTYPE.itemsize)
        assert np.array_equal(v.cache_bytes, layers * (keys + values)), fmt.name
        per_token = v.cache_bytes[-1] / n[-1]
        extra = layers * h * residual[-1] * d * SCALE_DTYPE.itemsize / n[-1]  # what the fp16 residual adds
        assert bpt <= per_token <= bpt + extra + 1e-9
        assert per_token < FORMATS["int8"].bytes_per_token(layers, h, d)


def test_int2_is_worse_than_int8(format_run: LabResult) -> None:
    by = _by_label(format_run)
    int8, int2 = by[("int8", "none")], by[("int2", "none")]
    assert int2.mean_kl > int8.mean_kl
    assert int2.perplexity > int8.perplexity
    assert int2.top1_agreement <= int8.top1_agreement
    err = format_run.roundtrip_error
    assert err["int2"][0].mean() > err["int4"][0].mean() > err["int8"][0].mean() > err["bf16"][0].mean()
    assert err["int2-kivi"][0].mean() < err["int2"][0].mean()  # keys per channel
    assert np.array_equal(err["int2-kivi"][1], err["int2"][1])  # values per token in both


def test_eviction_holds_the_budget(eviction_run: LabResult, real_weights: LoadedWeights) -> None:
    cfg = real_weights.config
    layers, h, d = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    n_prompt = eviction_run.prompt_len
    by = _by_label(eviction_run)
    for v in eviction_run.variants[1:]:
        policy, fmt = v.variant.policy, v.variant.kv_format
        steps = len(v.cached_tokens)
        assert np.all(v.cached_tokens == policy.budget)
        assert np.array_equal(v.cache_bytes, np.full(steps, policy.budget * int(fmt.bytes_per_token(layers, h, d))))
        assert v.kept.shape == (steps, layers, h, n_prompt + NEW_TOKENS)
        assert np.all(v.kept.sum(-1) == policy.budget)  # budget positions per (layer, head), every step
        for s in range(steps):
            held = n_prompt + s  # positions 0 .. held-1 have been cached by step s
            assert not v.kept[s, ..., held:].any()
            if policy.kind == "window":
                assert v.kept[s, ..., held - policy.budget:held].all()
            elif policy.kind == "sinks":
                assert v.kept[s, ..., :policy.sinks].all()
                assert v.kept[s, ..., held - (policy.budget - policy.sinks):held].all()
            else:
                recent = max(1, round(policy.budget * policy.recent_share))
                assert v.kept[s, ..., held - recent:held].all()
    # heavy hitters are chosen per head: somewhere two heads of a layer keep different tokens
    h2o = by[("fp32", "h2o")].kept[-1]
    assert any(not np.array_equal(h2o[i, 0], h2o[i, j]) for i in range(layers) for j in range(1, h))
    assert eviction_run.variants[0].cached_tokens[-1] == n_prompt + len(eviction_run.reference_tokens) - 1


def test_eviction_costs_quality(eviction_run: LabResult) -> None:
    for v in eviction_run.variants[1:]:
        assert v.mean_kl > 0.0  # the prompt no longer fits: every policy loses something
        assert np.isfinite(v.perplexity)


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt_ids": []}, "the prompt is empty"),
    ({"prompt_ids": [1] * (MAX_PROMPT_TOKENS + 1)}, f"at most {MAX_PROMPT_TOKENS}"),
    ({"max_new_tokens": 0}, f"between 1 and {MAX_NEW_TOKENS}"),
    ({"max_new_tokens": MAX_NEW_TOKENS + 1}, f"between 1 and {MAX_NEW_TOKENS}"),
    ({"variants": []}, "at least one cache variant"),
    ({"variants": [Variant("int8", EvictionPolicy("window", 8 + i)) for i in range(MAX_VARIANTS + 1)]},
     f"at most {MAX_VARIANTS} variants"),
    ({"variants": [Variant("int8"), Variant("int4"), Variant("int8")]}, "listed twice"),
])
def test_lab_refuses_bad_input(lab_setup, kwargs: dict, message: str) -> None:  # noqa: ANN001
    lab, ids, _ = lab_setup
    args = {"prompt_ids": ids, "variants": [Variant("int8")], "max_new_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        lab.check(**args)
    if args["variants"]:  # run() refuses the same input before computing anything
        with pytest.raises(ValueError, match=message):
            lab.run(args["prompt_ids"], args["variants"], args["max_new_tokens"])
    lab.check(ids, [Variant("int8")], 8)  # and accepts good input


def test_a_second_run_is_identical(lab_setup, eviction_run: LabResult, real_weights: LoadedWeights) -> None:  # noqa: ANN001
    lab, ids, before = lab_setup
    again = lab.run(ids, EVICTION_VARIANTS, NEW_TOKENS)
    assert again.reference_tokens == eviction_run.reference_tokens
    for a, b in zip(again.variants, eviction_run.variants, strict=True):
        assert a.variant == b.variant and a.free_tokens == b.free_tokens
        for name in ("forced_argmax", "kl", "ref_logprob", "cache_bytes", "cached_tokens", "kept"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or np.array_equal(x, y), name
    assert _fingerprint(real_weights) == before  # the shared weights are untouched
