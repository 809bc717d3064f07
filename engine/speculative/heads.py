"""The trained draft networks: Medusa heads, the EAGLE layer and the small draft model's layers.

All three read the target's *tied* embedding matrix (never copied, never trained) and are small
enough to commit as fp16 safetensors under `engine/assets/spec_heads/`. The same modules serve the
training scripts (`training/`, batched, causal) and the engine (a few rows at a time, with a KV
prefix and an explicit tree mask), so what was trained is exactly what drafts.

- `MedusaHeads`: K residual blocks h + SiLU(W h + b) on the target's final-normed hidden state at
  position t; head k's output through the tied LM head predicts the token at t + 2 + k (the
  target's own LM head already predicts t + 1). Zero-initialised W: every head starts as a copy of
  the LM head (Medusa-1's recipe).
- `EagleLayer`: fc(concat(feature_t, embed(token_{t+1}))) -> one Llama decoder layer -> RMSNorm ->
  predicted feature_{t+1}; the tied LM head turns it into a distribution over token_{t+2}. (Our
  features are the target's *final-normed* hidden states, so the layer ends in a norm started from
  the target's final norm: predictions have the right scale from the first step.) Drafting feeds the
  predicted feature back in, so one layer drafts a whole tree autoregressively.
- `DecoderLayer`: a Llama decoder layer (RMSNorm, GQA attention with RoPE, SwiGLU) with Hugging
  Face parameter names, so it can start as a copy of one of the target's layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model import rope_cache
from kernels.rope_store_ref import rotate_half_rope

HEADS_DIR = Path(__file__).resolve().parent.parent / "assets" / "spec_heads"


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, T, D/2]: the target's RoPE, broadcast over the heads."""
    return rotate_half_rope(x, cos[:, None], sin[:, None])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, d
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(h, self.hq * d, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, h]; cos/sin [B, T, D/2] for the rows' positions; past: K, V [B, Hkv, S0, D]
        (already rotated); mask [B or 1, T, S0 + T] bool (True = may attend) or None = causal.
        Returns (out, K, V) with K/V of these T rows only."""
        b, t, _ = x.shape
        y = self.input_layernorm(x)
        q = _rope(self.q_proj(y).view(b, t, self.hq, self.d).transpose(1, 2), cos, sin)
        k = _rope(self.k_proj(y).view(b, t, self.hkv, self.d).transpose(1, 2), cos, sin)
        v = self.v_proj(y).view(b, t, self.hkv, self.d).transpose(1, 2)
        keys, vals = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if mask is None and past is None:
            a = F.scaled_dot_product_attention(q, keys, vals, is_causal=True, enable_gqa=True)
        else:
            a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask[:, None], enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, self.hq * self.d))
        y = self.post_attention_layernorm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return x, k, v

    def load_from_target(self, state_dict: dict[str, torch.Tensor], layer: int) -> None:
        prefix = f"model.layers.{layer}."
        self.load_state_dict({k[len(prefix):].replace("self_attn.", "").replace("mlp.", ""): v.float()
                              for k, v in state_dict.items() if k.startswith(prefix)})


class RopeTables:
    """cos/sin lookup for positions (shared by every head of a process)."""

    def __init__(self, cfg: ModelConfig, max_len: int, device: torch.device | str = "cpu") -> None:
        self.cos, self.sin = rope_cache(cfg, max_len, torch.device(device))

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]


class MedusaHeads(nn.Module):
    def __init__(self, cfg: ModelConfig, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.zeros(num_heads, cfg.hidden_size, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_heads, cfg.hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., h] -> [K, ..., h]: each head's feature, to go through the tied LM head."""
        z = torch.einsum("...i,koi->k...o", hidden, self.weight) + self.bias.view(
            self.num_heads, *([1] * (hidden.dim() - 1)), -1)
        return hidden.unsqueeze(0) + F.silu(z)


class EagleLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
        self.layer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None, past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """features, token_embeds [B, T, h] (row i: feature at i, embedding of the token at i + 1)
        -> (predicted feature at i + 1, K, V) for these rows."""
        x = self.fc(torch.cat([features, token_embeds], dim=-1))
        out, k, v = self.layer(x, cos, sin, mask, past)
        return self.norm(out), k, v


class DraftLayers(nn.Module):
    """The small draft model minus its (shared, frozen) embeddings: a few decoder layers + final norm."""

    def __init__(self, cfg: ModelConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x, _, _ = layer(x, cos, sin)
        return self.norm(x)

    def engine_state_dict(self, embed: torch.Tensor) -> dict[str, torch.Tensor]:
        """Hugging Face-named weights the engine's `LlamaModel` loads (embeddings: the target's)."""
        sd = {"model.embed_tokens.weight": embed, "model.norm.weight": self.norm.weight.detach().float()}
        for i, layer in enumerate(self.layers):
            for name, t in layer.state_dict().items():
                group = "self_attn." if name[0] in "qkvo" else ("mlp." if name[0] in "gud" else "")
                sd[f"model.layers.{i}.{group}{name}"] = t.detach().float()
        return sd


# ---- files -------------------------------------------------------------------------------------------

def save_head(module: nn.Module, name: str, meta: dict, directory: Path = HEADS_DIR) -> Path:
    """fp16 safetensors + the metadata (architecture knobs) the loader needs."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.safetensors"
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"inferscope": json.dumps(meta)})
    return path


def head_path(name: str, directory: Path = HEADS_DIR) -> Path:
    return directory / f"{name}.safetensors"


def head_available(name: str, directory: Path = HEADS_DIR) -> bool:
    return head_path(name, directory).exists()


def load_head(name: str, cfg: ModelConfig, directory: Path = HEADS_DIR) -> tuple[nn.Module, dict]:
    """The module in fp32 (eval mode) and its metadata; FileNotFoundError names the training script."""
    from safetensors import safe_open

    path = head_path(name, directory)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: train it with `python -m training.train_{name}`")
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["inferscope"])
        tensors = {k: f.get_tensor(k).float() for k in f.keys()}
    if name == "medusa":
        module: nn.Module = MedusaHeads(cfg, int(meta["num_heads"]))
    elif name == "eagle":
        module = EagleLayer(cfg)
    elif name == "draft_model":
        module = DraftLayers(cfg, int(meta["num_layers"]))
    else:
        raise ValueError(f"unknown head {name!r}")
    try:
        module.load_state_dict(tensors)
    except RuntimeError as e:  # shape mismatch: another architecture than the one the heads learned
        raise ValueError(f"{path.name} was trained for {meta.get('model', 'SmolLM2-135M')} (hidden 576, "
                         f"vocab 49152); this model has hidden {cfg.hidden_size}, vocab {cfg.vocab_size}") from e
    return module.eval().requires_grad_(False), meta
