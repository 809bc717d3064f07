"""Triton kernels against their torch references.

CPU: the kernels run under TRITON_INTERPRET=1, which must be set before Triton is imported, so each
family runs in a child process (`python tests/test_kernels.py <family>`), leaving this pytest
process (and every other test in it) with Triton imported normally. The child prints one JSON line
of results that the test checks.

GPU (`@pytest.mark.gpu`, skipped without CUDA): real SmolLM2 shapes in bf16 (and fp32/tf32), both
prefill variants, split and unsplit paged attention, and a CUDA-graph capture/replay.

Every check draws fresh random inputs (the seed is printed on failure), poisons outputs with NaN
before the call, requires every element to be written, and compares by ||out - ref|| / ||ref||.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
FP32_TOL = 1e-4  # fp32 under the interpreter (exact fp32 dots)
BF16_TOL = 1e-2
TF32_TOL = 5e-3

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None
HAS_CUDA = torch is not None and torch.cuda.is_available()


# --------------------------------------------------------------------------------------------
# Input builders (shared by the interpreter child and the GPU tests)
# --------------------------------------------------------------------------------------------

def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def make_varlen(lens, hq, hkv, d, dtype, device, gen, fused=False):
    """Packed q/k/v for sequences of `lens`; `fused` makes them strided views of one qkv tensor."""
    t = sum(lens)
    if fused:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen, device="cpu").to(dtype).to(device)
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    else:
        q = torch.randn(t, hq, d, generator=gen).to(dtype).to(device)
        k = torch.randn(t, hkv, d, generator=gen).to(dtype).to(device)
        v = torch.randn(t, hkv, d, generator=gen).to(dtype).to(device)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return q, k, v, cu.to(device)


def make_pool(num_blocks, block_size, hkv, d, dtype, device, gen=None, head_major=False, fill=None):
    """A [num_blocks, block_size, Hkv, D] pool tensor, random (or `fill`). `head_major`: stored as
    [num_blocks, Hkv, block_size, D] and returned as a strided view, like engine/kv_pool.py on CUDA."""
    shape = (num_blocks, hkv, block_size, d) if head_major else (num_blocks, block_size, hkv, d)
    pool = torch.full(shape, fill) if fill is not None else torch.randn(*shape, generator=gen)
    pool = pool.to(dtype).to(device)
    return pool.transpose(1, 2) if head_major else pool


def with_own_strides(pool: torch.Tensor, gen) -> torch.Tensor:
    """The same values in a wider allocation: a view whose strides differ from `pool`'s in every
    dimension but the last (the kernels' K and V pools need not share a layout)."""
    wide = torch.randn(*pool.shape[:-1], pool.shape[-1] + 8, generator=gen).to(pool.dtype).to(pool.device)
    wide[..., :pool.shape[-1]] = pool
    return wide[..., :pool.shape[-1]]


def make_paged(ctx_lens, q_lens, hq, hkv, d, block_size, dtype, device, gen, extra_blocks=3,
               pad_value=None, head_major=False):
    """A shuffled pool holding each sequence's context (token- or head-major, see make_pool), block
    tables padded with `pad_value` (random garbage when None) past each sequence's blocks, and this
    step's queries."""
    need = [(c + block_size - 1) // block_size for c in ctx_lens]
    num_blocks = sum(need) + extra_blocks
    k_cache = make_pool(num_blocks, block_size, hkv, d, dtype, device, gen, head_major)
    v_cache = make_pool(num_blocks, block_size, hkv, d, dtype, device, gen, head_major)
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(need) + 2
    if pad_value is None:
        tables = torch.randint(-(2**30), 2**30, (len(ctx_lens), max_blocks), generator=gen, dtype=torch.int32)
    else:
        tables = torch.full((len(ctx_lens), max_blocks), pad_value, dtype=torch.int32)
    p = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[p: p + n].to(torch.int32)
        p += n
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype).to(device)
    seq_lens = torch.tensor(ctx_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables.to(device), seq_lens.to(device), qsl.to(device)


def ref_tables(tables, ctx_lens, block_size):
    """The reference indexes whole rows of the table: give it one without garbage."""
    t = tables.clone()
    for b, c in enumerate(ctx_lens):
        t[b, (c + block_size - 1) // block_size:] = 0
    return t


def _new_gen(seed=None):
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    return seed, gen


# --------------------------------------------------------------------------------------------
# Interpreter cases (run in a child process with TRITON_INTERPRET=1)
# --------------------------------------------------------------------------------------------

def _case_store_kv(gen):
    from kernels.kv_store_ref import store_kv_ref
    from kernels.kv_store_triton import store_kv_triton

    out = []
    for fused, head_major in itertools.product((False, True), (False, True)):
        t = int(torch.randint(1, 71, (1,), generator=gen))
        hkv, d, bs = (3, 64, 16) if fused else (2, 32, 16)
        nb = (t + bs - 1) // bs + 4
        q, k, v, _ = make_varlen([t], hkv * 2, hkv, d, torch.float32, "cpu", gen, fused=fused)
        slots = torch.randperm(nb * bs, generator=gen)[:t]
        skip = torch.rand(t, generator=gen) < 0.2
        slots[skip] = -1
        kc, vc, kr, vr = (make_pool(nb, bs, hkv, d, torch.float32, "cpu", head_major=head_major, fill=float("nan"))
                          for _ in range(4))
        store_kv_triton(k, v, kc, vc, slots)
        store_kv_ref(k, v, kr, vr, slots)
        same = bool(torch.equal(kc.nan_to_num(1e30), kr.nan_to_num(1e30))
                    and torch.equal(vc.nan_to_num(1e30), vr.nan_to_num(1e30)))
        # Both writers put token n's rows where the pool's [block, offset] view says (whatever the layout).
        ok = slots >= 0
        placed = bool(torch.equal(kr[slots[ok] // bs, slots[ok] % bs], k[ok]))
        out.append({"name": f"store_kv t={t} fused={fused} head_major={head_major}", "exact": same and placed})
    return out


def _case_prefill(gen):
    from kernels.prefill_attention_ref import flash_attention_varlen_ref
    from kernels.prefill_attention_triton import flash_attention_varlen_triton

    out = []
    shapes = [(4, 2, 64, False, "ptr"), (9, 3, 64, True, "ptr"), (9, 3, 32, True, "tma"), (4, 2, 64, False, "tma")]
    for hq, hkv, d, fused, impl in shapes:
        b = int(torch.randint(2, 5, (1,), generator=gen))
        lens = torch.randint(1, 71, (b,), generator=gen).tolist()
        lens[0] = int(torch.randint(40, 71, (1,), generator=gen))  # at least one multi-tile sequence
        q, k, v, cu = make_varlen(lens, hq, hkv, d, torch.float32, "cpu", gen, fused=fused)
        scale = d ** -0.5
        o = torch.full_like(q, float("nan"))
        flash_attention_varlen_triton(q, k, v, cu, max(lens), scale, impl=impl, out=o)
        ref = flash_attention_varlen_ref(q, k, v, cu, max(lens), scale)
        out.append({"name": f"prefill {impl} lens={lens} hq={hq} hkv={hkv} d={d} fused={fused}",
                    "all_written": bool(torch.isfinite(o).all()), "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


def _case_paged(gen):
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    pa.POISON_SCRATCH = True
    out = []
    bs = 16
    cases = [
        # (name, hq, hkv, d, q_lens, split knob, decode kernel, head-major pool)
        ("decode allheads split", 9, 3, 64, [1, 1, 1], None, "allheads", False),
        ("decode allheads unsplit", 4, 2, 64, [1, 0, 1, 1], 1, "allheads", False),  # one empty sequence
        ("decode group split", 9, 3, 64, [1, 1, 1], None, "group", False),
        ("decode group unsplit", 4, 2, 64, [1, 1, 1, 1], 1, "group", False),
        ("chunk split", 4, 2, 32, "chunk", None, None, False),
        ("mixed split", 9, 3, 64, "mixed", None, None, False),
        ("decode group fused", 9, 3, 64, [1, 0, 1], None, "group+fused", False),
        ("chunk fused", 4, 2, 32, "chunk", None, "group+fused", False),
        # The engine's CUDA pool layout (engine/kv_pool.py): every path reads it through strides.
        ("decode group split head-major", 9, 3, 64, [1, 0, 1], None, "group", True),
        ("decode allheads split head-major", 9, 3, 64, [1, 1, 1], None, "allheads", True),
        ("mixed split head-major", 9, 3, 64, "mixed", None, None, True),
        ("chunk fused head-major", 4, 2, 32, "chunk", None, "group+fused", True),
    ]
    for name, hq, hkv, d, q_lens, per_sm, kern, head_major in cases:
        fused = kern is not None and kern.endswith("+fused")
        kern = kern.split("+")[0] if kern else None
        b = len(q_lens) if isinstance(q_lens, list) else 3
        ctx = torch.randint(1, 71, (b,), generator=gen).tolist()
        ctx[0] = int(torch.randint(40, 71, (1,), generator=gen))
        if q_lens == "chunk":
            q_lens = [int(torch.randint(2, c + 1, (1,), generator=gen)) if c > 1 else 1 for c in ctx]
        elif q_lens == "mixed":
            q_lens = [1, min(ctx[1], 7), 1]
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, hq, hkv, d, bs, torch.float32, "cpu", gen,
                                                      head_major=head_major)
        # A max_seq_len bucket larger than any context, as a CUDA graph would pass.
        max_seq = max(ctx) + int(torch.randint(0, 40, (1,), generator=gen))
        scale = d ** -0.5
        o = torch.full_like(q, float("nan"))
        pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max_seq, scale,
                                  programs_per_sm=per_sm, decode_kernel=kern, fused_reduce=fused, out=o)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, max(q_lens), max_seq, scale)
        counters_rearmed = all(int(c.abs().sum()) == 0 for bufs in pa._COUNTERS.values() for c in bufs)
        plan = pa.plan(len(ctx), hq, hkv, max(q_lens), max_seq, q.device, programs_per_sm=per_sm,
                       decode_kernel=kern)
        assert kern is None or plan["kernel"] == kern
        out.append({"name": f"paged {name} ctx={ctx} q_lens={q_lens} splits={plan['splits']}",
                    "splits": plan["splits"], "expect_split": per_sm is None,
                    "all_written": bool(torch.isfinite(o).all()) and counters_rearmed,
                    "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    out += _case_paged_tree(gen)
    out += _case_paged_v_strides(gen)
    out += _case_paged_int32_offsets(gen)
    return out


def _case_paged_int32_offsets(gen):
    """Decode and prefill chunks with int32 page offsets (OFF32; on by default only where page ids
    are read ahead, which the interpreter cannot run, so forced here): contexts of whole tiles, a
    partial last tile, less than one tile, and splits that own no keys at all; decode splits both
    interleaved (the default, INTERLEAVE_DECODE_SPLITS) and as contiguous ranges."""
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    out = []
    bs = 16
    for name, per_sm, fused, chunk, interleave in (
            ("decode split", 8, False, False, None), ("decode split fused", 8, True, False, None),
            ("decode contiguous splits", 8, False, False, False), ("decode contiguous splits fused", 8, True, False, False),
            ("decode unsplit", 1, False, False, None), ("chunk split", 8, False, True, None)):
        ctx = [16, 32, int(torch.randint(33, 80, (1,), generator=gen)), int(torch.randint(1, 16, (1,), generator=gen)),
               int(torch.randint(1, 80, (1,), generator=gen))]
        q_lens = [int(torch.randint(1, c + 1, (1,), generator=gen)) for c in ctx] if chunk else [1] * len(ctx)
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, 9, 3, 64, bs, torch.float32, "cpu", gen,
                                                      head_major=True)
        max_seq = 96  # the bucket: its partition gives the short contexts splits past their end
        o = torch.full_like(q, float("nan"))
        pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max_seq, 0.125,
                                  programs_per_sm=per_sm, fused_reduce=fused, off32=True, interleave=interleave, out=o)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, max(q_lens), max_seq, 0.125)
        plan = pa.plan(len(ctx), 9, 3, max(q_lens), max_seq, q.device, programs_per_sm=per_sm)
        out.append({"name": f"paged int32 offsets, {name} ctx={ctx} q_lens={q_lens} splits={plan['splits']}",
                    "splits": plan["splits"], "expect_split": per_sm > 1,
                    "all_written": bool(torch.isfinite(o).all()), "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


def _case_paged_v_strides(gen):
    """K and V pools with different strides: the kernel then computes V's addresses on their own
    (with equal strides it shares K's, see KV_SAME), for decode rows and for a chunk."""
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    out = []
    for name, q_lens in (("decode", [1, 1, 1]), ("chunk", [1, 6, 3])):
        ctx = [int(torch.randint(q + 1, 70, (1,), generator=gen)) for q in q_lens]
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, 9, 3, 64, 16, torch.float32, "cpu", gen,
                                                      head_major=True)
        vw = with_own_strides(vc, gen)
        assert vw.stride()[:3] != kc.stride()[:3]
        o = torch.full_like(q, float("nan"))
        pa.paged_attention_triton(q, kc, vw, tables, seq_lens, qsl, max(q_lens), max(ctx) + 5, 0.125, out=o)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, 16), seq_lens, qsl, max(q_lens), max(ctx) + 5,
                                  0.125)
        out.append({"name": f"paged {name}, V strides differ ctx={ctx} q_lens={q_lens}", "splits": 0,
                    "expect_split": False, "all_written": bool(torch.isfinite(o).all()),
                    "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


def random_tree_mask(n: int, gen) -> torch.Tensor:
    """[n, n] bool: row i sees itself and its ancestors, in a random tree flattened parents-first
    (row 0 is the root, every other row's parent is an earlier row)."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        mask[i] |= mask[parent]
    return mask


def _case_paged_tree(gen):
    """Draft-tree verification rows: a tree per sequence (or none), beside a decode row and a
    causal chunk in the same launch."""
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    out = []
    bs = 16
    for name, q_lens, trees in (("tree beside decode + chunk", [1, 9, 5], [None, True, None]),
                                ("two trees", [7, 12], [True, True])):
        ctx = [int(torch.randint(q + 1, 70, (1,), generator=gen)) for q in q_lens]
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, 9, 3, 64, bs, torch.float32, "cpu", gen)
        masks = tuple(random_tree_mask(n, gen) if t else None for n, t in zip(q_lens, trees))
        max_seq = max(ctx) + 7
        o = torch.full_like(q, float("nan"))
        pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max_seq, 0.125, tree_masks=masks,
                                  out=o)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, max(q_lens), max_seq, 0.125,
                                  masks)
        causal = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, max(q_lens), max_seq, 0.125)
        out.append({"name": f"paged {name} ctx={ctx} q_lens={q_lens}", "splits": 0, "expect_split": False,
                    # the masks must matter: the causal answer is far from the tree answer
                    "all_written": bool(torch.isfinite(o).all()) and rel_err(causal, ref) > 1e-3,
                    "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


def _case_warp_slices(gen):
    """The bench's experimental decode kernel (bench/warp_slice_decode.py): whole tiles, a partial
    last tile, contexts shorter than one tile, and split launches merged by the engine's reduce."""
    from bench.warp_slice_decode import warp_slice_decode
    from kernels.paged_attention_ref import paged_attention_ref

    out = []
    bs = 16
    for splits, slices, slice_keys in ((1, 4, 16), (2, 2, 32), (3, 4, 16)):
        ctx = torch.randint(1, 200, (3,), generator=gen).tolist()
        ctx[0] = int(torch.randint(1, 16, (1,), generator=gen))  # less than one tile
        ctx[1] = 128 + int(torch.randint(0, 8, (1,), generator=gen)) * 16  # whole tiles, maybe a partial one
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, [1, 1, 1], 9, 3, 64, bs, torch.float32, "cpu", gen,
                                                      head_major=True)
        o = warp_slice_decode(q, kc, vc, tables, seq_lens, 0.125, splits=splits, slices=slices,
                              slice_keys=slice_keys, num_warps=slices)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, 1, max(ctx), 0.125)
        out.append({"name": f"warp slices splits={splits} {slices}x{slice_keys} ctx={ctx}",
                    "all_written": bool(torch.isfinite(o).all()), "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


def _case_keys_major(gen):
    """The bench's keys-on-M decode kernel (bench/paged_decode_keys_major.py): contexts shorter than a
    tile, whole tiles with a partial one, garbage past each table's pages, and split launches merged by
    the engine's reduce, on a head-major pool."""
    from bench.paged_decode_keys_major import decode_keys_major
    from kernels.paged_attention_ref import paged_attention_ref

    out = []
    bs = 16
    for splits, block_n in ((1, 64), (2, 64), (3, 128)):
        ctx = torch.randint(1, 300, (3,), generator=gen).tolist()
        ctx[0] = int(torch.randint(1, 16, (1,), generator=gen))  # less than one tile
        ctx[1] = 128 + int(torch.randint(0, 8, (1,), generator=gen)) * 16  # whole pages, maybe a partial tile
        q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, [1, 1, 1], 9, 3, 64, bs, torch.float32, "cpu", gen,
                                                      head_major=True)
        o = decode_keys_major(q, kc, vc, tables, seq_lens, 0.125, splits=splits, block_n=block_n)
        ref = paged_attention_ref(q, kc, vc, ref_tables(tables, ctx, bs), seq_lens, qsl, 1, max(ctx), 0.125)
        out.append({"name": f"keys-major splits={splits} block_n={block_n} ctx={ctx}",
                    "all_written": bool(torch.isfinite(o).all()), "rel_err": rel_err(o, ref), "tol": FP32_TOL})
    return out


_CASES = {"store_kv": _case_store_kv, "prefill": _case_prefill, "paged": _case_paged,
          "warp_slices": _case_warp_slices, "keys_major": _case_keys_major}


def _run_child(family: str) -> list[dict]:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, __file__, family], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    res = json.loads(line)
    return res


def _check(res: dict) -> None:
    seed = res["seed"]
    for r in res["results"]:
        where = f"{r['name']} (seed {seed})"
        if "exact" in r:
            assert r["exact"], where
            continue
        assert r["all_written"], f"unwritten/NaN output: {where}"
        assert r["rel_err"] < r["tol"], f"rel err {r['rel_err']:.3g} >= {r['tol']}: {where}"
        if r.get("expect_split"):
            assert r["splits"] > 1, f"expected a split-KV launch: {where}"


needs_triton = pytest.mark.skipif(not HAS_TRITON or torch is None, reason="triton/torch not installed")


@needs_triton
@pytest.mark.parametrize("family", sorted(_CASES))
def test_interpreter(family):
    _check(_run_child(family))


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ref_batched_decode_matches_one_sequence_at_a_time(seed):
    """The reference's batched decode path (several single-token rows: one page-wise gather and one
    padded SDPA) gives what each row gets alone (the per-sequence path), over shuffled pages,
    contexts of different lengths and not multiples of the page, a prefill chunk in the same batch."""
    from kernels.paged_attention_ref import paged_attention_ref

    gen = torch.Generator().manual_seed(seed)
    bs, hkv, hq, d, nb = 16, 3, 9, 64, 64
    kc, vc = torch.randn(nb, bs, hkv, d, generator=gen), torch.randn(nb, bs, hkv, d, generator=gen)
    ctx = [int(x) for x in torch.randint(1, 120, (6,), generator=gen)]
    q_lens = [1, 1, 5 if ctx[2] >= 5 else 1, 1, 1, 1]
    tables = torch.randperm(nb, generator=gen)[:6 * 8].view(6, 8).to(torch.int32)
    qsl = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), hq, d, generator=gen)
    lens = torch.tensor(ctx, dtype=torch.int32)
    out = paged_attention_ref(q, kc, vc, tables, lens, qsl, max(q_lens), max(ctx), 0.125)
    for b in range(6):
        s, e = int(qsl[b]), int(qsl[b + 1])
        alone = paged_attention_ref(q[s:e], kc, vc, tables[b:b + 1], lens[b:b + 1],
                                    torch.tensor([0, e - s], dtype=torch.int32), e - s, ctx[b], 0.125)
        torch.testing.assert_close(out[s:e], alone, rtol=1e-5, atol=1e-6)


def _decode_plan_on_h200(batch: int, length: int) -> dict:
    """The launcher's decode plan for SmolLM2's heads as it would be made on a 132-SM GPU."""
    import kernels.paged_attention_triton as pa

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pa, "_INTERPRET", False)
        mp.setattr(pa, "_sm_count", lambda device: 132)
        return pa.plan(batch, 9, 3, 1, length, torch.device("cpu"))


