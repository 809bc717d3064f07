"""A plain, unpaged forward pass over a state dict, layer by layer.

Quantization works one decoder layer at a time (GPTQ and AWQ both do): the calibration tokens' hidden
states enter layer i, its linears are quantized from the inputs they really see, and the layer's output
is computed again with the quantized weights before it feeds layer i + 1. That needs the layer as a
function of a hidden-state batch, which the paged engine (built around a KV pool and a scheduler) is not.
The same function gives every position's logits for the measurements. `tests/test_weight_quant.py`
checks them against Hugging Face's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model import apply_rope, rope_cache
from kernels.precision import at_least_fp32
from kernels.rmsnorm_ref import rmsnorm_ref

# The four inputs a decoder layer's linears read, and the weights that read each (weights that share an
# input are quantized together: AWQ picks one scale per input channel for all of them).
LINEAR_INPUTS: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}

# Called with (input name, the input [tokens, features]) before the linears that read it.
InputHook = Callable[[str, torch.Tensor], None]
# Called with (layer, input name, the input [tokens, features]) right before the linears that read it; what it
# returns is what they multiply (activation quantization fakes a low-precision input this way). None: unchanged.
ActTransform = Callable[[int, str, torch.Tensor], torch.Tensor]


def weight_key(layer: int, linear: str) -> str:
    return f"model.layers.{layer}.{linear}.weight"


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return rmsnorm_ref(x, w, eps)[0]  # the engine's own reference RMSNorm


@dataclass(slots=True)
class LayerKV:
    """One layer's keys and values so far ([B, tokens, kv heads, head dim], after RoPE), for decoding a token at
    a time (`past` of `layer_forward`). Empty until the prompt has run."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


def layer_forward(cfg: ModelConfig, sd: dict[str, torch.Tensor], layer: int, h: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, hook: InputHook | None = None,
                  act: ActTransform | None = None, past: LayerKV | None = None) -> torch.Tensor:
    """One decoder layer on h [B, T, hidden] (B sequences of T tokens, each causal from position 0). `hook` sees
    each linear input as computed; `act` may replace it before the matmuls (after the hook). `past`: the layer's
    cache, read and extended; h is then the tokens after it (all of a prompt while it is empty, one after)."""
    B, T, _ = h.shape
    start = 0 if past is None else past.tokens
    if start and T != 1:
        raise ValueError("after the prompt, decode one token at a time")
    p = f"model.layers.{layer}."
    W = lambda linear: sd[weight_key(layer, linear)]  # noqa: E731
    x = _rmsnorm(h, sd[p + "input_layernorm.weight"], cfg.rms_norm_eps).reshape(B * T, -1)
    if hook:
        hook("qkv", x)
    if act:
        x = act(layer, "qkv", x)
    hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = (x @ W("self_attn.q_proj").T).reshape(B * T, hq, d)
    k = (x @ W("self_attn.k_proj").T).reshape(B * T, hk, d)
    v = (x @ W("self_attn.v_proj").T).reshape(B, T, hk, d)
    c, s = cos[start:start + T].repeat(B, 1), sin[start:start + T].repeat(B, 1)
    q = apply_rope(q, c, s).reshape(B, T, hq, d)
    k = apply_rope(k, c, s).reshape(B, T, hk, d)
    if past is not None:
        if start:
            k, v = torch.cat([past.k, k], dim=1), torch.cat([past.v, v], dim=1)
        past.k, past.v = k, v
    # One new token sees every cached one: no mask then.
    attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=start == 0, enable_gqa=True, scale=d ** -0.5)
    a = attn.transpose(1, 2).reshape(B * T, hq * d)
    if hook:
        hook("o", a)
    if act:
        a = act(layer, "o", a)
    h = h + (a @ W("self_attn.o_proj").T).reshape(B, T, -1)
    x = _rmsnorm(h, sd[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps).reshape(B * T, -1)
    if hook:
        hook("gate_up", x)
    if act:
        x = act(layer, "gate_up", x)
    y = F.silu(x @ W("mlp.gate_proj").T) * (x @ W("mlp.up_proj").T)
    if hook:
        hook("down", y)
    if act:
        y = act(layer, "down", y)
    return h + (y @ W("mlp.down_proj").T).reshape(B, T, -1)


def embed(sd: dict[str, torch.Tensor], token_ids: torch.Tensor) -> torch.Tensor:
    return sd["model.embed_tokens.weight"][token_ids]


def rope_tables(cfg: ModelConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_cache(cfg, max_len, torch.device("cpu"))


@torch.inference_mode()
def sequence_logits(cfg: ModelConfig, sd: dict[str, torch.Tensor], token_ids: list[int],
                    act: ActTransform | None = None, last_only: bool = False) -> torch.Tensor:
    """Next-token logits [T, vocab] at every position of one sequence (fp32); `act` as in `layer_forward`.
    `last_only`: the last position's alone ([1, vocab]), all greedy decoding needs: the LM head (49,152 rows)
    is a fifth of a short sequence's work."""
    cos, sin = rope_tables(cfg, len(token_ids))
    h = _last_hidden(cfg, sd, token_ids, cos, sin, act)
    return final_logits(cfg, sd, h[-1:] if last_only else h)


def _last_hidden(cfg: ModelConfig, sd: dict[str, torch.Tensor], token_ids: list[int], cos: torch.Tensor,
                 sin: torch.Tensor, act: ActTransform | None, pasts: list[LayerKV] | None = None) -> torch.Tensor:
    """One sequence's tokens through every layer: the last layer's output [T, hidden]. With `pasts` (one cache
    per layer), `token_ids` are the tokens after what the caches hold, and the caches are extended."""
    h = at_least_fp32(embed(sd, torch.tensor([token_ids])))
    for i in range(cfg.num_layers):
        h = layer_forward(cfg, sd, i, h, cos, sin, act=act, past=None if pasts is None else pasts[i])
    return h[0]


def final_logits(cfg: ModelConfig, sd: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """The last hidden states [T, hidden] through the final norm and the LM head: logits [T, vocab], fp32 (fp64
    for fp64 weights)."""
    h = _rmsnorm(h, sd["model.norm.weight"], cfg.rms_norm_eps)
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])  # tied embeddings
    return at_least_fp32(h @ head.T)


@torch.inference_mode()
def greedy_answer(cfg: ModelConfig, sd: dict[str, torch.Tensor], prompt: list[int], max_new_tokens: int,
                  eos: set[int], act: ActTransform | None = None, whole_sequence: bool = False) -> list[int]:
    """The greedy answer, stopping before an end-of-turn token. With a KV cache per layer (the prompt in one
    pass, then one token per pass): the same logits as running the whole sequence each step, to float rounding,
    whenever `act` treats each token's input on its own, and ~20x less work for a few dozen tokens.
    `whole_sequence`: no cache, the whole sequence again each step (`sequence_logits`), for an `act` that takes
    a statistic over the sequence (no lab's transform does; the tests use it as the cache's oracle)."""
    cos, sin = rope_tables(cfg, len(prompt) + max_new_tokens)
    pasts = [LayerKV() for _ in range(cfg.num_layers)]
    seq, new, out = list(prompt), list(prompt), []
    for _ in range(max_new_tokens):
        if whole_sequence:
            logits = sequence_logits(cfg, sd, seq, act, last_only=True)
        else:
            logits = final_logits(cfg, sd, _last_hidden(cfg, sd, new, cos, sin, act, pasts)[-1:])
        t = int(logits[-1].argmax())
        if t in eos:
            break
        out.append(t)
        seq.append(t)
        new = [t]
    return out
