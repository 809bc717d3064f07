"""The real KV tensor pool that block tables index: one [num_blocks, block_size, Hkv, D] tensor
for K and one for V per layer, carved out of a single allocation."""
from __future__ import annotations

import torch

from engine.block_manager import BlockCopy
from engine.config import ModelConfig


class KVPool:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        # [layers, 2, blocks, block_size, kv_heads, head_dim]; random, not zeros, so a read of an
        # unwritten slot shows up as wrong output instead of hiding.
        g = torch.Generator(device="cpu").manual_seed(1234)
        self.data = torch.randn((cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim),
                                generator=g, dtype=torch.float32).to(dtype=dtype, device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

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

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Move single token slots (every layer, K and V): a tree round keeps its accepted path by
        compacting the path's KV into the slots right after the context."""
        if not src:
            return
        flat = self.data.view(*self.data.shape[:2], -1, *self.data.shape[4:])  # [L, 2, slots, H, D]
        s = torch.tensor(src, device=self.data.device)
        d = torch.tensor(dst, device=self.data.device)
        flat[:, :, d] = flat[:, :, s]
