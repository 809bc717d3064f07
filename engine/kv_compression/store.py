"""Where one layer's keys or values live for one sequence: the stored tensors of a `KVFormat`.

`TokenStore` keeps one stored row per (head, token), so single tokens can be dropped (eviction) by
gathering rows. `ChannelGroupStore` is KIVI's key cache: full groups of `token_group` tokens quantized
per channel, and the newest tokens (fewer than a group) in full precision until their group fills.
"""
from __future__ import annotations

import torch

from engine.kv_compression.formats import (SCALE_DTYPE, Encoded, KVFormat, decode, decode_per_channel, encode,
                                           encode_per_channel)


def _gather_tokens(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [Hkv, n, ...] -> [Hkv, m, ...] keeping the tokens `idx` [Hkv, m] of each head."""
    if t.dtype == torch.float8_e4m3fn:  # torch.gather has no float8 kernel: move the same bytes as uint8
        return _gather_tokens(t.view(torch.uint8), idx).view(t.dtype)
    shaped = idx.reshape(*idx.shape, *([1] * (t.dim() - 2))).expand(*idx.shape, *t.shape[2:])
    return torch.gather(t, 1, shaped)


class TokenStore:
    """Rows [Hkv, n, D] stored per token in `fmt`; appends and evictions touch only the stored tensors."""

    def __init__(self, fmt: KVFormat, compute_dtype: torch.dtype) -> None:
        self.fmt, self.compute_dtype = fmt, compute_dtype
        self.stored: Encoded | None = None

    def __len__(self) -> int:
        return 0 if self.stored is None else self.stored.codes.shape[1]

    def append(self, x: torch.Tensor) -> None:
        enc = encode(x, self.fmt)
        if self.stored is None:
            self.stored = enc
            return
        old = self.stored
        self.stored = Encoded(*(torch.cat([a, b], dim=1) if a is not None else None
                                for a, b in ((old.codes, enc.codes), (old.scale, enc.scale), (old.zero, enc.zero))))

    def read(self) -> torch.Tensor:
        assert self.stored is not None
        return decode(self.stored, self.fmt, self.compute_dtype)

    def copy(self) -> "TokenStore":
        """A store of its own over the same tensors (never written in place, so sharing them is safe)."""
        twin = TokenStore(self.fmt, self.compute_dtype)
        twin.stored = self.stored
        return twin

    def keep(self, idx: torch.Tensor) -> None:
        """Keep tokens `idx` [Hkv, m] of each head (in that order), drop the rest."""
        s = self.stored
        assert s is not None
        self.stored = Encoded(*(None if t is None else _gather_tokens(t, idx) for t in (s.codes, s.scale, s.zero)))

    @property
    def nbytes(self) -> int:
        return 0 if self.stored is None else self.stored.nbytes


class ChannelGroupStore:
    """KIVI keys: per-channel scales over groups of `fmt.token_group` tokens, the rest in full precision."""

    def __init__(self, fmt: KVFormat, compute_dtype: torch.dtype) -> None:
        self.fmt, self.compute_dtype = fmt, compute_dtype
        self.groups: list[Encoded] = []
        # [Hkv, r, D], r < token_group: the newest keys, held in fp16 as KIVI does until their group fills
        self.residual: torch.Tensor | None = None
        self._read_groups: torch.Tensor | None = None  # decoded groups, cached: they never change once stored

    def __len__(self) -> int:
        return len(self.groups) * self.fmt.token_group + (0 if self.residual is None else self.residual.shape[1])

    def append(self, x: torch.Tensor) -> None:
        x = x.to(SCALE_DTYPE)
        pending = x if self.residual is None else torch.cat([self.residual, x], dim=1)
        g = self.fmt.token_group
        while pending.shape[1] >= g:
            self.groups.append(encode_per_channel(pending[:, :g], self.fmt))
            self._read_groups = None
            pending = pending[:, g:]
        self.residual = pending if pending.shape[1] else None

    def read(self) -> torch.Tensor:
        parts = []
        if self.groups:
            if self._read_groups is None or self._read_groups.shape[1] != len(self.groups) * self.fmt.token_group:
                self._read_groups = torch.cat([decode_per_channel(e, self.fmt, self.compute_dtype)
                                               for e in self.groups], dim=1)
            parts.append(self._read_groups)
        if self.residual is not None:
            parts.append(self.residual.to(self.compute_dtype))
        return torch.cat(parts, dim=1)

    def copy(self) -> "ChannelGroupStore":
        """A store of its own over the same tensors (never written in place, so sharing them is safe)."""
        twin = ChannelGroupStore(self.fmt, self.compute_dtype)
        twin.groups, twin.residual, twin._read_groups = list(self.groups), self.residual, self._read_groups
        return twin

    def keep(self, idx: torch.Tensor) -> None:
        raise ValueError("per-channel key scales cover whole groups of tokens, so this cache cannot drop single "
                         "tokens: KIVI formats do not combine with eviction here")

    @property
    def nbytes(self) -> int:
        res = 0 if self.residual is None else self.residual.numel() * self.residual.element_size()
        return sum(e.nbytes for e in self.groups) + res


def make_store(fmt: KVFormat, compute_dtype: torch.dtype, keys: bool) -> TokenStore | ChannelGroupStore:
    if keys and fmt.key_axis == "channel":
        return ChannelGroupStore(fmt, compute_dtype)
    return TokenStore(fmt, compute_dtype)
