"""Our own Llama forward pass over a packed, unpadded batch reading and writing the paged KV pool.

RMSNorm -> fused QKV -> RoPE -> store K/V by slot mapping -> attention (varlen FlashAttention for
fresh prefills, paged attention for decodes and continuing chunks) -> O proj -> RMSNorm -> SwiGLU.
Tied embeddings: the LM head is the embedding matrix. Every stage runs through `Kernels` or
`Kernels.timer`, so a step's record says where the time went.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.forward_batch import ForwardBatch
from engine.kv_pool import KVPool
from engine.state_memo import StateDictMemo
from kernels.cpu_linear import pack_linear_weight
from kernels.device_gate import GpuBusy
from kernels.dispatch import Kernels
from kernels.rope_store_ref import rotate_half_rope


def rope_cache(cfg: ModelConfig, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return freqs.cos().float().to(device), freqs.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D/2]. Hugging Face's rotate-half layout (first half, second half)."""
    return rotate_half_rope(x, cos[:, None, :], sin[:, None, :])


@dataclass(frozen=True, slots=True)
class PreparedWeights:
    """Weights on the engine's device and dtype, with the projections fused."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    layers: tuple[dict[str, torch.Tensor], ...]
    nbytes: int
    lm_head: torch.Tensor  # the embedding, or its packed copy for the CPU's oneDNN linear


# (state dict, device, dtype, packed) -> prepared weights. Every engine of a process (each page of each
# browser session, comparison runs) shares one copy instead of ~280 MB of fused fp32 each.
_PREPARED: StateDictMemo[PreparedWeights] = StateDictMemo()


def prepare_weights(cfg: ModelConfig, state_dict: dict[str, torch.Tensor], device: torch.device,
                    dtype: torch.dtype, packed: bool = False) -> PreparedWeights:
    """`packed`: the projections and the LM head in oneDNN's blocked layout, for the CPU's torch
    path (kernels/cpu_linear.py: 1.5 to 3x faster than MKL's sgemm at decode batch sizes)."""
    return _PREPARED.get(state_dict, lambda: _prepare(cfg, state_dict, device, dtype, packed), str(device), dtype,
                         packed)


def _prepare(cfg: ModelConfig, state_dict: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
             packed: bool) -> PreparedWeights:
    sd = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
    pack = pack_linear_weight if packed else (lambda w: w)
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        layers.append(dict(
            attn_norm=sd[p + "input_layernorm.weight"],
            # Fused projections: one matmul instead of three (QKV) and two (gate, up).
            qkv=pack(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).contiguous()),
            o=pack(sd[p + "self_attn.o_proj.weight"]),
            mlp_norm=sd[p + "post_attention_layernorm.weight"],
            gate_up=pack(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]).contiguous()),
            down=pack(sd[p + "mlp.down_proj.weight"]),
        ))
    embed = sd["model.embed_tokens.weight"]
    return PreparedWeights(embed, sd["model.norm.weight"], tuple(layers),
                           sum(t.numel() * t.element_size() for t in sd.values()), pack(embed))


def release_prepared(state_dict: dict[str, torch.Tensor]) -> None:
    """Forget the prepared copies of a state dict that will not run again (a quantized variant of the
    weights): the cache above would otherwise keep ~280 MB of each alive for the process's life."""
    _PREPARED.forget(state_dict)


