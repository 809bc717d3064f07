"""The CPU reference's batched decode: its per-pass plan is reused only for the same batch."""
from __future__ import annotations

import torch

from kernels.paged_attention_ref import paged_attention_ref


def _alone(q, kc, vc, tables, lens, b):
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    return paged_attention_ref(q[b:b + 1], kc, vc, tables[b:b + 1], lens[b:b + 1], qsl, 1, int(lens[b]), 0.125)


def test_plan_follows_tables_refilled_in_place():
    """Two passes over the same tensor objects whose contents changed in between (a static buffer
    refilled): the second pass must read the new pages, lengths and rows, not the cached plan."""
    gen = torch.Generator().manual_seed(0)
    bs, hkv, hq, d, nb, rows = 16, 3, 9, 64, 40, 4
    kc, vc = torch.randn(nb, bs, hkv, d, generator=gen), torch.randn(nb, bs, hkv, d, generator=gen)
    tables = torch.zeros(rows, 5, dtype=torch.int32)
    lens = torch.zeros(rows, dtype=torch.int32)
    qsl = torch.arange(rows + 1, dtype=torch.int32)
    q = torch.randn(rows, hq, d, generator=gen)
    for _ in range(3):
        tables.copy_(torch.randperm(nb, generator=gen)[:rows * 5].view(rows, 5))
        lens.copy_(torch.randint(1, 80, (rows,), generator=gen))
        for layer in range(2):  # the same batch twice, as consecutive layers ask
            out = paged_attention_ref(q, kc, vc, tables, lens, qsl, 1, int(lens.max()), 0.125)
            for b in range(rows):
                torch.testing.assert_close(out[b:b + 1], _alone(q, kc, vc, tables, lens, b), rtol=1e-5, atol=1e-6)