@needs_triton
@settings(max_examples=300, deadline=None)
@given(batch=st.integers(1, 512), length=st.integers(1, 65536))
def test_decode_plan_few_long_programs(batch, length):
    """The decode launch plan on a 132-SM GPU: at most TARGET_PROGRAMS_PER_SM programs per SM unless
    one split per (sequence, KV head) is already more, no split that owns nothing, and the decode
    tiles tiling each split."""
    import kernels.paged_attention_triton as pa

    p = _decode_plan_on_h200(batch, length)
    programs = batch * 3 * p["splits"]
    assert p["mode"] == "decode" and p["splits"] >= 1
    assert programs <= max(pa.TARGET_PROGRAMS_PER_SM["decode"] * 132, batch * 3)
    assert p["partition"] * (p["splits"] - 1) < length <= p["partition"] * p["splits"]
    assert p["BLOCK_N"] == pa.BLOCK_N["decode"] and p["partition"] % p["BLOCK_N"] == 0


@needs_triton
@pytest.mark.parametrize("head_major", [True, False])
def test_int32_offsets_only_for_pools_that_fit(head_major):
    """The decode kernel's int32 page offsets (OFF32) are used only when the pool's last element
    offset fits: 699,050 blocks of 16 x 3 x 64 end at 2^31 - 1, one block more does not fit."""
    import kernels.paged_attention_triton as pa

    def pool(blocks: int) -> torch.Tensor:
        if head_major:
            return torch.empty(blocks, 3, 16, 64, device="meta").transpose(1, 2)
        return torch.empty(blocks, 16, 3, 64, device="meta")

    assert pa._fits_int32(pool(699_050))
    assert not pa._fits_int32(pool(699_051))