class LlamaModel:
    def __init__(self, cfg: ModelConfig, state_dict: dict[str, torch.Tensor], kernels: Kernels,
                 device: torch.device, dtype: torch.dtype, max_len: int) -> None:
        self.cfg, self.kernels, self.device, self.dtype = cfg, kernels, device, dtype
        # Packed weights only where the torch path runs on the CPU (a Triton backend under the
        # interpreter reads the plain weights).
        packed = torch.device(device).type == "cpu" and kernels.backend == "torch"
        w = prepare_weights(cfg, state_dict, device, dtype, packed)
        self.embed, self.final_norm, self.layers, self.lm_head = w.embed, w.final_norm, w.layers, w.lm_head
        self.cos, self.sin = rope_cache(cfg, max_len, device)
        self.max_len = max_len
        self.scale = cfg.head_dim ** -0.5
        self.weight_bytes = w.nbytes
        self.piecewise = None  # a PiecewiseGraphRunner when the engine runs prefill steps as CUDA graphs
        # Multi-LoRA (engine/lora): the device's adapter slots, and during a pass the rows' slots [T]
        # (None: no row of this pass runs an adapter, and no LoRA kernel is launched).
        self.lora = None
        self._lora_rows: torch.Tensor | None = None

    # ---- pieces ------------------------------------------------------------------------------------
    def _linear(self, name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(name, x, w)

    def _adapted(self, group: str, layer: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y plus each row's LoRA update for this fused linear (rows without an adapter unchanged)."""
        if self._lora_rows is None:
            return y
        A, B = self.lora.group(layer, group)
        return self.kernels.lora(f"lora.{group}", y, x, A, B, self._lora_rows)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch,
                  pool: KVPool, out: torch.Tensor | None = None) -> torch.Tensor:
        """This step's K/V are already in the pool (`rope_store` wrote them). `out` [T, Hq, D]: where
        to write (the piecewise graphs' static buffer); both kernels of a mixed batch write their rows
        of one buffer instead of being concatenated (one launch and one copy less per layer)."""
        k_cache, v_cache = pool.layer(layer)
        K = self.kernels
        nf = batch.num_fresh_tokens
        if nf == q.shape[0]:
            return K.prefill_attention(q, k, v, batch.fresh_cu_seqlens, batch.fresh_max_len, self.scale,
                                       batch.fresh_lens, out=out)
        paged = K.tree_attention if batch.tree_masks else K.paged_attention
        extra = (batch.tree_masks,) if batch.tree_masks else ()
        if nf > 0 and out is None:
            out = torch.empty_like(q)
        # A decode-only step plans the paged kernel for max_len, as the decode CUDA graphs do
        # (engine/cuda_graphs.py): the Triton kernel divides each context by the plan's split count,
        # so one plan keeps the greedy tokens bitwise the same with graphs on and off.
        max_seq_len = max(self.max_len, batch.max_seq_len) if batch.max_query_len == 1 else batch.max_seq_len
        paged_out = paged(
            q[nf:], k_cache, v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc,
            batch.max_query_len, max_seq_len, self.scale, batch.q_lens, batch.ctx_lens, *extra,
            out=None if out is None else out[nf:])
        if nf == 0:
            return paged_out
        K.prefill_attention(q[:nf], k[:nf], v[:nf], batch.fresh_cu_seqlens, batch.fresh_max_len, self.scale,
                            batch.fresh_lens, out=out[:nf])
        return out

    # ---- the pass ----------------------------------------------------------------------------------
    def hidden_states(self, batch: ForwardBatch, pool: KVPool, num_layers: int | None = None) -> torch.Tensor:
        """Run every layer (or only the first `num_layers`: the early-exit drafter); returns the
        final-normed hidden state of every row [T, hidden].

        Fused where launches cost more than arithmetic (batch-1 decode is ~10 kernels a layer, not
        ~30): the residual add rides in the next RMSNorm, RoPE writes K/V straight into the pool,
        SiLU and the gating multiply are one pass."""
        self._lora_rows = batch.lora_slots if self.lora is not None else None
        if self.piecewise is not None and self._lora_rows is None and self.piecewise.usable(batch, num_layers):
            try:
                return self.piecewise.hidden_states(batch)
            except GpuBusy:  # its graphs could not be captured (nothing ran): this step runs eagerly below
                pass
        K = self.kernels
        n = batch.num_tokens
        with K.timer.timed("embedding", "torch", 0, n * self.cfg.hidden_size * self.embed.element_size()):
            h = self.embed[batch.input_ids]  # the sublayer output still to be added to the stream
        residual = None  # the residual stream before adding h
        for i in range(len(self.layers[:num_layers])):
            q, k, v, residual = self.pre_attention(i, h, residual, batch.positions, batch.slot_mapping, pool)
            attn = self.attention(q, k, v, i, batch, pool)
            h, residual = self.post_attention(i, attn, residual)
        return self.final_hidden(h, residual)

    # The three pieces of the pass around attention (engine/piecewise_graphs.py replays them as CUDA
    # graphs for prefill steps, with attention run eagerly in between).
    def pre_attention(self, i: int, h: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                      slot_mapping: torch.Tensor, pool: KVPool):
        """RMSNorm (+ the pending residual add), fused QKV, RoPE and the K/V store: (q, k, v, residual)."""
        cfg, K, L = self.cfg, self.kernels, self.layers[i]
        x, residual = K.rmsnorm(h, L["attn_norm"], cfg.rms_norm_eps, residual)
        if residual is None:  # layer 0: the stream starts as the embedding
            residual = h
        qkv = self._adapted("qkv", i, x, self._linear("linear.qkv", x, L["qkv"]))
        k_cache, v_cache = pool.layer(i)
        q, k, v = K.rope_store(qkv, positions, self.cos, self.sin, k_cache, v_cache, slot_mapping,
                               cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        return q, k, v, residual

    def post_attention(self, i: int, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """O projection, RMSNorm with the residual add, SwiGLU MLP: (sublayer output, residual)."""
        cfg, K, L = self.cfg, self.kernels, self.layers[i]
        a = attn.reshape(attn.shape[0], cfg.num_heads * cfg.head_dim)
        o = self._adapted("o", i, a, self._linear("linear.o", a, L["o"]))
        x, residual = K.rmsnorm(o, L["mlp_norm"], cfg.rms_norm_eps, residual)
        act = K.silu_mul(self._adapted("gate_up", i, x, self._linear("linear.gate_up", x, L["gate_up"])))
        return self._adapted("down", i, act, self._linear("linear.down", act, L["down"])), residual

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out, _ = self.kernels.rmsnorm(h, self.final_norm, self.cfg.rms_norm_eps, residual)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._linear("lm_head", hidden, self.lm_head).float()

    def forward(self, batch: ForwardBatch, pool: KVPool, num_layers: int | None = None) -> torch.Tensor:
        """Logits [S, vocab] for the rows in `batch.logits_indices` only (the LM head is 1/4 of the
        model's FLOPs per token, so prompt rows that sample nothing skip it)."""
        return self.forward_with_hidden(batch, pool, num_layers)[0]

    def forward_with_hidden(self, batch: ForwardBatch, pool: KVPool,
                            num_layers: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits of `logits_indices`, final-normed hidden state of every row): Medusa heads and
        the EAGLE layer draft from the target's hidden states."""
        hidden = self.hidden_states(batch, pool, num_layers)
        return self.logits(hidden[batch.logits_indices]), hidden
