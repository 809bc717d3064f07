"""Decode attention over a low-bit KV pool (torch reference of kernels/paged_decode_quant_triton.py):
dequantize every page into the query's dtype, then the engine's paged attention reference."""
from __future__ import annotations

import torch

from kernels.paged_attention_ref import paged_attention_ref
from kernels.quant_kv_pool import QuantizedPool


def paged_decode_quant_ref(q: torch.Tensor, pool: QuantizedPool, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           max_seq_len: int, scale: float) -> torch.Tensor:
    """q [B, Hq, D], one query row per sequence; same contract as the Triton kernel."""
    k_cache, v_cache = pool.dequantized(q.dtype)
    starts = torch.arange(q.shape[0] + 1, device=q.device, dtype=torch.int32)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, starts, 1, max_seq_len, scale)