def test_decode_plan_measured_shape():
    """B = 64 at 8k gets the shape measured best on the H200 with the engine's head-major pool
    (bench/NOTES_kernels.md "v10", "v11")."""
    import kernels.paged_attention_triton as pa

    p = _decode_plan_on_h200(64, 8192)
    assert (p["splits"], p["BLOCK_N"], pa.NUM_STAGES["decode"], pa.PAGE_LOADS["decode"]) == (2, 128, 3, "asm")


@needs_triton
def test_decode_plan_single_pass_for_short_contexts():
    """Short decode contexts are not split once the unsplit programs cover the SMs (v14): up to 1k
    from one program per SM (B = 44 on 132 SMs), up to 2k from 1.25 per SM (B = 55); not below."""
    cases = {(64, 1024): 1, (64, 2048): 1, (64, 4096): 2, (48, 1024): 1, (48, 2048): 2, (56, 2048): 1,
             (44, 1024): 1, (43, 1024): 3, (32, 1024): 4}
    got = {case: _decode_plan_on_h200(*case)["splits"] for case in cases}
    assert got == cases


def test_prefill_default_config_by_length():
    """Long TMA launches take the 128-row config, everything else (and the pointer variant) the default."""
    if not HAS_TRITON:
        pytest.skip("needs Triton")
    import kernels.prefill_attention_triton as fa

    if fa._INTERPRET:
        assert fa.default_config(10_000, "tma") is fa.INTERPRET_CONFIG
        return
    assert fa.default_config(fa.LONG_FROM, "tma") == fa.DEFAULT_CONFIG
    assert fa.default_config(fa.LONG_FROM + 1, "tma") == fa.LONG_CONFIG
    assert fa.default_config(100_000, "ptr") == fa.DEFAULT_CONFIG
    assert fa.LONG_CONFIG["BLOCK_M"] % fa.DEFAULT_CONFIG["BLOCK_M"] == 0
    x = torch.zeros(4, 9, 64)  # on the CPU: never TMA, so always the default tiles
    assert fa.describe_launch(x, x[:, :3], x[:, :3], 10_000) == "pointer loads, 64 x 64 tiles, 4 warps, 3 stages"


