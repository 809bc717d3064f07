"""Split-KV decoding (Flash-Decoding) re-enacted in torch, instrumented for teaching.

This is NOT the kernel the engine runs on a GPU (that is `kernels.paged_attention_triton`, whose
`_paged_attn_partial` and `_paged_attn_reduce` do the same two phases over paged K/V); it is the same
arithmetic written out so every split's partial result can be shown:

1. The context's keys are cut into BLOCK_N-key tiles and the tiles dealt to the splits, either as
   contiguous ranges (the Flash-Decoding write-up) or every S-th tile to split s (what the engine's
   decode kernel does, `INTERLEAVE_DECODE_SPLITS`). Asked for S splits, it runs as many as the engine's
   launcher would (`launched_splits`): none that would own no tile. Each split, one GPU program, runs the
   online softmax over its own tiles only and leaves an unnormalised partial: its max m_s, its sum
   l_s = sum exp(s - m_s) and its accumulator acc_s = sum exp(s - m_s) v.
2. A merge rescales each partial to the global max M = max_s m_s and divides once:
   out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s. That is exact: the result equals one pass
   over all keys up to float rounding.

One query row per head (a decode step's newest token sees every key), all heads at once; the per-split
numbers are kept for one chosen head. Natural-log units here; the kernel works in base 2 (scores
pre-multiplied by log2(e)), which changes m and l by constant factors and the output not at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

SplitLayout = Literal["interleaved", "contiguous"]


@dataclass(frozen=True, slots=True)
class SplitPartial:
    """What one split (one GPU program) leaves for the merge, for the traced head."""

    split: int
    tiles: tuple[int, ...]  # K tile indices this split streams, in order
    keys: int  # how many keys those tiles hold
    m: float  # the split's own max score
    l: float  # sum of exp(score - m) over its keys
    weight: float  # exp(m - M) * l / L: the share of the row's softmax mass that comes from this split


@dataclass(frozen=True, slots=True)
class SplitKVTrace:
    seq_len: int  # keys the decode row sees
    block_n: int
    splits: int  # the splits that run (programs per KV head), as the engine's launcher counts them
    asked: int  # the S asked for; more than `splits` when the tiles cannot fill every split
    layout: SplitLayout
    head: int
    scores: torch.Tensor  # [N] the traced head's scaled scores (fp32), for the chart
    owner: tuple[int, ...]  # split owning each K tile
    partials: tuple[SplitPartial, ...]
    m: float  # M = max_s m_s (the traced head)
    l: float  # L = sum_s exp(m_s - M) l_s
    merged: torch.Tensor  # [Hq, D] the merge's output, every head
    one_pass: torch.Tensor  # [Hq, D] softmax(q k^T) v over all keys at once, same dtype (fp32)

    @property
    def num_tiles(self) -> int:
        return len(self.owner)

    @property
    def max_abs_diff(self) -> float:
        """Largest |merged - one pass| over every head and dimension: float rounding, nothing more."""
        return float((self.merged - self.one_pass).abs().max())


def tile_owners(num_tiles: int, splits: int, layout: SplitLayout) -> tuple[int, ...]:
    """The split that streams each K tile. Contiguous: split s takes tiles [s * P, (s + 1) * P) with
    P = ceil(tiles / S), as the kernel sizes a prefill chunk's ranges; interleaved: tile t goes to t mod S."""
    if splits < 1:
        raise ValueError(f"splits must be at least 1, got {splits}")
    if layout == "interleaved":
        return tuple(t % splits for t in range(num_tiles))
    if layout == "contiguous":
        per = max(1, math.ceil(num_tiles / splits))
        return tuple(t // per for t in range(num_tiles))
    raise ValueError(f"layout must be 'interleaved' or 'contiguous', not {layout!r}")


def launched_splits(num_tiles: int, splits: int) -> int:
    """How many programs the engine's decode launcher starts when asked for `splits` over `num_tiles` K tiles.
    `plan` in kernels/paged_attention_triton.py gives each split ceil(tiles / S) whole tiles, then launches
    ceil(tiles / that) splits ("drop splits that would own nothing"): S = 8 over 2 tiles runs 2, over 10 tiles
    (2 each) 5. Its own floor of keys per split and its occupancy target are left out: S here is the reader's."""
    if splits < 1:
        raise ValueError(f"splits must be at least 1, got {splits}")
    if num_tiles < 1:
        return 1
    per = math.ceil(num_tiles / splits)
    return math.ceil(num_tiles / per)


def split_kv_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, splits: int, block_n: int,
                    layout: SplitLayout = "interleaved", head: int = 0) -> SplitKVTrace:
    """Attention of one query row per head over N keys, computed as partials of the splits the engine would
    launch when asked for `splits` (`launched_splits`), and merged.

    q: [Hq, D]; k, v: [N, Hkv, D] with Hq a multiple of Hkv (query head h reads KV head h // (Hq / Hkv)).
    Computed in fp32 whatever the inputs. Every split that runs owns at least one tile."""
    n, hkv, d = k.shape
    hq = q.shape[0]
    if n < 1:
        raise ValueError("the decode row needs at least one key")
    if hq % hkv or v.shape != k.shape or q.shape[1] != d:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if block_n < 1:
        raise ValueError(f"block_n must be at least 1, got {block_n}")
    group = hq // hkv
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)  # [N, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("hd,nhd->hn", qf, kf) * scale  # [Hq, N]
    num_tiles = math.ceil(n / block_n)
    asked, splits = splits, launched_splits(num_tiles, splits)
    owner = tile_owners(num_tiles, splits, layout)
    key_owner = torch.tensor(owner).repeat_interleave(block_n)[:n]

    ms, ls, accs = [], [], []
    for sp in range(splits):
        mine = key_owner == sp  # never empty: launched_splits leaves no split without a tile
        ss = s[:, mine]  # [Hq, n_s]
        m_s = ss.max(dim=1).values
        p = torch.exp(ss - m_s[:, None])
        ms.append(m_s)
        ls.append(p.sum(dim=1))
        accs.append(torch.einsum("hn,nhd->hd", p, vf[mine]))
    m_all = torch.stack(ms)  # [S, Hq]
    l_all = torch.stack(ls)
    acc_all = torch.stack(accs)  # [S, Hq, D]
    big_m = m_all.max(dim=0).values
    w = torch.exp(m_all - big_m)
    big_l = (w * l_all).sum(dim=0)
    merged = (w[:, :, None] * acc_all).sum(dim=0) / big_l[:, None]
    one_pass = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=1), vf)

    partials = []
    for sp in range(splits):
        tiles = tuple(t for t, o in enumerate(owner) if o == sp)
        keys = int((key_owner == sp).sum())
        partials.append(SplitPartial(
            split=sp, tiles=tiles, keys=keys, m=float(m_all[sp, head]), l=float(l_all[sp, head]),
            weight=float(w[sp, head] * l_all[sp, head] / big_l[head])))
    return SplitKVTrace(seq_len=n, block_n=block_n, splits=splits, asked=asked, layout=layout, head=head,
                        scores=s[head].clone(), owner=owner, partials=tuple(partials),
                        m=float(big_m[head]), l=float(big_l[head]), merged=merged, one_pass=one_pass)
