"""Write this step's keys and values into the paged pool by slot mapping (torch reference)."""
from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, slot = block_id * block_size + offset; < 0 = skip (padding)
) -> None:
    nb, bs, h, d = k_cache.shape
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping.long(), k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping.long(), v.to(v_cache.dtype))