# --------------------------------------------------------------------------------------------
# GPU tests
# --------------------------------------------------------------------------------------------


def on_gpu(test):
    """Marked `gpu` (CI selects or skips by it) and skipped where there is no CUDA + Triton."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs CUDA + Triton")(test))



@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@on_gpu
def test_gpu_store_kv(dtype, head_major):
    from kernels.kv_store_ref import store_kv_ref
    from kernels.kv_store_triton import store_kv_triton

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    t, hkv, d, bs = 3000, 3, 64, 16
    nb = t // bs + 50
    _, k, v, _ = make_varlen([t], 9, hkv, d, dt, "cuda", gen, fused=True)
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    slots[torch.rand(t, generator=gen) < 0.1] = -1
    slots = slots.cuda()
    kc, vc, kr, vr = (make_pool(nb, bs, hkv, d, dt, "cuda", head_major=head_major, fill=float("nan"))
                      for _ in range(4))
    store_kv_triton(k, v, kc, vc, slots)
    store_kv_ref(k, v, kr, vr, slots)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True, msg=f"seed {seed}")
    torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True, msg=f"seed {seed}")


@pytest.mark.parametrize("longest", [2048, 5000])  # either side of LONG_FROM: both default tile configs
@pytest.mark.parametrize("impl", [None, "ptr", "tma"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@on_gpu
def test_gpu_prefill(dtype, impl, longest):
    from kernels.prefill_attention_ref import flash_attention_varlen_ref
    from kernels.prefill_attention_triton import flash_attention_varlen_triton

    dt = getattr(torch, dtype)
    if impl == "tma" and dt == torch.float32:
        pytest.skip("the TMA variant is bf16/fp16 only")
    seed, gen = _new_gen()
    lens = [1, 17, 128, 300, 1000, longest - 1, longest] + torch.randint(1, 700, (4,), generator=gen).tolist()
    q, k, v, cu = make_varlen(lens, 9, 3, 64, dt, "cuda", gen, fused=True)
    o = torch.full_like(q, float("nan"))
    flash_attention_varlen_triton(q, k, v, cu, max(lens), 0.125, impl=impl, out=o)
    ref = flash_attention_varlen_ref(q.float(), k.float(), v.float(), cu, max(lens), 0.125)
    assert bool(torch.isfinite(o).all()), f"unwritten output (seed {seed})"
    tol = BF16_TOL if dt == torch.bfloat16 else TF32_TOL
    assert rel_err(o, ref) < tol, f"rel err {rel_err(o, ref):.3g} (seed {seed})"


@pytest.mark.parametrize("shape", [(64, 64, 2, 4), (64, 64, 3, 4), (64, 128, 2, 4), (128, 64, 2, 8)])
@on_gpu
def test_gpu_gluon_fa3_bench(shape):
    """The bench's Gluon FlashAttention (FA3-style overlap, bench/fa2_gluon.py) on ragged causal lengths:
    tiles with and without the mask, sequences shorter than the ring, GQA."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("wgmma and TMA need Hopper")
    from bench.fa2_gluon import fa3_forward
    from kernels.prefill_attention_ref import flash_attention_varlen_ref

    bm, bn, stages, warps = shape
    seed, gen = _new_gen()
    lens = [1, 63, 64, 65, 129, 1000, 2053] + torch.randint(1, 700, (3,), generator=gen).tolist()
    q, k, v, cu = make_varlen(lens, 9, 3, 64, torch.bfloat16, "cuda", gen)
    o = torch.full_like(q, float("nan"))
    fa3_forward(q, k, v, cu, max(lens), 0.125 * 1.4426950408889634, bm, bn, stages, warps, out=o)
    ref = flash_attention_varlen_ref(q.float(), k.float(), v.float(), cu, max(lens), 0.125)
    assert bool(torch.isfinite(o).all()), f"unwritten output (seed {seed})"
    assert rel_err(o, ref) < BF16_TOL, f"rel err {rel_err(o, ref):.3g} (seed {seed})"


