"""FlashAttention-2's forward algorithm re-enacted tile by tile in torch, instrumented for teaching.

This is NOT the kernel the engine runs on a GPU (that is `kernels.prefill_attention_triton`); it is
the same algorithm written as a Python loop over (query tile, key tile) pairs so every tile's fate
and the online-softmax state can be recorded:

- the tile schedule: each pair is computed in full (every key visible to every query of the tile),
  computed with the causal mask (the diagonal band), or skipped (every key lies in the future of
  every query of the tile, so causal attention never reads it);
- for one chosen query row (and head): after every key tile, the running max m, the running sum l
  (relative to m) and the rescale factor exp(m_old - m_new) applied to l and to the accumulator.

The N x N score matrix is never materialised: only a [heads, BLOCK_M, BLOCK_N] tile exists at a
time, plus m and l per query row. All heads are processed together (vectorised), tiles in a loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

TileStatus = Literal["full", "diagonal", "skipped"]


@dataclass(frozen=True, slots=True)
class TilePair:
    q_tile: int
    k_tile: int
    q_start: int  # query rows [q_start, q_end)
    q_end: int
    k_start: int  # key columns [k_start, k_end)
    k_end: int
    status: TileStatus

    @property
    def scores(self) -> int:
        """Score entries this pair computes (0 when skipped)."""
        return 0 if self.status == "skipped" else (self.q_end - self.q_start) * (self.k_end - self.k_start)


@dataclass(frozen=True, slots=True)
class RowStep:
    """The traced row's online-softmax state after one key tile streamed past its query tile."""

    k_tile: int
    k_start: int
    k_end: int
    status: TileStatus  # of the (q tile, k tile) pair: "full" or "diagonal"
    visible_keys: int  # keys of this tile the row may see (< tile width past its own position)
    tile_max: float  # the row's largest visible score in this tile (-inf if none visible)
    m: float  # running max after this tile
    l: float  # running sum of exp(score - m) after this tile
    rescale: float  # exp(m_before - m_after): what l and the accumulator were multiplied by (1 = no change)


@dataclass(frozen=True, slots=True)
class FlashTrace:
    seq_len: int
    block_m: int
    block_n: int
    tiles: tuple[TilePair, ...]
    out: torch.Tensor  # [N, Hq, D], same dtype as q
    m: torch.Tensor  # [Hq, N] final running max (fp32): the O(N) state FA2 keeps besides the output
    l: torch.Tensor  # [Hq, N] final running sum (fp32)
    row: int | None  # the traced query row, if any
    head: int
    row_steps: tuple[RowStep, ...]

    def count(self, status: TileStatus) -> int:
        return sum(1 for t in self.tiles if t.status == status)

    @property
    def num_q_tiles(self) -> int:
        return math.ceil(self.seq_len / self.block_m)

    @property
    def num_k_tiles(self) -> int:
        return math.ceil(self.seq_len / self.block_n)


def classify(q_start: int, q_end: int, k_start: int, k_end: int) -> TileStatus:
    """Causal fate of one tile pair: query i sees key j iff j <= i."""
    if k_start > q_end - 1:
        return "skipped"  # even the last query of the tile is before the first key
    if k_end - 1 <= q_start:
        return "full"  # even the first query sees the last key
    return "diagonal"


def tile_schedule(seq_len: int, block_m: int, block_n: int, causal: bool = True) -> list[TilePair]:
    """Every (query tile, key tile) pair, row-major, with its causal status."""
    if seq_len < 0 or block_m < 1 or block_n < 1:
        raise ValueError(f"need seq_len >= 0 and tile sizes >= 1, got {seq_len}, {block_m}, {block_n}")
    pairs = []
    for i, qs in enumerate(range(0, seq_len, block_m)):
        qe = min(qs + block_m, seq_len)
        for j, ks in enumerate(range(0, seq_len, block_n)):
            ke = min(ks + block_n, seq_len)
            status = classify(qs, qe, ks, ke) if causal else "full"
            pairs.append(TilePair(i, j, qs, qe, ks, ke, status))
    return pairs


