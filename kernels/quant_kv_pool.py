"""A paged KV pool stored in a low-bit format: the tensors a fused decode kernel reads.

The codes and scales are exactly what `engine.kv_compression.formats.encode` makes of each (page, KV
head, slot) row of D numbers, so the kernel reads the same bytes the KV compression lab measures
quality on. Layout is head-major like the engine's CUDA pool (engine/kv_pool.py): codes
[pages, Hkv, page_size, D x bits / 8], scales (and zero points) [pages, Hkv, page_size, groups].

Formats the kernel takes: "bf16" (the uncompressed baseline, no scales), "fp8" and "int8" (one
scale per row), "int4" (asymmetric, a scale and a zero point per 32 numbers, two codes a byte).
KIVI's per-channel keys are scaled over groups of tokens instead of per row; no kernel reads them here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_compression.formats import Encoded, KVFormat, decode, encode, get_format

KERNEL_FORMATS = ("bf16", "fp8", "int8", "int4")


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedPool:
    """Keys and values of every page, encoded in `fmt` (see the module docstring for the layout)."""

    fmt: KVFormat
    k: Encoded
    v: Encoded

    @property
    def page_size(self) -> int:
        return self.k.codes.shape[2]

    @property
    def kv_heads(self) -> int:
        return self.k.codes.shape[1]

    @property
    def head_dim(self) -> int:
        return self.k.codes.shape[3] * self.k.codes.element_size() * 8 // self.fmt.bits

    def bytes_per_token(self) -> int:
        """Bytes one token's K and V rows take in this pool (codes, scales and zero points), all heads."""
        per_row = sum(t.shape[-1] * t.element_size() for t in self.k.tensors())
        return 2 * self.kv_heads * per_row

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V as the engine's pool shape [pages, page_size, Hkv, D] (head-major views), in `dtype`."""
        return tuple(decode(e, self.fmt, dtype).transpose(1, 2) for e in (self.k, self.v))  # type: ignore[return-value]


def quantize_pool(k_cache: torch.Tensor, v_cache: torch.Tensor, fmt_name: str) -> QuantizedPool:
    """Encode a pool of the engine's shape [pages, page_size, Hkv, D] (any strides) in `fmt_name`."""
    if fmt_name not in KERNEL_FORMATS:
        raise ValueError(f"the fused decode kernel reads {', '.join(KERNEL_FORMATS)}, not {fmt_name!r}")
    fmt = get_format(fmt_name)
    if fmt.kind == "int" and not fmt.symmetric and fmt.group != 32:
        raise ValueError("the kernel's INT4 path expects groups of 32 numbers")

    def enc(cache: torch.Tensor) -> Encoded:
        # Scales come back [pages, Hkv, page_size, groups] (one group for FP8 and INT8).
        return encode(cache.transpose(1, 2).contiguous(), fmt)  # rows [pages, Hkv, page_size, D]

    return QuantizedPool(fmt, enc(k_cache), enc(v_cache))