@pytest.mark.parametrize("shape", [(1, 4, 32, 4, 3, 0), (1, 4, 32, 4, 3, 64), (1, 4, 32, 4, 4, 0), (2, 4, 32, 4, 3, 0),
                                   (2, 2, 32, 2, 3, 0), (2, 4, 16, 4, 4, 0)])
@on_gpu
def test_gpu_warp_slice_decode(shape):
    """The bench's experimental decode kernel at real shapes (those of bench/paged_decode_warp_slices.py),
    with the page ids read through inline PTX, multi-buffered copies and, in one shape, the L1 prefetch."""
    from bench.warp_slice_decode import warp_slice_decode
    from kernels.paged_attention_ref import paged_attention_ref

    splits, slices, slice_keys, warps, stages, prefetch = shape
    seed, gen = _new_gen()
    ctx = torch.randint(1, 4097, (64,), generator=gen).tolist()
    q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, [1] * 64, 9, 3, 64, 16, torch.bfloat16, "cuda", gen,
                                                  head_major=True)
    o = warp_slice_decode(q, kc, vc, tables, seq_lens, 0.125, splits=splits, slices=slices, slice_keys=slice_keys,
                          num_warps=warps, num_stages=stages, prefetch_lines=prefetch)
    ref = paged_attention_ref(q.float(), kc.float(), vc.float(), ref_tables(tables, ctx, 16), seq_lens, qsl, 1,
                              max(ctx), 0.125)
    assert bool(torch.isfinite(o).all()), f"unwritten output (seed {seed})"
    assert rel_err(o, ref) < BF16_TOL, f"rel err {rel_err(o, ref):.3g} (seed {seed})"