def flash_attention_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                          block_m: int = 64, block_n: int = 64, causal: bool = True,
                          trace_row: int | None = None, trace_head: int = 0) -> FlashTrace:
    """Causal attention of one sequence, FA2 style. q [N, Hq, D]; k, v [N, Hkv, D] (GQA: query head
    h reads KV head h // (Hq // Hkv)). Softmax state in fp32 whatever the input dtype."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape[0] != n or v.shape[0] != n or hq % hkv:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if trace_row is not None and not 0 <= trace_row < n:
        raise ValueError(f"trace_row must be in [0, {n}), got {trace_row}")
    if not 0 <= trace_head < hq:
        raise ValueError(f"trace_head must be in [0, {hq}), got {trace_head}")
    group = hq // hkv
    qh = q.transpose(0, 1).float()  # [Hq, N, D]
    kh = k.transpose(0, 1).float().repeat_interleave(group, dim=0)  # [Hq, N, D]
    vh = v.transpose(0, 1).float().repeat_interleave(group, dim=0)
    out = torch.empty(hq, n, d, dtype=torch.float32, device=q.device)
    m_all = torch.empty(hq, n, dtype=torch.float32, device=q.device)
    l_all = torch.empty(hq, n, dtype=torch.float32, device=q.device)
    tiles = tile_schedule(n, block_m, block_n, causal)
    n_k = math.ceil(n / block_n) if n else 0
    steps: list[RowStep] = []

    for qi, qs in enumerate(range(0, n, block_m)):
        qe = min(qs + block_m, n)
        q_tile = qh[:, qs:qe]  # resident for the whole inner loop (SRAM/registers in the real kernel)
        m = torch.full((hq, qe - qs), float("-inf"), device=q.device)
        l = torch.zeros(hq, qe - qs, device=q.device)
        acc = torch.zeros(hq, qe - qs, d, device=q.device)
        tracing = trace_row is not None and qs <= trace_row < qe
        for pair in tiles[qi * n_k:(qi + 1) * n_k]:
            if pair.status == "skipped":
                continue
            ks, ke = pair.k_start, pair.k_end
            s = torch.matmul(q_tile, kh[:, ks:ke].transpose(1, 2)) * scale  # [Hq, Bm, Bn], never more
            if pair.status == "diagonal":
                rows = torch.arange(qs, qe, device=q.device)[:, None]
                cols = torch.arange(ks, ke, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new)  # rescale of everything accumulated so far
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + torch.matmul(p, vh[:, ks:ke])
            if tracing:
                r = trace_row - qs
                row_s = s[trace_head, r]
                visible = int(torch.isfinite(row_s).sum())
                first = not steps
                steps.append(RowStep(pair.k_tile, ks, ke, pair.status, visible,
                                     float(row_s.max()) if visible else float("-inf"),
                                     float(m_new[trace_head, r]), float(l[trace_head, r]),
                                     1.0 if first else float(alpha[trace_head, r])))
            m = m_new
        out[:, qs:qe] = acc / l[..., None]
        m_all[:, qs:qe] = m
        l_all[:, qs:qe] = l
    return FlashTrace(n, block_m, block_n, tuple(tiles), out.transpose(0, 1).to(q.dtype), m_all, l_all,
                      trace_row, trace_head, tuple(steps))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scale) V with the full [Hq, N, N] probability matrix materialised (the memory
    traffic FlashAttention avoids). Returns (out [N, Hq, D], probabilities [Hq, N, N])."""
    n, hq, _ = q.shape
    group = hq // k.shape[1]
    qh = q.transpose(0, 1)
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
    s = torch.matmul(qh, kh.transpose(1, 2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vh).transpose(0, 1), p


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    ref64 = ref.double()
    return float((out.double() - ref64).norm() / ref64.norm().clamp_min(1e-300))
