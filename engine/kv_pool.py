"""The real KV tensor pool that block tables index: one [num_blocks, block_size, Hkv, D] tensor
for K and one for V per layer, carved out of a single allocation.

Every layer's K and V are handed out as [num_blocks, block_size, Hkv, D] tensors, but how a block is
laid out in memory depends on the device:
- token-major on the CPU ([block_size, Hkv, D] per block, the views are contiguous): the torch
  reference gathers whole token rows (kernels/paged_decode_ref.py), twice as fast as from the
  head-major layout (a 16-row decode gather of ~300 tokens: 42 vs 82 us in bf16);
- head-major on CUDA ([Hkv, block_size, D] per block, the views are strided): one KV head's keys of a
  page are 2 KB contiguous instead of 128-byte rows 384 bytes apart. The Triton paged-decode kernel
  (with 128-key tiles) streams them 2-3.5 % faster than a token-major pool with its best tiles at
  B = 64, 8k-32k, and no slower at 1k-4k or other batch sizes (bench/NOTES_kernels.md "v11").
Everything reads and writes the pool through these views' strides, never by reshaping them.
"""
from __future__ import annotations

import torch

from engine.block_manager import BlockCopy
from engine.config import ModelConfig


class KVPool:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, head_major: bool) -> None:
        """`head_major`: the layout above; EngineConfig.kv_head_major picks it per device."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self.head_major = head_major
        inner = ((cfg.num_kv_heads, block_size) if self.head_major else (block_size, cfg.num_kv_heads))
        # [layers, 2, blocks, *inner, head_dim]; random, not zeros, so a read of an unwritten slot
        # shows up as wrong output instead of hiding.
        g = torch.Generator(device="cpu").manual_seed(1234)
        self.data = torch.randn((cfg.num_layers, 2, num_blocks, *inner, cfg.head_dim),
                                generator=g, dtype=torch.float32).to(dtype=dtype, device=device)

    def _slots_view(self) -> torch.Tensor:
        """`data` as [layers, 2, blocks, block_size, Hkv, D] whatever the layout (strided when head-major)."""
        return self.data.transpose(3, 4) if self.head_major else self.data

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's K and V, each [num_blocks, block_size, Hkv, D] (a strided view when head-major)."""
        view = self._slots_view()
        return view[i, 0], view[i, 1]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Copy-on-write: duplicate whole blocks across every layer, K and V."""
        if not copies:
            return
        src = torch.tensor([c.src for c in copies], device=self.data.device)
        dst = torch.tensor([c.dst for c in copies], device=self.data.device)
        self.data[:, :, dst] = self.data[:, :, src]

    def blocks_shape(self, num_blocks: int) -> tuple[int, ...]:
        """The shape `read_blocks` gives for that many blocks: [layers, 2, num_blocks, *block shape]."""
        return (*self.data.shape[:2], num_blocks, *self.data.shape[3:])

    def read_blocks(self, blocks: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of whole blocks, every layer, K and V, in this pool's layout (what a KV handoff ships;
        `write_blocks` puts it into another pool). `out`: a contiguous tensor of `blocks_shape` to gather
        into (a shared-memory segment), so the blocks are copied once."""
        idx = torch.tensor(blocks, device=self.data.device)
        if out is None:
            return torch.index_select(self.data, 2, idx)
        return torch.index_select(self.data, 2, idx, out=out)

    def write_blocks(self, blocks: list[int], kv: torch.Tensor) -> None:
        """Fill `blocks` from `read_blocks` output of a pool with the same layout, dtype and block size."""
        if tuple(kv.shape) != self.blocks_shape(len(blocks)):
            raise ValueError(f"KV blocks of shape {tuple(kv.shape)} do not fit this pool "
                             f"(wants {self.blocks_shape(len(blocks))})")
        self.data[:, :, torch.tensor(blocks, device=self.data.device)] = kv.to(self.data.device, self.data.dtype)

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Move single token slots (every layer, K and V): a tree round keeps its accepted path by
        compacting the path's KV into the slots right after the context."""
        if not src:
            return
        bs, view = self.block_size, self._slots_view()
        s = torch.tensor(src, device=self.data.device)
        d = torch.tensor(dst, device=self.data.device)
        view[:, :, d // bs, d % bs] = view[:, :, s // bs, s % bs]  # writes through the view
