"""Run the real model with compressed KV caches side by side, and measure what each costs in quality.

One prompt is prefilled once at full precision (as H2O and KIVI evaluate: the prompt's own pass is
exact), and its KV is then stored in each variant's format and evicted to each variant's budget. From
there every generated token of every variant reads only its own compressed cache: attention dequantizes
the stored codes and sees only the tokens the policy kept.

Each variant runs twice in one batch (the rows share every matmul, attention is per row):
- forced: fed the reference's greedy tokens, so its next-token distribution can be compared with the
  reference's at every position (top-1 agreement, KL divergence, the reference token's log-probability);
- free: fed its own greedy tokens, so the text it would really write can be read.

The reference is the engine's own precision (fp32 on the CPU, bf16 on a GPU) with nothing evicted; its
greedy tokens are the paged engine's (tests/test_kv_compression.py checks it against `LLMEngine`).
Attention here is the torch path (dequantize, then attend): the bytes are what a fused kernel would read,
the time is not what one would take.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch

from engine.kv_compression.formats import FORMATS, KVFormat, get_format, round_trip
from engine.kv_compression.policies import EvictionPolicy
from engine.kv_compression.store import make_store
from engine.model import LlamaModel, apply_rope
from engine.result_store import StoredResult, stored_run
from engine.weights import LoadedWeights
from kernels.dispatch import Kernels

RowMode = Literal["reference", "forced", "free"]
MAX_VARIANTS = 6
MAX_NEW_TOKENS = 256
MAX_PROMPT_TOKENS = 1536


@dataclass(frozen=True, slots=True)
class Variant:
    """One way to hold the cache: a storage format and an eviction policy."""

    format: str = "fp32"
    policy: EvictionPolicy = EvictionPolicy()

    def __post_init__(self) -> None:
        fmt = get_format(self.format)
        if fmt.key_axis == "channel" and self.policy.kind != "none":
            raise ValueError(f"{fmt.label} keeps keys in groups of {fmt.token_group} tokens with one scale per "
                             "channel, so it cannot drop single tokens: pick no eviction for it")

    @property
    def kv_format(self) -> KVFormat:
        return FORMATS[self.format]

    @property
    def label(self) -> str:
        if self.policy.kind == "none":
            return self.kv_format.label
        return f"{self.kv_format.label.split(' (')[0]} · {self.policy.label}"


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where `tokens` and `reference` differ (the shorter one's end if one stops early), or
    None when they are the same."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


@dataclass(frozen=True, slots=True, eq=False)
class VariantResult:
    """What one variant did. Arrays are per generated position (index 0 is the token the shared prefill
    chose, identical for every variant, so the measures start at index 1)."""

    variant: Variant
    is_reference: bool
    forced_argmax: np.ndarray  # [S] the variant's top token when fed the reference's tokens
    matches: np.ndarray  # [S] bool: that top token is the reference's
    kl: np.ndarray  # [S] KL(reference || variant) in nats (0 at index 0)
    ref_logprob: np.ndarray  # [S] log-probability the variant gave the reference's token
    free_tokens: tuple[int, ...]  # its own greedy text, up to and including an end token
    cache_bytes: np.ndarray  # [S] bytes of its (forced row's) cache after each step, every layer, K and V
    cached_tokens: np.ndarray  # [S] tokens each head holds after each step
    kept: np.ndarray | None  # [S, layers, Hkv, total] which positions the forced row's cache holds after each step
    attention_seconds: float  # mean per decode step: reading the cache and attending, all layers

    @property
    def measured(self) -> slice:
        return slice(1, len(self.kl))

    @property
    def top1_agreement(self) -> float:
        """Share of positions where the variant's top token is the reference's."""
        m = self.matches[self.measured]
        return 1.0 if m.size == 0 else float(m.mean())

    @property
    def mean_kl(self) -> float:
        k = self.kl[self.measured]
        return 0.0 if k.size == 0 else float(k.mean())

    @property
    def perplexity(self) -> float:
        """exp(mean negative log-probability of the reference's tokens), positions 1 onwards."""
        lp = self.ref_logprob[self.measured]
        return 1.0 if lp.size == 0 else float(np.exp(-lp.mean()))

    @property
    def bytes_per_token(self) -> float:
        """Its cache's bytes at the end over the tokens it holds (codes, scales, zero points; KIVI's FP16 keys)."""
        return float(self.cache_bytes[-1]) / max(1, int(self.cached_tokens[-1]))

    def first_divergence(self, reference: Sequence[int]) -> int | None:
        """The first position where its own text differs from the reference's, or None."""
        return first_difference(self.free_tokens, reference)


@dataclass(frozen=True, slots=True, eq=False)
class LabResult:
    prompt_ids: tuple[int, ...]
    reference_tokens: tuple[int, ...]  # greedy, as the paged engine would write them
    variants: tuple[VariantResult, ...]  # the reference first
    key_absmax: np.ndarray  # [layers, D] largest |K| per channel in the reference's final cache
    value_absmax: np.ndarray  # [layers, D]
    roundtrip_error: dict[str, tuple[np.ndarray, np.ndarray]]  # format -> relative error per layer (K, V)
    sink_share: np.ndarray  # [layers] mean attention the generated tokens put on position 0 (reference)
    last_attention: np.ndarray  # [layers, n] the last generated token's attention over positions, head mean
    full_bf16_bytes: int  # a BF16 cache of every token the reference holds at the end: the common yardstick
    prefill_seconds: float
    decode_seconds: float
    device: str
    compute_dtype: str

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def size_vs_bf16(self, r: VariantResult) -> float:
        """`r`'s cache over a full BF16 cache of every token (fewer bits and fewer tokens alike): 0.25 is four
        times smaller, and the FP32 reference is 2. A 'times smaller' column read 0.50x for that reference."""
        return float(r.cache_bytes[-1]) / self.full_bf16_bytes


class _RowCache:
    """One row's cache: per layer a K store, a V store, each cached token's position and its attention so far."""

    def __init__(self, variant: Variant, layers: int, compute_dtype: torch.dtype, device: torch.device) -> None:
        fmt = variant.kv_format
        self.variant = variant
        self.k = [make_store(fmt, compute_dtype, keys=True) for _ in range(layers)]
        self.v = [make_store(fmt, compute_dtype, keys=False) for _ in range(layers)]
        self.positions: list[torch.Tensor | None] = [None] * layers
        self.scores: list[torch.Tensor | None] = [None] * layers
        self.device = device

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               scores: torch.Tensor | None = None) -> None:
        """k, v [Hkv, t, D]; positions [t]; scores [Hkv, t] (attention already received) or zeros."""
        hkv, t = k.shape[0], k.shape[1]
        self.k[layer].append(k)
        self.v[layer].append(v)
        pos = positions.expand(hkv, t)
        sc = torch.zeros((hkv, t), dtype=torch.float32, device=self.device) if scores is None else scores.clone()
        old_p, old_s = self.positions[layer], self.scores[layer]
        self.positions[layer] = pos.clone() if old_p is None else torch.cat([old_p, pos], dim=1)
        self.scores[layer] = sc if old_s is None else torch.cat([old_s, sc], dim=1)

    def evict(self) -> None:
        for i in range(len(self.k)):
            idx = self.variant.policy.select(self.positions[i], self.scores[i])
            if idx is None:
                continue
            self.k[i].keep(idx)
            self.v[i].keep(idx)
            self.positions[i] = torch.gather(self.positions[i], 1, idx)
            self.scores[i] = torch.gather(self.scores[i], 1, idx)

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached tokens of every layer (speculation's rollback; per-token formats only)."""
        for i in range(len(self.k)):
            idx = torch.arange(n, device=self.device).expand(self.positions[i].shape[0], n)
            self.k[i].keep(idx)
            self.v[i].keep(idx)
            self.positions[i] = self.positions[i][:, :n]
            self.scores[i] = self.scores[i][:, :n]

    def clone(self) -> "_RowCache":
        """A copy with its own stores (the forced and free rows start from the same compressed prompt)."""
        twin = _RowCache.__new__(_RowCache)
        twin.variant, twin.device = self.variant, self.device
        twin.k = [s.copy() for s in self.k]
        twin.v = [s.copy() for s in self.v]
        twin.positions = [p.clone() for p in self.positions]
        twin.scores = [s.clone() for s in self.scores]
        return twin

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.k) + sum(s.nbytes for s in self.v)

    @property
    def tokens(self) -> int:
        return len(self.k[0])

    def kept_mask(self, total: int) -> np.ndarray:
        """[layers, Hkv, total] bool: which positions each head of each layer holds."""
        out = np.zeros((len(self.k), self.positions[0].shape[0], total), dtype=bool)
        for i, p in enumerate(self.positions):
            pn = p.cpu().numpy()
            for h in range(pn.shape[0]):
                out[i, h, pn[h]] = True
        return out


