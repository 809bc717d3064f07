"""The real queries, keys and values of one layer of the model for a prompt.

Runs the model's own weights (the shared `LoadedWeights`, no copies) from the embedding through
layers 0..L-1 with plain torch, then layer L's RMSNorm, Q/K/V projections and RoPE, exactly the
computation `engine.model.LlamaModel` does before its attention kernel. The FlashAttention page
feeds these tensors to naive attention, SDPA, the engine's attention path and the tiled re-enactment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model import apply_rope, rope_cache
from engine.weights import LoadedWeights


@dataclass(frozen=True, slots=True)
class LayerQKV:
    layer: int
    token_ids: tuple[int, ...]
    q: torch.Tensor  # [N, Hq, D] after RoPE
    k: torch.Tensor  # [N, Hkv, D] after RoPE
    v: torch.Tensor  # [N, Hkv, D]
    scale: float  # 1 / sqrt(head_dim)

    @property
    def seq_len(self) -> int:
        return int(self.q.shape[0])


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class _Runner:
    """A plain, unpaged Llama forward over one sequence, reading the weights in place."""

    def __init__(self, weights: LoadedWeights, device: torch.device, dtype: torch.dtype, n: int) -> None:
        self.cfg: ModelConfig = weights.config
        self.sd = weights.state_dict
        self.device, self.dtype = device, dtype
        cos, sin = rope_cache(self.cfg, n, device)
        self.cos, self.sin = cos[:n], sin[:n]

    def w(self, name: str) -> torch.Tensor:
        return self.sd[name].to(device=self.device, dtype=self.dtype)  # a no-op for the server's weights

    def qkv(self, h: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, p = self.cfg, f"model.layers.{i}."
        n = h.shape[0]
        x = _rmsnorm(h, self.w(p + "input_layernorm.weight"), cfg.rms_norm_eps)
        q = F.linear(x, self.w(p + "self_attn.q_proj.weight")).view(n, cfg.num_heads, cfg.head_dim)
        k = F.linear(x, self.w(p + "self_attn.k_proj.weight")).view(n, cfg.num_kv_heads, cfg.head_dim)
        v = F.linear(x, self.w(p + "self_attn.v_proj.weight")).view(n, cfg.num_kv_heads, cfg.head_dim)
        return apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin), v

    def layer(self, h: torch.Tensor, i: int) -> torch.Tensor:
        cfg, p = self.cfg, f"model.layers.{i}."
        n = h.shape[0]
        q, k, v = self.qkv(h, i)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              is_causal=True, scale=cfg.head_dim ** -0.5,
                                              enable_gqa=cfg.num_heads != cfg.num_kv_heads)
        h = h + F.linear(attn.transpose(0, 1).reshape(n, -1), self.w(p + "self_attn.o_proj.weight"))
        x = _rmsnorm(h, self.w(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
        act = F.silu(F.linear(x, self.w(p + "mlp.gate_proj.weight"))) * F.linear(x, self.w(p + "mlp.up_proj.weight"))
        return h + F.linear(act, self.w(p + "mlp.down_proj.weight"))

    def embed(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        return self.w("model.embed_tokens.weight")[ids]


@torch.inference_mode()
def layer_qkv(weights: LoadedWeights, token_ids: list[int], layer: int, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> LayerQKV:
    """Q, K, V of `layer` (0-based) for the prompt `token_ids`."""
    cfg = weights.config
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_layers}), got {layer}")
    if not token_ids:
        raise ValueError("the prompt must have at least one token")
    run = _Runner(weights, torch.device(device), dtype, len(token_ids))
    h = run.embed(token_ids)
    for i in range(layer):
        h = run.layer(h, i)
    q, k, v = run.qkv(h, layer)
    return LayerQKV(layer, tuple(token_ids), q.contiguous(), k.contiguous(), v.contiguous(), cfg.head_dim ** -0.5)


@torch.inference_mode()
def last_token_logits(weights: LoadedWeights, token_ids: list[int], device: str | torch.device = "cpu",
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole forward pass with this runner (for tests: it must agree with the engine's model)."""
    cfg = weights.config
    run = _Runner(weights, torch.device(device), dtype, len(token_ids))
    h = run.embed(token_ids)
    for i in range(cfg.num_layers):
        h = run.layer(h, i)
    h = _rmsnorm(h, run.w("model.norm.weight"), cfg.rms_norm_eps)
    return F.linear(h[-1:], run.w("model.embed_tokens.weight")).float()[0]
