"""Write this step's keys and values into the paged pool by slot mapping (torch reference)."""
from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides (a head-major view too)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, slot = block_id * block_size + offset; < 0 = skip (padding)
) -> None:
    nb, bs, h, d = k_cache.shape
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    slots = slot_mapping.long()
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        # One flat row copy per slot (index_copy_ on a view of the same memory).
        k_cache.view(nb * bs, h, d).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(nb * bs, h, d).index_copy_(0, slots, v.to(v_cache.dtype))
        return
    # A strided (head-major) pool: index by (block, offset), which writes through the view.
    blocks, offsets = slots // bs, slots % bs
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)
