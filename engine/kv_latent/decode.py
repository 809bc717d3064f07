"""Greedy decoding whose cache holds only the latent: one [tokens, r] tensor per layer instead of K and V.

Each step computes the new token's latent c = down · x and appends it; attention then rebuilds every cached
token's K (then RoPE at its position) from the latents. That rebuild is the price of this retrofit: RoPE sits
between the latent and the score, so up_k cannot be folded into the query projection. DeepSeek's MLA avoids it by
keeping RoPE out of the latent (a separate 64-wide rotary key, shared by all heads) and absorbing up_k into W_q.

V needs no rebuild even here (`absorb_v`, the default): Σ_t p_t · (up_v c_t) = up_v · (Σ_t p_t c_t), so attention
averages the latents themselves and each head applies up_v once to the average (MLA folds it into W_o). The
rebuild would cost 2 · tokens · r · (KV heads · head_dim) FLOPs a layer and step; the absorbed form, one
r-wide matrix-vector product per head.

A plain loop over the layers in fp32 (fp64 with fp64 weights and factors, as a test runs it), not the paged engine:
what it shows is the cache's contents and size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.kv_latent.factor import LatentLayer
from engine.model import apply_rope
from engine.weight_quant.dense import embed, rope_tables, weight_key
from kernels.precision import at_least_fp32
from kernels.rmsnorm_ref import rmsnorm_ref


@dataclass(frozen=True, slots=True)
class LatentRun:
    tokens: tuple[int, ...]  # generated, end-of-turn dropped
    cache_numbers_per_token: int  # summed over layers
    cache_bytes: int  # the latent tensors' bytes at the end (4 a number in fp32)
    rebuild_flops: int  # multiply-adds x 2 spent rebuilding K (and V unless absorbed) from latents, all steps; 0
    # when up only copies
    v_absorbed: bool


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return rmsnorm_ref(x, w, eps)[0]


class LatentCacheModel:
    """The model with its K and V projections replaced by `layers`' factors and a latent cache."""

    def __init__(self, cfg: ModelConfig, sd: dict[str, torch.Tensor], layers: list[LatentLayer], max_len: int,
                 absorb_v: bool = True):
        if len(layers) != cfg.num_layers:
            raise ValueError(f"{len(layers)} factored layers for a {cfg.num_layers}-layer model")
        self.cfg, self.sd, self.layers = cfg, sd, layers
        self.cos, self.sin = rope_tables(cfg, max_len)
        self.max_len = max_len
        self.cache: list[torch.Tensor] = [f.down.new_empty(0, f.rank) for f in layers]  # the factors' dtype
        self.rebuild_flops = 0
        self.absorb_v = absorb_v

    @property
    def length(self) -> int:
        return self.cache[0].shape[0]

    def _layer(self, i: int, h: torch.Tensor, past: int) -> torch.Tensor:
        cfg, f, p = self.cfg, self.layers[i], f"model.layers.{i}."
        W = lambda name: self.sd[weight_key(i, name)]  # noqa: E731
        hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        n = h.shape[0]
        x = _norm(h, self.sd[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        self.cache[i] = torch.cat([self.cache[i], x @ f.down.T])  # the only thing this layer keeps
        total = self.cache[i].shape[0]
        latents, r = self.cache[i], f.rank
        k = (latents @ f.up_k.T).reshape(total, hk, d)
        absorb = self.absorb_v and not f.copies_only
        if not f.copies_only:
            self.rebuild_flops += 2 * total * r * hk * d * (1 if absorb else 2)
        k = apply_rope(k, self.cos[:total], self.sin[:total]).transpose(0, 1)
        q = apply_rope((x @ W("self_attn.q_proj").T).reshape(n, hq, d), self.cos[past:total], self.sin[past:total])
        # New queries see every cached token and the new ones up to themselves.
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=past)
        if absorb:
            # Every KV head's "values" are the latents themselves; up_v comes after the weighted sum.
            pooled = F.scaled_dot_product_attention(q.transpose(0, 1), k, latents[None].expand(hk, total, r),
                                                    attn_mask=mask, enable_gqa=True, scale=d ** -0.5)  # [hq, n, r]
            a = torch.einsum("gjnr,gdr->gjnd", pooled.reshape(hk, hq // hk, n, r), f.up_v.reshape(hk, d, r))
            a = a.reshape(hq, n, d)
        else:
            v = (latents @ f.up_v.T).reshape(total, hk, d).transpose(0, 1)
            a = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, enable_gqa=True,
                                               scale=d ** -0.5)
        h = h + a.transpose(0, 1).reshape(n, hq * d) @ W("self_attn.o_proj").T
        x = _norm(h, self.sd[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        y = F.silu(x @ W("mlp.gate_proj").T) * (x @ W("mlp.up_proj").T)
        return h + y @ W("mlp.down_proj").T

    @torch.inference_mode()
    def forward(self, token_ids: list[int]) -> torch.Tensor:
        """Run new tokens after what is cached; the last one's next-token logits [vocab]."""
        if self.length + len(token_ids) > self.max_len:
            raise ValueError(f"{self.length + len(token_ids)} tokens exceed this model's {self.max_len}")
        h = at_least_fp32(embed(self.sd, torch.tensor(token_ids)))
        past = self.length
        for i in range(self.cfg.num_layers):
            h = self._layer(i, h, past)
        h = _norm(h[-1:], self.sd["model.norm.weight"], self.cfg.rms_norm_eps)
        head = self.sd.get("lm_head.weight", self.sd["model.embed_tokens.weight"])
        return (h @ head.T)[0]

    @property
    def cache_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.cache)


def latent_greedy(cfg: ModelConfig, sd: dict[str, torch.Tensor], layers: list[LatentLayer], prompt: list[int],
                  max_new_tokens: int, eos: tuple[int, ...], absorb_v: bool = True) -> LatentRun:
    """The prompt's greedy answer with a latent cache: one prefill, then one token per step."""
    model = LatentCacheModel(cfg, sd, layers, len(prompt) + max_new_tokens, absorb_v)
    logits = model.forward(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        t = int(logits.argmax())
        if t in eos:
            break
        out.append(t)
        if len(out) == max_new_tokens:
            break
        logits = model.forward([t])
    return LatentRun(tuple(out), sum(f.rank for f in layers), model.cache_bytes, model.rebuild_flops, absorb_v)