@pytest.mark.parametrize("mode", ["decode", "decode_unsplit", "decode_allheads", "decode_allheads_unsplit", "chunk",
                                  "mixed", "decode_fp32", "decode_fused", "chunk_fused", "mixed_fused",
                                  "decode_loop_pages", "decode_asm_pages", "chunk_asm_pages",
                                  "decode_short", "decode_v_strides", "decode_empty_row", "decode_int64_offsets",
                                  "decode_contiguous_splits", "decode_contiguous_splits_fused"])
@pytest.mark.parametrize("layout", ["head_major", "token_major"])
@on_gpu
def test_gpu_paged(mode, layout):
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    dt = torch.float32 if mode == "decode_fp32" else torch.bfloat16
    seed, gen = _new_gen()
    bs = 16
    if mode == "decode_short":  # a bucket of 1k: the plan does not split (v14's single pass)
        ctx = torch.randint(1, 1025, (64,), generator=gen).tolist()
        q_lens = [1] * 64
    elif mode.startswith("decode"):
        ctx = torch.randint(1, 4097, (64,), generator=gen).tolist()
        q_lens = [1] * 64
        if mode == "decode_empty_row":  # one sequence without a row: not the kernel's DECODE variant
            q_lens[17] = 0
    elif mode.startswith("chunk"):
        ctx = torch.randint(300, 3000, (6,), generator=gen).tolist()
        q_lens = [min(c, int(torch.randint(2, 700, (1,), generator=gen))) for c in ctx]
    else:
        ctx = torch.randint(1, 3000, (12,), generator=gen).tolist()
        q_lens = [1] * 8 + [min(c, 257) for c in ctx[8:]]
    q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, 9, 3, 64, bs, dt, "cuda", gen,
                                                  head_major=layout == "head_major")
    if mode == "decode_v_strides":
        vc = with_own_strides(vc, gen)
    max_seq = 1024 if mode == "decode_short" else max(ctx) + 100
    per_sm = 1 if mode.endswith("unsplit") else None
    kern = "allheads" if "allheads" in mode else None
    fused = True if mode.endswith("fused") else None
    # How the kernel loads page ids (kernels/paged_attention_triton.py PAGE_LOADS); None: its default.
    page_loads = {"decode_loop_pages": "loop", "decode_asm_pages": "asm", "chunk_asm_pages": "asm"}.get(mode)
    # int64 page offsets, as for a pool too large for int32 ones (OFF32); None: the launcher decides.
    off32 = False if mode == "decode_int64_offsets" else None
    # Each split one contiguous range of the context, not every S-th tile (INTERLEAVE_DECODE_SPLITS).
    interleave = False if "contiguous_splits" in mode else None
    pa.POISON_SCRATCH = True
    try:
        o = torch.full_like(q, float("nan"))
        pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max_seq, 0.125,
                                  programs_per_sm=per_sm, min_partition=10**9 if per_sm else None,
                                  decode_kernel=kern, fused_reduce=fused, page_loads=page_loads, off32=off32,
                                  interleave=interleave, out=o)
        if fused:  # run twice: the second launch relies on the counters being re-armed by the first
            o.fill_(float("nan"))
            pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max_seq, 0.125,
                                      fused_reduce=True, interleave=interleave, out=o)
            assert all(int(c.abs().sum()) == 0 for bufs in pa._COUNTERS.values() for c in bufs)
    finally:
        pa.POISON_SCRATCH = False
    ref = paged_attention_ref(q.float(), kc.float(), vc.float(), ref_tables(tables, ctx, bs), seq_lens, qsl,
                              max(q_lens), max_seq, 0.125)
    assert bool(torch.isfinite(o).all()), f"unwritten output (seed {seed})"
    tol = BF16_TOL if dt == torch.bfloat16 else TF32_TOL
    assert rel_err(o, ref) < tol, f"rel err {rel_err(o, ref):.3g} (seed {seed})"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@on_gpu
