"""Tensor parallelism, Megatron style, on the real model.

Per layer, each rank holds
- its query heads' and its KV heads' rows of W_q, W_k, W_v (column-parallel: no communication in),
- the matching columns of W_o (row-parallel: its output is a partial sum),
- its slice of the MLP's gate and up rows and the matching columns of down (again column then row),
- the norms, replicated;
and a slice of the vocabulary: its rows of the embedding (a token outside the slice looks up zeros, so an
all-reduce assembles the embedding) and of the tied LM head (an all-gather assembles the logits).

So a forward pass communicates 2 all-reduces per layer (after attention and after the MLP), one for the
embedding and one all-gather for the logits: 62 collectives per step for 30 layers, whatever the batch. Each
rank's KV cache holds only its KV heads: the cache, like the weights, is divided by the degree.

The per-rank functions take one rank's shard and inputs and return its partial result, so the same code
runs the ranks in turn in this process (`TensorParallelModel`) or one per process over NCCL (bench/parallel.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model import apply_rope, rope_cache
from engine.parallel.collectives import Group, InProcessGroup
from engine.parallel.plan import check_degrees
from kernels.rmsnorm_ref import rmsnorm_ref


@dataclass(frozen=True, slots=True, eq=False)
class RankShard:
    rank: int
    tp: int
    heads: range  # query heads
    kv_heads: range
    channels: range  # MLP intermediate channels
    vocab: range
    embed: torch.Tensor  # [vocab slice, hidden], also the tied LM head's slice
    final_norm: torch.Tensor
    layers: tuple[dict[str, torch.Tensor], ...]  # attn_norm, q, k, v, o, mlp_norm, gate, up, down

    @property
    def nbytes(self) -> int:
        tensors = [self.embed, self.final_norm] + [t for layer in self.layers for t in layer.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def _split(n: int, tp: int, rank: int) -> range:
    per = n // tp
    return range(rank * per, (rank + 1) * per)


def shard_weights(cfg: ModelConfig, sd: dict[str, torch.Tensor], tp: int, device: str = "cpu",
                  dtype: torch.dtype = torch.float32, ranks: Iterable[int] | None = None) -> list[RankShard]:
    """One shard per rank of `ranks` (default all; a process of a distributed group builds only its own).
    Copies: each rank's tensors are its own, as on separate GPUs."""
    check_degrees(cfg, tp, 1)
    d = cfg.head_dim
    cast = lambda t: t.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    shards = []
    for r in (range(tp) if ranks is None else ranks):
        heads, kv, ch = _split(cfg.num_heads, tp, r), _split(cfg.num_kv_heads, tp, r), _split(cfg.intermediate_size, tp, r)
        qrows, kvrows = slice(heads.start * d, heads.stop * d), slice(kv.start * d, kv.stop * d)
        cols = slice(ch.start, ch.stop)
        layers = []
        for i in range(cfg.num_layers):
            w = lambda name: sd[f"model.layers.{i}.{name}.weight"]  # noqa: E731
            layers.append(dict(
                attn_norm=cast(w("input_layernorm")), mlp_norm=cast(w("post_attention_layernorm")),
                q=cast(w("self_attn.q_proj")[qrows]), k=cast(w("self_attn.k_proj")[kvrows]),
                v=cast(w("self_attn.v_proj")[kvrows]), o=cast(w("self_attn.o_proj")[:, qrows]),
                gate=cast(w("mlp.gate_proj")[cols]), up=cast(w("mlp.up_proj")[cols]),
                down=cast(w("mlp.down_proj")[:, cols])))
        vocab = _split(cfg.vocab_size, tp, r)
        shards.append(RankShard(r, tp, heads, kv, ch, vocab, cast(sd["model.embed_tokens.weight"][vocab.start:vocab.stop]),
                                cast(sd["model.norm.weight"]), tuple(layers)))
    return shards


@dataclass(slots=True, eq=False)
class RankCache:
    """One rank's KV cache: its KV heads only, [B, kv heads of the rank, max_len, head_dim] per layer."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def new_rank_cache(cfg: ModelConfig, shard: RankShard, batch: int, max_len: int, layers: range | None = None) -> RankCache:
    layers = layers if layers is not None else range(cfg.num_layers)
    shape = (batch, len(shard.kv_heads), max_len, cfg.head_dim)
    z = lambda: torch.zeros(shape, dtype=shard.embed.dtype, device=shard.embed.device)  # noqa: E731
    return RankCache([z() if i in layers else None for i in range(cfg.num_layers)],
                     [z() if i in layers else None for i in range(cfg.num_layers)])


# --------------------------------------------------------------------------------- per-rank functions


def embed_partial(shard: RankShard, ids: torch.Tensor) -> torch.Tensor:
    """[B, T] ids -> [B, T, hidden]: this rank's vocabulary rows, zeros for the others' tokens."""
    local = ids - shard.vocab.start
    mine = (local >= 0) & (local < len(shard.vocab))
    return shard.embed[local.clamp(0, len(shard.vocab) - 1)] * mine[..., None]


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return rmsnorm_ref(x, w, eps)[0]


def attention_partial(cfg: ModelConfig, shard: RankShard, layer: int, x: torch.Tensor, cache: RankCache,
                      start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: the normed hidden states [B, T, hidden] at positions start.. start+T. Returns this rank's partial
    O projection [B, T, hidden]; its K and V go into its cache."""
    B, T, _ = x.shape
    w, d = shard.layers[layer], cfg.head_dim
    hq, hk = len(shard.heads), len(shard.kv_heads)
    c, s = cos[start:start + T].repeat(B, 1), sin[start:start + T].repeat(B, 1)
    q = apply_rope((x @ w["q"].T).reshape(B * T, hq, d), c, s).reshape(B, T, hq, d).transpose(1, 2)
    k = apply_rope((x @ w["k"].T).reshape(B * T, hk, d), c, s).reshape(B, T, hk, d).transpose(1, 2)
    v = (x @ w["v"].T).reshape(B, T, hk, d).transpose(1, 2)
    cache.k[layer][:, :, start:start + T] = k
    cache.v[layer][:, :, start:start + T] = v
    keys, values = cache.k[layer][:, :, :start + T], cache.v[layer][:, :, :start + T]
    if T == 1:
        mask = None  # one new token sees everything cached
    else:  # query t (at position start + t) sees keys 0 .. start + t
        mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True, scale=d ** -0.5)
    return a.transpose(1, 2).reshape(B, T, hq * d) @ w["o"].T


