"""Factor a layer's K and V projections through one shared latent: W_kv ≈ up · down.

SmolLM2's attention reads x (hidden 576) into K and V through W_k and W_v (3 KV heads x 64 each, 384 rows
together). MLA caches c = down · x (r numbers) instead of K and V, and rebuilds K = up_k · c, V = up_v · c when
attention needs them. For a trained GQA model the best rank-r choice is a truncated SVD, either of the weights
alone ("plain": the least change to W_kv) or of the weights as they act on the calibration text ("activation-
aware": the least change to W_kv · x, the K and V the model actually produces; the input covariance C = XᵀX/n
is factored as L·Lᵀ, and the SVD of W_kv·L is truncated, as ASVD and SVD-LLM do). At r = 384 both are exact.

Mean-pooling the KV heads into one (what the GQA paper does to turn an MHA checkpoint into MQA before uptraining)
is the other retrofit with a small cache: every query head reads the same averaged K and V, 128 numbers a token
and layer; written as a latent whose up-projection only copies, it runs through the same decoder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from engine.config import ModelConfig
from engine.weight_quant.dense import weight_key

FactorMethod = Literal["plain", "aware"]
DAMPING = 1e-4  # of the covariance's mean diagonal: keeps the Cholesky factor well-conditioned


@dataclass(frozen=True, slots=True, eq=False)
class LatentLayer:
    """One layer's factors: c = down @ x, K = up_k @ c, V = up_v @ c (before RoPE, as in the model)."""

    down: torch.Tensor  # [r, hidden]
    up_k: torch.Tensor  # [kv_heads * head_dim, r]
    up_v: torch.Tensor  # [kv_heads * head_dim, r]
    copies_only: bool = False  # up only copies (the model as trained, MQA): a real cache needs no rebuild

    @property
    def rank(self) -> int:
        return self.down.shape[0]


def kv_weight(cfg: ModelConfig, sd: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
    """[W_k; W_v] of one layer, [2 * kv_heads * head_dim, hidden], fp32."""
    return torch.cat([sd[weight_key(layer, "self_attn.k_proj")], sd[weight_key(layer, "self_attn.v_proj")]]).float()


def input_covariance(x: torch.Tensor) -> torch.Tensor:
    """XᵀX / n of the tokens [n, hidden] a layer's K and V projections read."""
    x = x.double()
    return (x.T @ x) / x.shape[0]


@dataclass(frozen=True, slots=True, eq=False)
class LayerSvd:
    """The SVD of W_kv · L once (L = I for plain), truncated to any rank after."""

    u: torch.Tensor  # float64 throughout
    s: torch.Tensor
    vh: torch.Tensor
    lower: torch.Tensor

    @property
    def max_rank(self) -> int:
        return self.s.shape[0]

    @property
    def cumulative_energy(self) -> torch.Tensor:
        """[max_rank] share of the squared singular values the first r keep, r = 1 .. max_rank (1.0 at the end)."""
        e = self.s ** 2
        return (e.cumsum(0) / e.sum()).float()

    def truncate(self, rank: int) -> LatentLayer:
        if not 1 <= rank <= self.max_rank:
            raise ValueError(f"the latent rank must be 1 to {self.max_rank}, got {rank}")
        # up = U_r, down = S_r V_rᵀ L⁻¹ (a triangular solve, not an explicit inverse).
        down = torch.linalg.solve_triangular(self.lower.T, (self.s[:rank, None] * self.vh[:rank]).T, upper=True).T
        up = self.u[:, :rank]
        half = up.shape[0] // 2
        return LatentLayer(down.float().contiguous(), up[:half].float().contiguous(), up[half:].float().contiguous())


def decompose(w_kv: torch.Tensor, covariance: torch.Tensor | None = None) -> LayerSvd:
    """Plain SVD of w_kv [rows, hidden] without `covariance`, activation-aware with it; float64 (the whitening
    multiplies by L and later by L⁻¹)."""
    hidden = w_kv.shape[1]
    if covariance is None:
        lower = torch.eye(hidden, dtype=torch.float64)
    else:
        c = covariance.double()
        c = c + DAMPING * c.diagonal().mean() * torch.eye(hidden, dtype=torch.float64)
        lower = torch.linalg.cholesky(c)
    u, s, vh = torch.linalg.svd(w_kv.double() @ lower, full_matrices=False)
    return LayerSvd(u, s, vh, lower)


def identity_layer(cfg: ModelConfig, sd: dict[str, torch.Tensor], layer: int) -> LatentLayer:
    """The model as it is, in the same form: the 'latent' is K and V themselves (rank 2 x kv_heads x head_dim)."""
    w = kv_weight(cfg, sd, layer)
    eye = torch.eye(w.shape[0])
    half = w.shape[0] // 2
    return LatentLayer(w.contiguous(), eye[:half].contiguous(), eye[half:].contiguous(), copies_only=True)


def mean_pooled_layer(cfg: ModelConfig, sd: dict[str, torch.Tensor], layer: int) -> LatentLayer:
    """GQA → MQA by mean-pooling, written as a latent: down is the averaged head's K and V projections (2 x
    head_dim rows), and up only copies them to every KV head. MQA is a latent cache whose up-projection is fixed."""
    hk, d, hidden = cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    pooled = [sd[weight_key(layer, n)].float().reshape(hk, d, hidden).mean(0) for n in ("self_attn.k_proj",
                                                                                      "self_attn.v_proj")]
    copy = torch.eye(d).repeat(hk, 1)  # [hk * d, d]: every head gets the same d numbers
    zeros = torch.zeros_like(copy)
    return LatentLayer(torch.cat(pooled).contiguous(), torch.cat([copy, zeros], 1).contiguous(),
                       torch.cat([zeros, copy], 1).contiguous(), copies_only=True)


def equivalent_state(cfg: ModelConfig, sd: dict[str, torch.Tensor], layers: list[LatentLayer]) -> dict[str, torch.Tensor]:
    """The state dict whose K and V projections are up · down: the dense model that computes, token for token,
    the same K and V as the latent cache rebuilds (what the held-out text is scored on)."""
    out = dict(sd)
    for i, f in enumerate(layers):
        out[weight_key(i, "self_attn.k_proj")] = (f.up_k @ f.down).contiguous()
        out[weight_key(i, "self_attn.v_proj")] = (f.up_v @ f.down).contiguous()
    return out
