"""RoPE on q and k of the fused QKV projection, then K/V into the paged pool (torch reference).

Contract (the Triton kernel matches it):
- `qkv` [T, (Hq + 2*Hkv) * D]: q heads, then k heads, then v heads, as `LlamaModel`'s fused QKV.
- rotate-half RoPE (Hugging Face layout: first half / second half of each head) with
  cos/sin = table[positions], computed in fp32 and cast back to qkv's dtype, the same arithmetic
  as every other RoPE here (`rotate_half_rope` below);
- rotated k and (unrotated) v are written to `k_cache`/`v_cache` [num_blocks, block_size, Hkv, D]
  at `slot_mapping[t]` (< 0: padding row, not stored), as `store_kv_ref`;
- returns (q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D] a view of `qkv`). `qkv` itself is not
  modified. q and k are new: here views of one rotated [T, Hq + Hkv, D] tensor, from the Triton
  kernel two contiguous tensors; the values are the same.
"""
from __future__ import annotations

import torch

from kernels.kv_store_ref import store_kv_ref
from kernels.precision import at_least_fp32


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The one RoPE arithmetic of the project (the model, this reference, the draft heads): rotate-half
    layout (first half / second half of the last dim), in fp32 (fp64 for fp64 x), cast back to x's dtype. cos/sin
    [..., D/2] must broadcast against x[..., :D/2]. Lives here, a leaf module, because
    `engine.model` imports the kernel dispatch."""
    half = x.shape[-1] // 2
    x1, x2 = at_least_fp32(x[..., :half]), at_least_fp32(x[..., half:])
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rope_store_ref(
    qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D]
    positions: torch.Tensor,  # [T] int
    cos: torch.Tensor,  # [max_len, D/2] fp32
    sin: torch.Tensor,  # [max_len, D/2] fp32
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int, < 0 = skip
    hq: int,
    hkv: int,
    d: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = qkv.shape[0]
    assert qkv.shape[1] == (hq + 2 * hkv) * d
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]  # over the heads
    # q and k heads are adjacent in qkv: one rotation for both (half the small ops of rotating each).
    qk = rotate_half_rope(qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d), c, s)
    q, k = qk[:, :hq], qk[:, hq:]
    v = qkv[:, (hq + hkv) * d:].view(n, hkv, d)
    store_kv_ref(k, v, k_cache, v_cache, slot_mapping)
    return q, k, v