def mlp_partial(shard: RankShard, layer: int, x: torch.Tensor) -> torch.Tensor:
    w = shard.layers[layer]
    return (F.silu(x @ w["gate"].T) * (x @ w["up"].T)) @ w["down"].T


def logits_partial(cfg: ModelConfig, shard: RankShard, h: torch.Tensor) -> torch.Tensor:
    """h: the last hidden states [B, hidden] (before the final norm) -> this rank's vocabulary slice of logits."""
    return rmsnorm(h, shard.final_norm, cfg.rms_norm_eps) @ shard.embed.T


# --------------------------------------------------------------------------------- the ranks in turn


@dataclass(frozen=True, slots=True)
class SegmentTime:
    """One stretch of computation between collectives: each rank's measured seconds."""

    site: str  # "embed", "attn.3", "mlp.3", "logits"
    rank_seconds: tuple[float, ...]


@dataclass(slots=True)
class Trace:
    segments: list[SegmentTime] = field(default_factory=list)


class TensorParallelModel:
    """The model as `tp` ranks taking turns in this process, each rank's compute timed separately.

    On separate GPUs the ranks would compute at once, so a forward pass takes, per segment, the slowest rank's
    time plus the collective that ends it (`critical_seconds`); here they add up.
    """

    def __init__(self, cfg: ModelConfig, sd: dict[str, torch.Tensor], tp: int, max_len: int,
                 group: Group | None = None, ranks: Iterable[int] | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        """`group` and `ranks`: by default all `tp` ranks here and an in-process group summing their partials; a
        process of a distributed group passes its own rank and a `DistributedGroup` (engine/parallel/distributed.py).
        `device`, `dtype`: where the shards live (a GPU process: its GPU, bf16)."""
        self.cfg, self.tp, self.max_len = cfg, tp, max_len
        self.device = torch.device(device)
        self.ranks = tuple(range(tp) if ranks is None else ranks)
        self.shards = shard_weights(cfg, sd, tp, device, dtype, ranks=self.ranks)  # aligned with self.ranks
        self.group = group or InProcessGroup(tp)
        self.cos, self.sin = rope_cache(cfg, max_len, self.device)
        self.trace = Trace()

    def new_caches(self, batch: int, layers: range | None = None) -> list[RankCache]:
        return [new_rank_cache(self.cfg, s, batch, self.max_len, layers) for s in self.shards]

    def _ranks(self, site: str, fn: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
        """fn(i) for each rank held here (i indexes self.shards and the caches), each timed."""
        outs, secs = [], []
        for r in range(len(self.shards)):
            t0 = time.perf_counter()
            outs.append(fn(r))
            secs.append(time.perf_counter() - t0)
        self.trace.segments.append(SegmentTime(site, tuple(secs)))
        return outs

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self._ranks("embed", lambda r: embed_partial(self.shards[r], ids)), "embed")

    @torch.inference_mode()
    def layers(self, h: torch.Tensor, start: int, caches: list[RankCache], layers: range) -> torch.Tensor:
        """h [B, T, hidden] through `layers` (a pipeline stage, or all of them)."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        for i in layers:
            sh = self.shards
            x = rmsnorm(h, sh[0].layers[i]["attn_norm"], eps)  # replicated: every rank computes the same
            parts = self._ranks(f"attn.{i}", lambda r: attention_partial(cfg, sh[r], i, x, caches[r], start,
                                                                            self.cos, self.sin))
            h = h + self.group.all_reduce(parts, f"attn.{i}")
            x = rmsnorm(h, sh[0].layers[i]["mlp_norm"], eps)
            h = h + self.group.all_reduce(self._ranks(f"mlp.{i}", lambda r: mlp_partial(sh[r], i, x)), f"mlp.{i}")
        return h

    @torch.inference_mode()
    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        parts = self._ranks("logits", lambda r: logits_partial(self.cfg, self.shards[r], h_last))
        return self.group.all_gather(parts, "logits")

    def forward(self, ids: torch.Tensor, start: int, caches: list[RankCache]) -> torch.Tensor:
        """ids [B, T] at positions start.. -> the last position's logits [B, vocab]."""
        h = self.layers(self.embed(ids), start, caches, range(self.cfg.num_layers))
        return self.logits(h[:, -1])
