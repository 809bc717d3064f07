"""Attention that reads keys and values through block tables (torch reference).

Serves decode tokens and prefill chunks that continue a cached prefix. Sequence b has
q_len = query_start_loc[b+1] - query_start_loc[b] new query rows; its context (already including
those rows' keys, stored beforehand) is seq_lens[b] tokens long, so query row j sits at absolute
position seq_lens[b] - q_len + j and sees keys 0..that position.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.paged_decode_ref import batched_decode, decode_plan, gather_pages


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """[num_blocks, block_size, H, D] -> [length, H, D] for one sequence."""
    n_blocks = -(-length // cache.shape[1])
    return gather_pages(cache, block_table[:n_blocks].long(), 1)[0, :length]


def paged_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [B + 1] int32
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    tree_masks: tuple[torch.Tensor | None, ...] = (),
) -> torch.Tensor:
    """tree_masks: per sequence None (causal) or [q_len, q_len] bool: which of this step's rows each
    row may see (a draft tree: itself and its ancestors); the cached context stays fully visible."""
    out = torch.empty_like(q)
    hq, hkv = q.shape[1], k_cache.shape[2]
    group = hq // hkv
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    done: set[int] = set()
    plan = decode_plan(block_tables, lens, starts, k_cache.shape[1])
    if plan is not None:
        batched_decode(q, k_cache, v_cache, plan, scale, out)
        done = set(plan.rows)
    for b in range(len(lens)):
        s, e = starts[b], starts[b + 1]
        if b in done or e == s:
            continue
        length, q_len = lens[b], e - s
        kb = _gather_context(k_cache, block_tables[b], length).transpose(0, 1)
        vb = _gather_context(v_cache, block_tables[b], length).transpose(0, 1)
        qb = q[s:e].transpose(0, 1)
        # Row j may see keys up to position length - q_len + j.
        pos_q = torch.arange(length - q_len, length, device=q.device)[:, None]
        pos_k = torch.arange(length, device=q.device)[None, :]
        mask = pos_k <= pos_q
        if tree_masks and tree_masks[b] is not None:
            mask[:, length - q_len:] = tree_masks[b]
        ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale,
                                            enable_gqa=group > 1)
        out[s:e] = ob.transpose(0, 1)
    return out