def test_gpu_paged_tree(dtype):
    """Draft trees of 25 and 65 rows over 1-3k contexts, beside decode rows and a causal chunk."""
    import kernels.paged_attention_triton as pa
    from kernels.paged_attention_ref import paged_attention_ref

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    q_lens = [1, 25, 1, 65, 40]
    ctx = [int(torch.randint(q + 1, 3000, (1,), generator=gen)) for q in q_lens]
    q, kc, vc, tables, seq_lens, qsl = make_paged(ctx, q_lens, 9, 3, 64, 16, dt, "cuda", gen, head_major=True)
    masks = tuple(random_tree_mask(n, gen).cuda() if n in (25, 65) else None for n in q_lens)
    o = torch.full_like(q, float("nan"))
    pa.paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, max(q_lens), max(ctx) + 50, 0.125, tree_masks=masks,
                              out=o)
    ref = paged_attention_ref(q.float(), kc.float(), vc.float(), ref_tables(tables, ctx, 16), seq_lens, qsl,
                              max(q_lens), max(ctx) + 50, 0.125, masks)
    assert bool(torch.isfinite(o).all()), f"unwritten output (seed {seed})"
    tol = BF16_TOL if dt == torch.bfloat16 else TF32_TOL
    assert rel_err(o, ref) < tol, f"rel err {rel_err(o, ref):.3g} (seed {seed})"