@dataclass(slots=True)
class _Row:
    index: int  # into the variant list
    mode: RowMode
    cache: _RowCache
    tokens: list[int]
    attention_seconds: float = 0.0


ProgressFn = Callable[[int, int], None]


class KVLab:
    """Drives the model weights directly (the same prepared weights and kernels as `LLMEngine`), with one
    compressed cache per row instead of the paged pool."""

    def __init__(self, weights: LoadedWeights, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.cfg = weights.config
        self.tokenizer = weights.tokenizer
        self.device = torch.device(device)
        self.dtype = dtype
        self.kernels = Kernels("torch", self.device, profile=False)
        self.model = LlamaModel(self.cfg, weights.state_dict, self.kernels, self.device, dtype,
                                max_len=MAX_PROMPT_TOKENS + MAX_NEW_TOKENS + 1)
        self.reference = Variant("fp32" if dtype == torch.float32 else "bf16")

    # ---- checks ----------------------------------------------------------------------------------
    def check(self, prompt_ids: list[int], variants: list[Variant], max_new_tokens: int) -> None:
        """Raise ValueError with one sentence for input the lab cannot run."""
        if not prompt_ids:
            raise ValueError("the prompt is empty: type something for the model to answer")
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise ValueError(f"the prompt is {len(prompt_ids)} tokens; this lab takes at most {MAX_PROMPT_TOKENS}")
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"tokens to generate must be between 1 and {MAX_NEW_TOKENS}; got {max_new_tokens}")
        if not variants:
            raise ValueError("pick at least one cache variant to compare with the reference")
        if len(variants) > MAX_VARIANTS:
            raise ValueError(f"compare at most {MAX_VARIANTS} variants at once; got {len(variants)}")
        if len(set(variants)) != len(variants):
            raise ValueError("the same variant is listed twice")

    # ---- the pass ----------------------------------------------------------------------------------
    def _attend(self, row: _Row, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor, want_probs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Store this step's k, v [t, Hkv, D] in the row's cache, then attend q [t, Hq, D] over what the
        cache holds (write, then read: the new token's own key is read back compressed, as in a real cache)."""
        t0 = time.perf_counter()
        cfg, cache = self.cfg, row.cache
        hkv, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
        cache.append(layer, k.transpose(0, 1), v.transpose(0, 1), positions)
        K, V = cache.k[layer].read(), cache.v[layer].read()  # [Hkv, n, D]
        t = q.shape[0]
        qg = q.reshape(t, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, g, t, D]
        s = torch.einsum("hgtd,hnd->hgtn", qg.float(), K.float()) * self.model.scale
        visible = cache.positions[layer][:, None, None, :] <= positions[None, None, :, None]
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
        cache.scores[layer] += p.sum(dim=(1, 2))
        out = torch.einsum("hgtn,hnd->hgtd", p, V.float()).to(q.dtype)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        row.attention_seconds += time.perf_counter() - t0
        return out.permute(2, 0, 1, 3).reshape(t, hkv * g, d), (p.mean(dim=(0, 1))[-1] if want_probs else None)

    def _forward(self, rows: list[_Row], ids: torch.Tensor, positions: torch.Tensor,
                 probe: _Row | None = None, all_positions: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids [R, t] (one line per row), positions [t]: logits [R, vocab] at each row's last position ([R, t,
        vocab] at every position with `all_positions`: a verification pass), and the probe row's last-query
        attention per layer (head mean)."""
        cfg, m, K = self.cfg, self.model, self.kernels
        r, t = ids.shape
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        cos, sin = m.cos[positions], m.sin[positions]
        h = m.embed[ids.reshape(-1)]
        residual = None
        probed: list[torch.Tensor] = []
        for i, L in enumerate(m.layers):
            x, residual = K.rmsnorm(h, L["attn_norm"], cfg.rms_norm_eps, residual)
            if residual is None:
                residual = h
            qkv = K.linear("linear.qkv", x, L["qkv"]).reshape(r, t, (hq + 2 * hkv) * d)
            outs = []
            for j, row in enumerate(rows):
                q = apply_rope(qkv[j, :, : hq * d].reshape(t, hq, d), cos, sin)
                k = apply_rope(qkv[j, :, hq * d:(hq + hkv) * d].reshape(t, hkv, d), cos, sin)
                v = qkv[j, :, (hq + hkv) * d:].reshape(t, hkv, d)
                o, probs = self._attend(row, i, q, k, v, positions, want_probs=row is probe)
                if probs is not None:
                    probed.append(probs)
                outs.append(o.reshape(t, hq * d))
            attn = torch.cat(outs, dim=0)
            o = K.linear("linear.o", attn, L["o"])
            x, residual = K.rmsnorm(o, L["mlp_norm"], cfg.rms_norm_eps, residual)
            h = K.linear("linear.down", K.silu_mul(K.linear("linear.gate_up", x, L["gate_up"])), L["down"])
        final, _ = K.rmsnorm(h, m.final_norm, cfg.rms_norm_eps, residual)
        if all_positions:
            return m.logits(final).reshape(r, t, -1), probed
        last = final.reshape(r, t, -1)[:, -1]
        return m.logits(last), probed

    # ---- the experiment ----------------------------------------------------------------------------
    def run(self, prompt_ids: list[int], variants: list[Variant], max_new_tokens: int = 48,
            progress: ProgressFn | None = None) -> LabResult:
        self.check(prompt_ids, variants, max_new_tokens)
        variants = [v for v in variants if v != self.reference]  # the reference row is always there
        dev, layers, eos = self.device, self.cfg.num_layers, set(self.cfg.eos_token_ids)
        all_variants = [self.reference, *variants]
        n_prompt = len(prompt_ids)
        total = n_prompt + max_new_tokens

        with torch.inference_mode():
            t0 = time.perf_counter()
            ref = _Row(0, "reference", _RowCache(self.reference, layers, self.dtype, dev), [])
            ids = torch.tensor([prompt_ids], device=dev)
            logits, _ = self._forward([ref], ids, torch.arange(n_prompt, device=dev))
            prefill_seconds = time.perf_counter() - t0
            ref.attention_seconds = 0.0

            rows = [ref]
            for vi, variant in enumerate(variants, start=1):
                cache = _RowCache(variant, layers, self.dtype, dev)
                for i in range(layers):  # the prompt's exact KV, stored in the variant's format
                    cache.append(i, ref.cache.k[i].read(), ref.cache.v[i].read(), ref.cache.positions[i][0],
                                 ref.cache.scores[i])
                cache.evict()
                rows += [_Row(vi, "forced", cache, []), _Row(vi, "free", cache.clone(), [])]

            n_var = len(all_variants)
            first = int(torch.argmax(logits[0]))
            forced_argmax = np.zeros((n_var, max_new_tokens), dtype=np.int64)
            kl = np.zeros((n_var, max_new_tokens))
            ref_lp = np.zeros((n_var, max_new_tokens))
            cache_bytes = np.zeros((n_var, max_new_tokens), dtype=np.int64)
            cached = np.zeros((n_var, max_new_tokens), dtype=np.int64)
            kept = {vi: np.zeros((max_new_tokens, layers, self.cfg.num_kv_heads, total), dtype=bool)
                    for vi, v in enumerate(all_variants) if v.policy.kind != "none"}
            forced_argmax[:, 0] = first
            ref_lp[:, 0] = float(torch.log_softmax(logits[0].float(), -1)[first])
            for row in rows:
                row.tokens.append(first)
                if row.mode != "free":
                    self._record_cache(row, 0, cache_bytes, cached, kept, total)
            sink_sum = np.zeros(layers)
            last_attention: list[torch.Tensor] = []
            done_free = {row.index for row in rows if row.mode == "free" and first in eos}
            steps = 1
            t1 = time.perf_counter()
            for s in range(1, max_new_tokens):
                if ref.tokens[-1] in eos:
                    break
                live = [row for row in rows if not (row.mode == "free" and row.index in done_free)]
                feed = torch.tensor([[ref.tokens[-1] if row.mode != "free" else row.tokens[-1]] for row in live],
                                    device=dev)
                logits, probed = self._forward(live, feed, torch.tensor([n_prompt + s - 1], device=dev), probe=ref)
                logp = torch.log_softmax(logits.float(), dim=-1)
                y = int(torch.argmax(logp[0]))
                for j, row in enumerate(live):
                    tok = y if row.mode == "reference" else int(torch.argmax(logp[j]))
                    row.tokens.append(tok)
                    row.cache.evict()
                    if row.mode == "free":
                        if tok in eos:
                            done_free.add(row.index)
                        continue
                    forced_argmax[row.index, s] = tok
                    ref_lp[row.index, s] = float(logp[j, y])
                    kl[row.index, s] = float((logp[0].exp() * (logp[0] - logp[j])).sum())
                    self._record_cache(row, s, cache_bytes, cached, kept, total)
                sink_sum += np.array([float(p[0]) for p in probed])
                last_attention = probed
                steps += 1
                if progress is not None:
                    progress(s, max_new_tokens - 1)
            decode_seconds = time.perf_counter() - t1

        return self._result(prompt_ids, rows, all_variants, steps, forced_argmax, kl, ref_lp, cache_bytes, cached,
                            kept, sink_sum, last_attention, prefill_seconds, decode_seconds)

    def _record_cache(self, row: _Row, s: int, cache_bytes, cached, kept, total: int) -> None:
        cache_bytes[row.index, s] = row.cache.nbytes
        cached[row.index, s] = row.cache.tokens
        if row.index in kept:
            kept[row.index][s] = row.cache.kept_mask(total)

    def _result(self, prompt_ids, rows, all_variants, steps, forced_argmax, kl, ref_lp, cache_bytes, cached, kept,
                sink_sum, last_attention, prefill_seconds, decode_seconds) -> LabResult:
        ref_row = rows[0]
        ref_tokens = tuple(ref_row.tokens)
        ref_arr = np.array(ref_tokens, dtype=np.int64)
        eos = set(self.cfg.eos_token_ids)
        cfg = self.cfg
        decode_steps = max(1, steps - 1)
        out = []
        for vi, variant in enumerate(all_variants):
            forced = next(r for r in rows if r.index == vi and r.mode != "free")
            free = next((r for r in rows if r.index == vi and r.mode == "free"), forced)
            free_tokens: list[int] = []
            for tok in free.tokens:
                free_tokens.append(tok)
                if tok in eos:
                    break
            top = forced_argmax[vi, :steps].copy()  # the reference's row holds its own greedy tokens
            out.append(VariantResult(
                variant=variant, is_reference=vi == 0, forced_argmax=top, matches=top == ref_arr,
                kl=kl[vi, :steps].copy(), ref_logprob=ref_lp[vi, :steps].copy(), free_tokens=tuple(free_tokens),
                cache_bytes=cache_bytes[vi, :steps].copy(), cached_tokens=cached[vi, :steps].copy(),
                kept=None if vi not in kept else kept[vi][:steps].copy(),
                attention_seconds=forced.attention_seconds / decode_steps))
        k_abs, v_abs, errors = self._cache_statistics(ref_row.cache)
        bf16 = FORMATS["bf16"].bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        full_bf16 = int(bf16 * cached[0, steps - 1])
        n = len(prompt_ids) + steps - 1
        last = (np.stack([p.float().cpu().numpy()[:n] for p in last_attention]) if last_attention
                else np.zeros((self.cfg.num_layers, n)))
        return LabResult(tuple(prompt_ids), ref_tokens, tuple(out), k_abs, v_abs, errors,
                         sink_sum / decode_steps, last, full_bf16, prefill_seconds, decode_seconds, str(self.device),
                         str(self.dtype).removeprefix("torch."))

    def _cache_statistics(self, cache: _RowCache):
        """Per-channel magnitudes of the reference's keys and values, and every format's round-trip error on them."""
        k_abs, v_abs = [], []
        errors: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in FORMATS}
        for i in range(self.cfg.num_layers):
            K, V = cache.k[i].read().float(), cache.v[i].read().float()  # [Hkv, n, D]
            k_abs.append(K.abs().amax(dim=(0, 1)).cpu().numpy())
            v_abs.append(V.abs().amax(dim=(0, 1)).cpu().numpy())
            for name, fmt in FORMATS.items():
                kr = round_trip(K, fmt, axis=fmt.key_axis)
                vr = round_trip(V, fmt)
                errors[name][0].append(float((kr - K).norm() / K.norm()))
                errors[name][1].append(float((vr - V).norm() / V.norm()))
        return (np.stack(k_abs), np.stack(v_abs),
                {name: (np.array(ek), np.array(ev)) for name, (ek, ev) in errors.items()})


def stored_lab_run(lab: KVLab, weights: LoadedWeights, prompt_ids: Sequence[int], variants: Sequence[Variant],
                   max_new_tokens: int, progress: ProgressFn | None = None) -> StoredResult[LabResult]:
    """`lab.run`'s result, kept on disk for CPU weights (engine/result_store.py) like the other labs': the same
    weights (those `lab` was built on), prompt, variants, length and code give it back at once, with when it was
    computed, so its attention times are the ones measured then."""
    ids, chosen = list(prompt_ids), list(variants)
    lab.check(ids, chosen, max_new_tokens)  # bad input is a message, never a disk lookup
    settings = (tuple(ids), tuple(chosen), max_new_tokens)
    return stored_run("kv-compression-lab", weights, settings, lambda: lab.run(ids, chosen, max_new_tokens, progress),
                      device=lab.device.type, dtype=str(lab.dtype).removeprefix("torch."))
