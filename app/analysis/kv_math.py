"""KV-cache arithmetic: 2 x layers x KV heads x head dim x bytes per token, and what follows."""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True, slots=True)
class AttentionVariant:
    name: str  # "MHA", "GQA", "MQA", "MLA"
    kv_heads: int | None  # None for MLA: one latent shared by every head, no K and V heads in the cache
    numbers_per_layer: int  # what one token costs in the cache, per layer
    note: str

    @property
    def short(self) -> str:
        """The axis label's second line."""
        if self.kv_heads is None:
            return f"latent of {self.numbers_per_layer}"
        return f"{self.kv_heads} KV head{'s' if self.kv_heads > 1 else ''}"


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_element: int, kv_heads: int | None = None) -> int:
    """K and V, every layer, every KV head, one head_dim vector each."""
    heads = cfg.num_kv_heads if kv_heads is None else kv_heads
    return 2 * cfg.num_layers * heads * cfg.head_dim * bytes_per_element


def mla_latent_dims(cfg: ModelConfig) -> tuple[int, int]:
    """(d_c, d_R) for a model of this shape at DeepSeek-V3's proportions: the latent 4 x head_dim (512 for its
    128-wide heads), the decoupled rotary key head_dim / 2 (64)."""
    return 4 * cfg.head_dim, cfg.head_dim // 2


def attention_variants(cfg: ModelConfig) -> list[AttentionVariant]:
    """Same query heads, different caches: a K and V head per query head (MHA), the model's actual grouping
    (GQA), one shared by all (MQA), or MLA's one latent vector plus a small rotary key, shared by all heads."""
    group = cfg.num_heads // cfg.num_kv_heads
    d_c, d_r = mla_latent_dims(cfg)
    per_head = 2 * cfg.head_dim
    return [
        AttentionVariant("MHA", cfg.num_heads, cfg.num_heads * per_head,
                         f"{cfg.num_heads} KV heads, one per query head"),
        AttentionVariant("GQA", cfg.num_kv_heads, cfg.num_kv_heads * per_head,
                         f"{cfg.num_kv_heads} KV heads, {group} query heads each (actual)"),
        AttentionVariant("MQA", 1, per_head, f"1 KV head shared by all {cfg.num_heads} query heads"),
        AttentionVariant("MLA", None, d_c + d_r, f"a {d_c}-number latent + a {d_r}-number rotary key "
                                                  "(DeepSeek-V3's proportions)"),
    ]


def variant_bytes_per_token(cfg: ModelConfig, v: AttentionVariant, bytes_per_element: int) -> int:
    return cfg.num_layers * v.numbers_per_layer * bytes_per_element


def kv_cache_bytes(cfg: ModelConfig, bytes_per_element: int, tokens: int, batch: int = 1,
                   kv_heads: int | None = None) -> int:
    return kv_bytes_per_token(cfg, bytes_per_element, kv_heads) * tokens * batch


@dataclass(frozen=True, slots=True)
class PublishedCache:
    """A released model's KV cache per token, from its published configuration (config.json)."""

    name: str
    kind: str  # "MHA", "GQA", "MLA"
    layers: int
    numbers_per_layer: int
    shape: str  # how the numbers come about, for the table

    def bytes_per_token(self, bytes_per_element: int) -> int:
        return self.layers * self.numbers_per_layer * bytes_per_element


PUBLISHED_CACHES: tuple[PublishedCache, ...] = (
    PublishedCache("Llama 2 7B", "MHA", 32, 2 * 32 * 128, "2 × 32 KV heads × 128"),
    PublishedCache("Llama 3.1 8B", "GQA", 32, 2 * 8 * 128, "2 × 8 KV heads × 128"),
    PublishedCache("Llama 3.1 70B", "GQA", 80, 2 * 8 * 128, "2 × 8 KV heads × 128"),
    PublishedCache("Llama 3.1 405B", "GQA", 126, 2 * 8 * 128, "2 × 8 KV heads × 128"),
    # 128 heads with 192-wide keys (128 + 64 rotary) and 128-wide values, had it cached K and V per head.
    PublishedCache("DeepSeek-V3 as if MHA", "MHA", 61, 128 * (192 + 128), "128 heads × (192 K + 128 V)"),
    PublishedCache("DeepSeek-V3 (MLA)", "MLA", 61, 512 + 64, "latent 512 + rotary key 64"),
)


def weights_bytes(cfg: ModelConfig, bytes_per_element: int) -> int:
    """Parameter bytes (tied embeddings counted once), for 'KV vs weights' comparisons."""
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return (cfg.vocab_size * h + L * per_layer + h) * bytes_per_element