@pytest.mark.parametrize("fused", [False, True])
@on_gpu
def test_gpu_cuda_graph_decode(fused):
    """store_kv + paged decode captured once for a (batch, max_seq_len bucket), replayed on new
    lengths, block tables and data: every replay must match the reference. Head-major pool, as the
    engine makes on CUDA."""
    from kernels.kv_store_triton import store_kv_triton
    from kernels.paged_attention_ref import paged_attention_ref
    from kernels.paged_attention_triton import paged_attention_triton

    seed, gen = _new_gen()
    b, hq, hkv, d, bs, bucket = 32, 9, 3, 64, 16, 2048
    nb = b * bucket // bs + 8
    dt = torch.bfloat16
    kc = make_pool(nb, bs, hkv, d, dt, "cuda", gen, head_major=True)
    vc = make_pool(nb, bs, hkv, d, dt, "cuda", gen, head_major=True)
    s_q = torch.zeros(b, hq, d, dtype=dt, device="cuda")
    s_k = torch.zeros(b, hkv, d, dtype=dt, device="cuda")
    s_v = torch.zeros(b, hkv, d, dtype=dt, device="cuda")
    s_slots = torch.zeros(b, dtype=torch.int64, device="cuda")
    s_tables = torch.zeros(b, bucket // bs, dtype=torch.int32, device="cuda")
    s_lens = torch.ones(b, dtype=torch.int32, device="cuda")
    s_qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")

    def step():
        store_kv_triton(s_k, s_v, kc, vc, s_slots)
        return paged_attention_triton(s_q, kc, vc, s_tables, s_lens, s_qsl, 1, bucket, 0.125, fused_reduce=fused)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s_out = step()
    for _ in range(3):
        ctx = torch.randint(1, bucket + 1, (b,), generator=gen)
        perm = torch.randperm(nb, generator=gen)
        tables = perm[: b * (bucket // bs)].view(b, bucket // bs).to(torch.int32)
        last = ctx - 1
        slots = tables.gather(1, (last // bs).view(-1, 1)).view(-1).long() * bs + last % bs
        slots[0] = -1  # a padding row: nothing stored, attention still runs on the old cache
        s_tables.copy_(tables)
        s_lens.copy_(ctx.to(torch.int32))
        s_slots.copy_(slots)
        s_q.copy_(torch.randn(b, hq, d, generator=gen).to(dt))
        s_k.copy_(torch.randn(b, hkv, d, generator=gen).to(dt))
        s_v.copy_(torch.randn(b, hkv, d, generator=gen).to(dt))
        s_out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = paged_attention_ref(s_q.float(), kc.float(), vc.float(), s_tables, s_lens, s_qsl, 1, bucket, 0.125)
        assert bool(torch.isfinite(s_out).all()), f"seed {seed}"
        assert rel_err(s_out, ref) < BF16_TOL, f"rel err {rel_err(s_out, ref):.3g} (seed {seed})"
        ok = slots >= 0
        stored = slots[ok].cuda()
        assert torch.equal(kc[stored // bs, stored % bs], s_k[ok.cuda()]), f"store_kv in graph (seed {seed})"


if __name__ == "__main__":
    # Child-process entry: `TRITON_INTERPRET=1 python tests/test_kernels.py <family> [seed]`.
    fam = sys.argv[1]
    seed, gen = _new_gen(int(sys.argv[2]) if len(sys.argv) > 2 else None)
    torch.set_num_threads(2)
    print(json.dumps({"family": fam, "seed": seed, "results": _CASES[fam](gen)}))
