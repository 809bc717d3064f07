"""How a KV cache stores its numbers: full precision, half precision, FP8, or integers with scales.

A format turns keys or values [Hkv, n, D] into the tensors a cache would really keep (codes, scales,
zero points) and back. The bytes are real: INT4 codes are packed two to a byte, INT2 four to a byte,
and the scales a format needs are counted, so "bytes per token" on the page is what these tensors take.

Two ways to group numbers under one scale (the choice KIVI, arXiv 2402.02750, is about):
- per token: each (head, token) row of D numbers (or each 32-number group of it) gets its own scale.
  Values quantize well this way.
- per channel: each of the D channels gets a scale over a group of tokens. Keys have a few channels
  much larger than the rest (RoPE pairs that rotate slowly); a per-token scale is set by those outliers
  and crushes every other channel, while a per-channel scale gives each channel its own range. The
  newest tokens wait in full precision until a whole group of them can be quantized.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

FormatKind = Literal["float", "fp8", "int"]
ScaleAxis = Literal["token", "channel"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_DTYPE = torch.float16  # scales and zero points are stored in fp16, as KIVI and most INT-KV kernels do
TINY_SCALE = 1e-6  # a constant row still needs a nonzero scale


@dataclass(frozen=True, slots=True)
class KVFormat:
    """One way of storing K and V. `group`: numbers along the head dim sharing one scale (per-token
    scaling); `key_axis="channel"`: keys are scaled per channel over `token_group` tokens instead (KIVI)."""

    name: str
    label: str
    kind: FormatKind
    bits: int
    group: int = 64
    symmetric: bool = True
    key_axis: ScaleAxis = "token"
    token_group: int = 32
    dtype: torch.dtype | None = None  # the storage dtype of a float format

    @property
    def compressed(self) -> bool:
        return self.kind != "float"

    @property
    def scale_bytes_per_group(self) -> int:
        """An FP16 scale, and an FP16 zero point when asymmetric."""
        return SCALE_DTYPE.itemsize * (1 if self.symmetric else 2)

    def scale_bytes_per_row(self, head_dim: int) -> int:
        """Scale (and zero point) bytes that one token-row of one head carries under per-token scaling."""
        if self.kind == "float":
            return 0
        groups = 1 if self.kind == "fp8" else head_dim // self.group  # `encode` scales FP8 by whole rows
        return self.scale_bytes_per_group * groups

    def bytes_per_token(self, layers: int, kv_heads: int, head_dim: int) -> float:
        """K and V bytes per token, scales included, as the formula a student would write (per-channel
        key scales are spread over their token group)."""
        rows = 2 * layers * kv_heads
        payload = rows * head_dim * self.bits / 8
        if self.kind == "float":
            return payload
        per_token_rows = rows // 2 if self.key_axis == "channel" else rows
        scales = per_token_rows * self.scale_bytes_per_row(head_dim)
        if self.key_axis == "channel":
            scales += layers * kv_heads * head_dim * self.scale_bytes_per_group / self.token_group
        return payload + scales


FORMATS: dict[str, KVFormat] = {f.name: f for f in (
    KVFormat("fp32", "FP32", "float", 32, dtype=torch.float32),
    KVFormat("bf16", "BF16", "float", 16, dtype=torch.bfloat16),
    KVFormat("fp8", "FP8 e4m3 (scale per token)", "fp8", 8),
    KVFormat("int8", "INT8 (scale per token)", "int", 8),
    KVFormat("int4", "INT4 (groups of 32)", "int", 4, group=32, symmetric=False),
    KVFormat("int2", "INT2 (groups of 32)", "int", 2, group=32, symmetric=False),
    KVFormat("int2-kivi", "INT2 KIVI (keys per channel)", "int", 2, group=32, symmetric=False, key_axis="channel"),
    KVFormat("int4-kivi", "INT4 KIVI (keys per channel)", "int", 4, group=32, symmetric=False, key_axis="channel"),
)}


def get_format(name: str) -> KVFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown KV format {name!r}; choose one of {', '.join(FORMATS)}") from None


@dataclass(frozen=True, slots=True, eq=False)
class Encoded:
    """Stored numbers for rows [Hkv, n, D]: `codes` (packed along the last axis for INT4/INT2), and for
    scaled formats `scale` (and `zero` for asymmetric ones) with one entry per group."""

    codes: torch.Tensor
    scale: torch.Tensor | None = None
    zero: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero) if t is not None)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.codes, self.scale, self.zero) if t is not None)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes < 2**bits along the last axis -> 8/bits codes per byte."""
    if bits == 8:
        return codes
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, device=codes.device, dtype=torch.uint8)
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    return (grouped << shifts).sum(dim=-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return packed
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
    mask = (1 << bits) - 1
    out = (packed[..., None] >> shifts) & mask
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * (8 // bits))


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // group, group)


def _fp16_scale(s: torch.Tensor) -> torch.Tensor:
    """The scale as stored (fp16), so encoding divides by exactly what decoding multiplies by."""
    return s.clamp_min(TINY_SCALE).to(SCALE_DTYPE)


def encode(x: torch.Tensor, fmt: KVFormat) -> Encoded:
    """Rows [..., D] with one scale per `fmt.group` numbers along the last axis (per-token scaling)."""
    if fmt.kind == "float":
        return Encoded(x.to(fmt.dtype))
    xf = x.float()
    if fmt.kind == "fp8":
        scale = _fp16_scale(xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX)
        return Encoded((xf / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale)
    g = _grouped(xf, fmt.group)
    levels = (1 << fmt.bits) - 1
    if fmt.symmetric:  # int8: [-127, 127] stored as int8
        half = levels // 2
        scale = _fp16_scale(g.abs().amax(dim=-1, keepdim=True) / half)
        q = torch.round(g / scale.float()).clamp(-half, half).to(torch.int8)
        return Encoded(q.reshape(x.shape), scale.squeeze(-1))
    lo, hi = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
    scale = _fp16_scale((hi - lo) / levels)
    zero = lo.to(SCALE_DTYPE)
    q = torch.round((g - zero.float()) / scale.float()).clamp(0, levels).to(torch.uint8)
    return Encoded(pack(q.reshape(x.shape), fmt.bits), scale.squeeze(-1), zero.squeeze(-1))


def decode(enc: Encoded, fmt: KVFormat, dtype: torch.dtype) -> torch.Tensor:
    """The numbers attention reads, in the compute dtype."""
    if fmt.kind == "float":
        return enc.codes.to(dtype)
    if fmt.kind == "fp8":
        return (enc.codes.float() * enc.scale.float()).to(dtype)
    codes = enc.codes if fmt.symmetric else unpack(enc.codes, fmt.bits)
    g = _grouped(codes.float(), fmt.group)
    out = g * enc.scale.float()[..., None]
    if enc.zero is not None:
        out = out + enc.zero.float()[..., None]
    return out.reshape(codes.shape).to(dtype)


def encode_per_channel(x: torch.Tensor, fmt: KVFormat) -> Encoded:
    """Rows [Hkv, n, D] scaled per channel over the n tokens (asymmetric): scale and zero [Hkv, 1, D]."""
    xf = x.float()
    levels = (1 << fmt.bits) - 1
    lo, hi = xf.amin(dim=1, keepdim=True), xf.amax(dim=1, keepdim=True)
    scale = _fp16_scale((hi - lo) / levels)
    zero = lo.to(SCALE_DTYPE)
    q = torch.round((xf - zero.float()) / scale.float()).clamp(0, levels).to(torch.uint8)
    return Encoded(pack(q, fmt.bits), scale, zero)


def decode_per_channel(enc: Encoded, fmt: KVFormat, dtype: torch.dtype) -> torch.Tensor:
    codes = unpack(enc.codes, fmt.bits).float()
    return (codes * enc.scale.float() + enc.zero.float()).to(dtype)


def round_trip(x: torch.Tensor, fmt: KVFormat, axis: ScaleAxis = "token") -> torch.Tensor:
    """x [Hkv, n, D] stored and read back. `axis="channel"`: per channel over each full group of
    `fmt.token_group` tokens, the last partial group kept in fp16 (as `ChannelGroupStore` holds it)."""
    if axis == "channel" and fmt.kind == "int":
        g = fmt.token_group
        full = x.shape[1] // g * g
        parts = [decode_per_channel(encode_per_channel(x[:, i:i + g], fmt), fmt, x.dtype) for i in range(0, full, g)]
        if full < x.shape[1]:
            parts.append(x[:, full:].to(SCALE_DTYPE).to(x.dtype))
        return torch.cat(parts, dim=1)
    return decode(encode(x, fmt), fmt, x.dtype)
