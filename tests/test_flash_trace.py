"""The instrumented FlashAttention-2 re-enactment (kernels/flash_trace.py): exact against SDPA, a tile
schedule that covers the causal triangle exactly once, and an online-softmax trace that ends where
the whole-row softmax is."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernels.flash_trace import (classify, flash_attention_tiled, naive_attention, relative_error,
                                 tile_schedule)

torch.set_num_threads(1)


def _qkv(n: int, hq: int = 9, hkv: int = 3, d: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # Scores of a realistic spread (not all ~0), so the running max really moves.
    q = torch.randn(n, hq, d, generator=g) * 2
    k = torch.randn(n, hkv, d, generator=g) * 2
    v = torch.randn(n, hkv, d, generator=g)
    return q, k, v


def _sdpa(q, k, v, scale, causal=True):
    return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                          is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1]).transpose(0, 1)


@pytest.mark.parametrize("n", [1, 2, 17, 64, 100, 257])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64), (64, 64), (128, 32), (7, 5)])
def test_tiled_equals_sdpa(n: int, block_m: int, block_n: int) -> None:
    q, k, v = _qkv(n, seed=n)
    scale = 64 ** -0.5
    trace = flash_attention_tiled(q, k, v, scale, block_m, block_n)
    assert trace.out.shape == q.shape and trace.out.dtype == torch.float32
    assert relative_error(trace.out, _sdpa(q, k, v, scale)) < 1e-5


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (9, 3)])
def test_tiled_equals_sdpa_head_layouts(hq: int, hkv: int) -> None:
    q, k, v = _qkv(150, hq, hkv, 32, seed=hq)
    out = flash_attention_tiled(q, k, v, 0.2, 32, 16).out
    assert relative_error(out, _sdpa(q, k, v, 0.2)) < 1e-5


def test_non_causal_equals_sdpa() -> None:
    q, k, v = _qkv(90, seed=3)
    trace = flash_attention_tiled(q, k, v, 0.125, 16, 32, causal=False)
    assert all(t.status == "full" for t in trace.tiles)
    assert relative_error(trace.out, _sdpa(q, k, v, 0.125, causal=False)) < 1e-5


def test_naive_attention_matches_sdpa_and_materialises() -> None:
    q, k, v = _qkv(70, seed=4)
    out, p = naive_attention(q, k, v, 0.125)
    assert p.shape == (9, 70, 70)
    assert torch.allclose(p.sum(-1), torch.ones(9, 70), atol=1e-5)
    assert float(p.triu(1).abs().max()) == 0.0  # nothing attends to the future
    assert relative_error(out, _sdpa(q, k, v, 0.125)) < 1e-5


@pytest.mark.parametrize("n,block_m,block_n", [(1, 4, 4), (33, 8, 8), (100, 16, 32), (100, 32, 16), (129, 64, 7)])
def test_schedule_covers_the_causal_triangle_exactly_once(n: int, block_m: int, block_n: int) -> None:
    tiles = tile_schedule(n, block_m, block_n)
    assert len(tiles) == math.ceil(n / block_m) * math.ceil(n / block_n)
    cover = torch.zeros(n, n, dtype=torch.int64)
    for t in tiles:
        rows = torch.arange(t.q_start, t.q_end)[:, None]
        cols = torch.arange(t.k_start, t.k_end)[None, :]
        visible = cols <= rows
        if t.status == "skipped":
            assert not bool(visible.any()), t  # nothing visible is ever skipped
        else:
            cover[t.q_start:t.q_end, t.k_start:t.k_end] += 1
        if t.status == "full":
            assert bool(visible.all()), t  # a "full" tile needs no mask
        if t.status == "diagonal":
            assert bool(visible.any()) and not bool(visible.all()), t
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert bool((cover[causal] == 1).all())  # every visible (query, key) pair computed exactly once
    assert int(cover.max()) <= 1  # tiles never overlap


def test_classify_examples() -> None:
    assert classify(0, 16, 0, 16) == "diagonal"
    assert classify(16, 32, 0, 16) == "full"
    assert classify(0, 16, 16, 32) == "skipped"
    assert classify(5, 6, 5, 6) == "full"  # one query, one key: itself


@pytest.mark.parametrize("row", [0, 15, 16, 63, 99])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 8), (8, 32)])
def test_row_trace_ends_at_the_whole_row_softmax(row: int, block_m: int, block_n: int) -> None:
    n, head, scale = 100, 4, 64 ** -0.5
    q, k, v = _qkv(n, seed=row + 7)
    trace = flash_attention_tiled(q, k, v, scale, block_m, block_n, trace_row=row, trace_head=head)
    s = (q[row, head] @ k[: row + 1, head // 3].T) * scale  # the row's visible scores
    m, l = float(s.max()), float(torch.exp(s - s.max()).sum())
    steps = trace.row_steps
    qt = row // block_m
    assert [st.k_tile for st in steps] == [t.k_tile for t in trace.tiles if t.q_tile == qt and t.status != "skipped"]
    assert steps[-1].m == pytest.approx(m, rel=1e-6)
    assert steps[-1].l == pytest.approx(l, rel=1e-5)
    assert float(trace.m[head, row]) == pytest.approx(m, rel=1e-6)
    assert float(trace.l[head, row]) == pytest.approx(l, rel=1e-5)
    assert steps[0].rescale == 1.0
    for prev, cur in zip(steps, steps[1:]):
        assert cur.m >= prev.m  # the running max never falls
        assert 0 < cur.rescale <= 1
        assert (cur.rescale < 1) == (cur.m > prev.m)
        assert cur.rescale == pytest.approx(math.exp(prev.m - cur.m), rel=1e-5)
        # l after = rescale * l before + the tile's own contribution (>= 0)
        assert cur.l >= cur.rescale * prev.l - 1e-5
    assert sum(st.visible_keys for st in steps) == row + 1


def test_final_state_matches_every_row() -> None:
    n, scale = 77, 0.1
    q, k, v = _qkv(n, seed=11)
    trace = flash_attention_tiled(q, k, v, scale, 16, 8)
    kh = k.transpose(0, 1).repeat_interleave(3, dim=0)
    s = (q.transpose(0, 1) @ kh.transpose(1, 2)) * scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    m = s.amax(-1)
    assert torch.allclose(trace.m, m, rtol=1e-6, atol=1e-6)
    assert torch.allclose(trace.l, torch.exp(s - m[..., None]).sum(-1), rtol=1e-5)


def test_counts_and_bad_arguments() -> None:
    q, k, v = _qkv(64, seed=1)
    trace = flash_attention_tiled(q, k, v, 0.125, 16, 16, trace_row=63)
    assert (trace.count("full"), trace.count("diagonal"), trace.count("skipped")) == (6, 4, 6)
    assert trace.num_q_tiles == trace.num_k_tiles == 4
    with pytest.raises(ValueError):
        flash_attention_tiled(q, k, v, 0.125, 16, 16, trace_row=64)
    with pytest.raises(ValueError):
        flash_attention_tiled(q, k, v, 0.125, 16, 16, trace_head=9)
    with pytest.raises(ValueError):
        flash_attention_tiled(q, k[:10], v, 0.125)
    with pytest.raises(ValueError):
        tile_schedule(10, 0, 4)


def test_half_precision_inputs_keep_fp32_state() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(50, seed=2))
    trace = flash_attention_tiled(q, k, v, 0.125, 16, 16)
    assert trace.out.dtype == torch.bfloat16 and trace.m.dtype == torch.float32
    ref = _sdpa(q.float(), k.float(), v.float(), 0.125)
    assert relative_error(trace.out, ref) < 1e-2  # bf16 output rounding only
