"""Causal attention over a packed, variable-length batch with no cached prefix (torch reference).

Sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1] of q, k and v. GQA: query head h reads KV head
h // (Hq // Hkv).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def flash_attention_varlen_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    max_seqlen: int,
    scale: float,
) -> torch.Tensor:
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    for b in range(len(bounds) - 1):
        s, e = bounds[b], bounds[b + 1]
        if e == s:
            continue
        qb = q[s:e].transpose(0, 1)  # [Hq, L, D]
        kb = k[s:e].transpose(0, 1)
        vb = v[s:e].transpose(0, 1)
        ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=group > 1)
        out[s:e] = ob.transpose(0, 1)
    return out
