"""KV-cache arithmetic: 2 x layers x KV heads x head dim x bytes per token, and what follows."""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True, slots=True)
class AttentionVariant:
    name: str  # "MHA", "GQA", "MQA"
    kv_heads: int
    note: str


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_element: int, kv_heads: int | None = None) -> int:
    """K and V, every layer, every KV head, one head_dim vector each."""
    heads = cfg.num_kv_heads if kv_heads is None else kv_heads
    return 2 * cfg.num_layers * heads * cfg.head_dim * bytes_per_element


def attention_variants(cfg: ModelConfig) -> list[AttentionVariant]:
    """Same query heads, different numbers of KV heads: one per query head (MHA), the model's
    actual grouping (GQA), or one shared by all (MQA)."""
    group = cfg.num_heads // cfg.num_kv_heads
    return [
        AttentionVariant("MHA", cfg.num_heads, f"{cfg.num_heads} KV heads, one per query head"),
        AttentionVariant("GQA", cfg.num_kv_heads, f"{cfg.num_kv_heads} KV heads, {group} query heads each (actual)"),
        AttentionVariant("MQA", 1, f"1 KV head shared by all {cfg.num_heads} query heads"),
    ]


def kv_cache_bytes(cfg: ModelConfig, bytes_per_element: int, tokens: int, batch: int = 1,
                   kv_heads: int | None = None) -> int:
    return kv_bytes_per_token(cfg, bytes_per_element, kv_heads) * tokens * batch


def weights_bytes(cfg: ModelConfig, bytes_per_element: int) -> int:
    """Parameter bytes (tied embeddings counted once), for 'KV vs weights' comparisons."""
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return (cfg.vocab_size * h + L * per_layer + h) * bytes_per_element


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
