"""Fused elementwise kernels (rmsnorm [+ residual add], rope_store, silu_mul) against their torch
references, and the references against the model's unfused pieces.

CPU: the Triton kernels run under TRITON_INTERPRET=1 in a child process per family
(`python tests/test_fused_kernels.py <family> [seed]`), as in tests/test_kernels.py. Inputs are
fp32, random (never zeros), outputs are poisoned with NaN (the kernel modules' `torch.empty` is
swapped for a NaN-filling one in the child; pools start as NaN), shapes are small and include T not
a multiple of the row block and slots of -1.

GPU (`@pytest.mark.gpu`): SmolLM2 shapes (H 576, Hq 9, Hkv 3, D 64, I 1536) in bf16 and fp32 at
T = 1, 37, 8195, and one CUDA-graph capture/replay of the three kernels.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FP32_TOL = 1e-6  # ||out - ref|| / ||ref||: the fp32 kernels differ from torch by an ulp at most
# The kernels switch from one row per program to several at 512 rows; the interpreter children
# lower that so the multi-row path runs at small, fast T.
MULTI_ROW_MIN_T = 16

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None
HAS_CUDA = torch is not None and torch.cuda.is_available()

from tests.test_kernels import make_pool  # noqa: E402 (the KV pool builder of the attention kernels' tests)

HQ, HKV, D, HIDDEN, INTER = 9, 3, 64, 576, 1536
EPS = 1e-5


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------

def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def _new_gen(seed=None):
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    return seed, torch.Generator().manual_seed(seed)


def randn(shape, gen, dtype=torch.float32, device="cpu"):
    """Standard normal with no exact zeros (a zero would hide a missed load)."""
    x = torch.randn(shape, generator=gen)
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(dtype).to(device)


def rope_tables(max_len, d, theta=100000.0, device="cpu"):
    # engine.model.rope_cache without a ModelConfig
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return freqs.cos().float().to(device), freqs.sin().float().to(device)


def make_slots(t, nb, bs, gen, skip_frac=0.2):
    slots = torch.randperm(nb * bs, generator=gen)[:t].to(torch.int64)
    slots[torch.rand(t, generator=gen) < skip_frac] = -1
    return slots


class _PoisonTorch(types.ModuleType):
    """Stands in for `torch` inside a kernel module: float `empty`/`empty_like` come back NaN."""

    def __init__(self, real):
        super().__init__("torch")
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def empty(self, *a, **k):
        out = self._real.empty(*a, **k)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    def empty_like(self, *a, **k):
        out = self._real.empty_like(*a, **k)
        return out.fill_(float("nan")) if out.is_floating_point() else out


def _poison(module):
    module.torch = _PoisonTorch(torch)
    return module


def _rand(lo, hi, gen) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


def _same(a, b) -> bool:
    """Bitwise equality with NaN == NaN (unwritten pool slots stay NaN on both sides)."""
    return a.shape == b.shape and bool(torch.equal(a.nan_to_num(7e30), b.nan_to_num(7e30)))


# --------------------------------------------------------------------------------------------
# Interpreter cases (child process, TRITON_INTERPRET=1)
# --------------------------------------------------------------------------------------------

def _case_rmsnorm(gen):
    import kernels.rmsnorm_triton as mod
    from kernels.rmsnorm_ref import rmsnorm_ref

    _poison(mod)
    mod.MULTI_ROW_MIN_T = MULTI_ROW_MIN_T
    out = []
    # (T, H): the 1-row path (T < 16 here) and the multi-row path (4 rows of 576, 8 of 100) with T
    # not a multiple of the row block; H not a power of two (SmolLM2's 576), not a multiple of 8.
    shapes = [(1, HIDDEN), (_rand(2, 16, gen), HIDDEN), (37, HIDDEN), (_rand(16, 40, gen), 100), (5, 64)]
    for t, h in shapes:
        for with_res in (False, True):
            x = randn((t, h), gen)
            w = randn((h,), gen)
            res = randn((t, h), gen) if with_res else None
            x0, r0 = x.clone(), (res.clone() if with_res else None)
            y, nr = mod.rmsnorm_triton(x, w, EPS, res)
            yr, nrr = rmsnorm_ref(x, w, EPS, res)
            ok = bool(torch.isfinite(y).all()) and torch.equal(x, x0) and (not with_res or torch.equal(res, r0))
            if with_res:
                ok = ok and nr is not None and bool(torch.isfinite(nr).all())
                res_exact = nr is not None and torch.equal(nr, nrr)
            else:
                ok = ok and nr is None
                res_exact = True
            out.append({"name": f"rmsnorm T={t} H={h} residual={with_res}", "all_written": ok,
                        "rel_err": rel_err(y, yr), "tol": FP32_TOL, "exact_parts": bool(res_exact)})
    return out


def _case_rope_store(gen):
    import kernels.rope_store_triton as mod
    from kernels.rope_store_ref import rope_store_ref

    _poison(mod)
    mod.MULTI_ROW_MIN_T = MULTI_ROW_MIN_T
    out = []
    # (T, Hq, Hkv, D, block_size): SmolLM2 heads on the 1-row path (T < 16 here) and on the 4-row
    # path with T not a multiple of 4 and rows spanning several pool blocks; a second head shape
    # (GQA 4:2, D 32, 8-row path).
    cases = [(1, HQ, HKV, D, 16), (_rand(2, 16, gen), HQ, HKV, D, 16), (39, HQ, HKV, D, 16),
             (_rand(16, 40, gen), 4, 2, 32, 8)]
    for (t, hq, hkv, d, bs), head_major in itertools.product(cases, (False, True)):
        max_len = 4 * t + 64
        cos, sin = rope_tables(max_len, d)
        qkv = randn((t, (hq + 2 * hkv) * d), gen)
        positions = torch.randint(0, max_len, (t,), generator=gen)
        nb = (t + bs - 1) // bs + 3
        slots = make_slots(t, nb, bs, gen)
        if t == 1:
            slots[0] = -1 if bool(torch.rand(1, generator=gen) < 0.5) else slots[0]
        # The pool token-major, or head-major as the engine makes it on CUDA (a strided view).
        kc, vc, kr, vr = (make_pool(nb, bs, hkv, d, torch.float32, "cpu", head_major=head_major, fill=float("nan"))
                          for _ in range(4))
        qkv0 = qkv.clone()
        q, k, v = mod.rope_store_triton(qkv, positions, cos, sin, kc, vc, slots, hq, hkv, d)
        q2, k2, v2 = rope_store_ref(qkv, positions, cos, sin, kr, vr, slots, hq, hkv, d)
        written = bool(torch.isfinite(q).all() and torch.isfinite(k).all())
        ok = slots >= 0
        flat_k, flat_v = kc.reshape(-1, hkv, d), vc.reshape(-1, hkv, d)  # copies when head-major: read-only
        written = written and bool(torch.isfinite(flat_k[slots[ok]]).all() and torch.isfinite(flat_v[slots[ok]]).all())
        # Every other pool slot must still be NaN (nothing stored for slot -1 rows, nothing stray).
        untouched = torch.ones(nb * bs, dtype=torch.bool)
        untouched[slots[ok]] = False
        written = written and bool(flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all())
        exact = (_same(q, q2) and _same(k, k2) and _same(v, v2) and _same(kc, kr) and _same(vc, vr)
                 and torch.equal(qkv, qkv0) and q.is_contiguous() and k.is_contiguous()
                 and v.data_ptr() == qkv.data_ptr() + (hq + hkv) * d * qkv.element_size())
        out.append({"name": f"rope_store T={t} hq={hq} hkv={hkv} d={d} bs={bs} head_major={head_major} "
                            f"skipped={int((~ok).sum())}",
                    "all_written": written, "exact": bool(exact)})
    return out


def _case_silu_mul(gen):
    import kernels.silu_mul_triton as mod
    from kernels.silu_mul_ref import silu_mul_ref

    _poison(mod)
    mod.MULTI_ROW_MIN_T = MULTI_ROW_MIN_T
    out = []
    # I = 1536 (three 512-column blocks, no tail), I = 100 (one padded block), I = 1100 (two
    # 1024-column blocks, the second ragged); T on the 1-row path (T < 16 here) and on the
    # multi-row path (4 rows of 512, 8 of 128) with T not a multiple of the row block.
    cases = [(1, INTER), (_rand(2, 16, gen), INTER), (38, INTER), (_rand(16, 40, gen), 100), (3, 1100)]
    for t, i in cases:
        gu = randn((t, 2 * i), gen) * 3  # reach well into silu's tails
        gu0 = gu.clone()
        y = mod.silu_mul_triton(gu)
        yr = silu_mul_ref(gu)
        out.append({"name": f"silu_mul T={t} I={i}",
                    "all_written": bool(torch.isfinite(y).all()) and torch.equal(gu, gu0) and y.shape == yr.shape,
                    "rel_err": rel_err(y, yr), "tol": FP32_TOL})
    return out


def _case_dispatch(gen):
    """`Kernels` under the interpreter routes the three new families to Triton, and the timed
    methods pass arguments through in the right order."""
    from kernels.dispatch import Kernels
    from kernels.rmsnorm_ref import rmsnorm_ref
    from kernels.rope_store_ref import rope_store_ref
    from kernels.silu_mul_ref import silu_mul_ref

    kern = Kernels("triton", torch.device("cpu"))
    labels = {f: kern.label(f) for f in ("rmsnorm", "rope_store", "silu_mul")}
    t = 3
    x, r, w = randn((t, HIDDEN), gen), randn((t, HIDDEN), gen), randn((HIDDEN,), gen)
    y, h = kern.rmsnorm(x, w, EPS, residual=r)
    yr, hr = rmsnorm_ref(x, w, EPS, r)
    cos, sin = rope_tables(32, D)
    qkv = randn((t, (HQ + 2 * HKV) * D), gen)
    pos = torch.tensor([0, 5, 31])
    slots = torch.tensor([3, -1, 17])
    kc = torch.full((4, 16, HKV, D), float("nan"))
    vc, kr, vr = kc.clone(), kc.clone(), kc.clone()
    q, k, v = kern.rope_store(qkv, pos, cos, sin, kc, vc, slots, HQ, HKV, D)
    q2, k2, v2 = rope_store_ref(qkv, pos, cos, sin, kr, vr, slots, HQ, HKV, D)
    gu = randn((t, 2 * INTER), gen)
    a = kern.silu_mul(gu)
    ok = (all(v_ == "triton" for v_ in labels.values()) and torch.equal(h, hr) and rel_err(y, yr) < FP32_TOL
          and _same(q, q2) and _same(k, k2) and _same(v, v2) and _same(kc, kr) and _same(vc, vr)
          and rel_err(a, silu_mul_ref(gu)) < FP32_TOL)
    names = sorted({r.name for r in kern.timer._pending})
    ok = ok and names == ["rmsnorm", "rope_store", "silu_mul"]
    return [{"name": f"dispatch labels={labels} timed={names}", "exact": bool(ok)}]


_CASES = {"rmsnorm": _case_rmsnorm, "rope_store": _case_rope_store, "silu_mul": _case_silu_mul,
          "dispatch": _case_dispatch}


def _run_child(family: str) -> dict:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, __file__, family], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def _check(res: dict) -> None:
    seed = res["seed"]
    assert res["results"], "no cases ran"
    for r in res["results"]:
        where = f"{r['name']} (seed {seed})"
        if "exact" in r:
            assert r["exact"], f"not bit-identical to the reference: {where}"
            if "all_written" in r:
                assert r["all_written"], f"unwritten/NaN output or stray pool write: {where}"
            continue
        assert r["all_written"], f"unwritten/NaN output or modified input: {where}"
        assert r.get("exact_parts", True), f"new residual not bit-identical: {where}"
        assert r["rel_err"] < r["tol"], f"rel err {r['rel_err']:.3g} >= {r['tol']}: {where}"


needs_triton = pytest.mark.skipif(not HAS_TRITON or torch is None, reason="triton/torch not installed")


@needs_triton
@pytest.mark.parametrize("family", sorted(_CASES))
def test_interpreter(family):
    _check(_run_child(family))


# --------------------------------------------------------------------------------------------
# The references against the model's unfused pieces (plain torch, this process)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_refs_match_model_pieces(dtype):
    """rmsnorm_ref / rope_store_ref / silu_mul_ref are bit-identical to the unfused pieces engine/model.py
    used before the fusion (h = h + o; rmsnorm(h) * w / apply_rope x2 + store_kv / F.silu(gate) * up)."""
    import torch.nn.functional as F

    from engine.model import apply_rope
    from kernels.kv_store_ref import store_kv_ref
    from kernels.rmsnorm_ref import rmsnorm_ref
    from kernels.rope_store_ref import rope_store_ref
    from kernels.silu_mul_ref import silu_mul_ref

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    t = 23
    def unfused_rmsnorm(x, w):  # the model's RMSNorm before fusion: normalise in fp32, cast, scale
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w

    h, o, w = randn((t, HIDDEN), gen, dt), randn((t, HIDDEN), gen, dt), randn((HIDDEN,), gen, dt)
    h2 = h + o
    y, nh = rmsnorm_ref(o, w, EPS, residual=h)
    assert torch.equal(nh, h2) and torch.equal(y, unfused_rmsnorm(h2, w)), f"seed {seed}"
    y0, none = rmsnorm_ref(h, w, EPS)
    assert none is None and torch.equal(y0, unfused_rmsnorm(h, w)), f"seed {seed}"

    cos, sin = rope_tables(256, D)
    qkv = randn((t, (HQ + 2 * HKV) * D), gen, dt)
    pos = torch.randint(0, 256, (t,), generator=gen)
    slots = make_slots(t, 4, 16, gen)
    kc = torch.full((4, 16, HKV, D), float("nan"), dtype=dt)
    vc, kr, vr = kc.clone(), kc.clone(), kc.clone()
    q, k, v = rope_store_ref(qkv, pos, cos, sin, kc, vc, slots, HQ, HKV, D)
    qm = apply_rope(qkv[:, : HQ * D].view(t, HQ, D), cos[pos], sin[pos])
    km = apply_rope(qkv[:, HQ * D: (HQ + HKV) * D].view(t, HKV, D), cos[pos], sin[pos])
    vm = qkv[:, (HQ + HKV) * D:].view(t, HKV, D)
    store_kv_ref(km, vm, kr, vr, slots)
    assert torch.equal(q, qm) and torch.equal(k, km) and torch.equal(v, vm), f"seed {seed}"
    assert _same(kc, kr) and _same(vc, vr), f"seed {seed}"

    gu = randn((t, 2 * INTER), gen, dt)
    gate, up = gu.chunk(2, dim=-1)
    assert torch.equal(silu_mul_ref(gu), F.silu(gate) * up), f"seed {seed}"


# --------------------------------------------------------------------------------------------
# GPU tests
# --------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs CUDA + Triton")
GPU_T = [1, 37, 8195]


def _mismatch(a, b) -> str:
    diff = (a.float() - b.float()).abs()
    return f"{int((a != b).sum())}/{a.numel()} elements differ, max abs diff {float(diff.max()):.3g}"


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("t", GPU_T)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_rmsnorm(dtype, t, residual):
    from kernels.rmsnorm_ref import rmsnorm_ref
    from kernels.rmsnorm_triton import rmsnorm_triton

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    x, w = randn((t, HIDDEN), gen, dt, "cuda"), randn((HIDDEN,), gen, dt, "cuda")
    r = randn((t, HIDDEN), gen, dt, "cuda") if residual else None
    y, h = rmsnorm_triton(x, w, EPS, r)
    yr, hr = rmsnorm_ref(x, w, EPS, r)
    assert bool(torch.isfinite(y).all()), f"seed {seed}"
    if residual:
        assert torch.equal(h, hr), f"new residual: {_mismatch(h, hr)} (seed {seed})"
    else:
        assert h is None
    # Only the order of the sum of squares differs from torch (an fp32 ulp of the row's scale):
    # in bf16 that flips the rounding of the rare element on a boundary (an ulp, two at most once
    # multiplied by w).
    rtol, atol = (2 ** -6, 1e-6) if dt == torch.bfloat16 else (1e-5, 1e-6)
    torch.testing.assert_close(y, yr, rtol=rtol, atol=atol, msg=lambda m: f"{m}\n{_mismatch(y, yr)} (seed {seed})")
    assert rel_err(y, yr) < (1e-3 if dt == torch.bfloat16 else FP32_TOL), f"{_mismatch(y, yr)} (seed {seed})"


@pytest.mark.parametrize("t", GPU_T)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_rope_store(dtype, t):
    """Bit-identical to apply_rope + store_kv (FMA contraction is off in the kernel)."""
    from kernels.rope_store_ref import rope_store_ref
    from kernels.rope_store_triton import rope_store_triton

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    bs, max_len = 16, 16384
    cos, sin = rope_tables(max_len, D, device="cuda")
    nb = t // bs + 50
    qkv = randn((t, (HQ + 2 * HKV) * D), gen, dt, "cuda")
    pos = torch.randint(0, max_len, (t,), generator=gen).cuda()
    slots = make_slots(t, nb, bs, gen, 0.1).cuda()
    # Head-major, as the engine's CUDA pool (engine/kv_pool.py).
    kc, vc, kr, vr = (make_pool(nb, bs, HKV, D, dt, "cuda", head_major=True, fill=float("nan")) for _ in range(4))
    q, k, v = rope_store_triton(qkv, pos, cos, sin, kc, vc, slots, HQ, HKV, D)
    q2, k2, v2 = rope_store_ref(qkv, pos, cos, sin, kr, vr, slots, HQ, HKV, D)
    assert torch.equal(q, q2), f"q: {_mismatch(q, q2)} (seed {seed})"
    assert torch.equal(k, k2), f"k: {_mismatch(k, k2)} (seed {seed})"
    assert torch.equal(v, v2)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True, msg=f"k_cache (seed {seed})")
    torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True, msg=f"v_cache (seed {seed})")


@pytest.mark.parametrize("t", GPU_T)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_silu_mul(dtype, t):
    from kernels.silu_mul_ref import silu_mul_ref
    from kernels.silu_mul_triton import silu_mul_triton

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    gu = (randn((t, 2 * INTER), gen, torch.float32) * 3).to(dt).cuda()
    y, yr = silu_mul_triton(gu), silu_mul_ref(gu)
    assert bool(torch.isfinite(y).all()), f"seed {seed}"
    # Same ops as torch's CUDA silu (expf, IEEE division) and mul: expected bit-identical; the
    # tolerance only allows an ulp should libdevice's expf and torch's differ somewhere.
    rtol = 2 ** -6 if dt == torch.bfloat16 else 1e-6
    torch.testing.assert_close(y, yr, rtol=rtol, atol=1e-6, msg=lambda m: f"{m}\n{_mismatch(y, yr)} (seed {seed})")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_cuda_graph_fused(dtype):
    """add+rmsnorm -> rope_store -> silu_mul through `Kernels`, captured once at a decode bucket
    and replayed on new data, positions and slots (one padding row with slot -1)."""
    from kernels.dispatch import Kernels
    from kernels.rmsnorm_ref import rmsnorm_ref
    from kernels.rope_store_ref import rope_store_ref
    from kernels.silu_mul_ref import silu_mul_ref

    dt = getattr(torch, dtype)
    seed, gen = _new_gen()
    kern = Kernels("triton", torch.device("cuda"), profile=True)
    assert all(kern.label(f) == "triton" for f in ("rmsnorm", "rope_store", "silu_mul"))
    b, bs, max_len = 8, 16, 4096
    nb = 64
    cos, sin = rope_tables(max_len, D, device="cuda")
    w = randn((HIDDEN,), gen, dt, "cuda")
    s_x = torch.zeros(b, HIDDEN, dtype=dt, device="cuda")
    s_res = torch.zeros(b, HIDDEN, dtype=dt, device="cuda")
    s_qkv = torch.zeros(b, (HQ + 2 * HKV) * D, dtype=dt, device="cuda")
    s_gu = torch.zeros(b, 2 * INTER, dtype=dt, device="cuda")
    s_pos = torch.zeros(b, dtype=torch.int64, device="cuda")
    s_slots = torch.full((b,), -1, dtype=torch.int64, device="cuda")
    kc, vc = (make_pool(nb, bs, HKV, D, dt, "cuda", head_major=True, fill=0.0) for _ in range(2))  # as the engine's

    def step():
        y, h = kern.rmsnorm(s_x, w, EPS, residual=s_res)
        q, k, v = kern.rope_store(s_qkv, s_pos, cos, sin, kc, vc, s_slots, HQ, HKV, D)
        a = kern.silu_mul(s_gu)
        return y, h, q, k, a

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    kern.timer.drain()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    for _ in range(3):
        s_x.copy_(randn((b, HIDDEN), gen, dt))
        s_res.copy_(randn((b, HIDDEN), gen, dt))
        s_qkv.copy_(randn((b, (HQ + 2 * HKV) * D), gen, dt))
        s_gu.copy_(randn((b, 2 * INTER), gen, dt))
        s_pos.copy_(torch.randint(0, max_len, (b,), generator=gen))
        slots = torch.randperm(nb * bs, generator=gen)[:b]
        slots[0] = -1
        s_slots.copy_(slots)
        kc.fill_(float("nan"))
        vc.fill_(float("nan"))
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        y, h, q, k, a = outs
        yr, hr = rmsnorm_ref(s_x, w, EPS, s_res)
        kr, vr = torch.full_like(kc, float("nan")), torch.full_like(vc, float("nan"))
        q2, k2, _ = rope_store_ref(s_qkv, s_pos, cos, sin, kr, vr, s_slots, HQ, HKV, D)
        assert torch.equal(h, hr), f"seed {seed}"
        assert rel_err(y, yr) < (1e-3 if dt == torch.bfloat16 else FP32_TOL), f"seed {seed}"
        assert torch.equal(q, q2) and torch.equal(k, k2), f"seed {seed}"
        torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True, msg=f"k_cache (seed {seed})")
        torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True, msg=f"v_cache (seed {seed})")
        ar = silu_mul_ref(s_gu)
        assert bool(torch.isfinite(a).all()), f"seed {seed}"
        assert rel_err(a, ar) < (1e-3 if dt == torch.bfloat16 else FP32_TOL), f"seed {seed}"


if __name__ == "__main__":
    # Child-process entry: `TRITON_INTERPRET=1 python tests/test_fused_kernels.py <family> [seed]`.
    fam = sys.argv[1]
    seed, gen = _new_gen(int(sys.argv[2]) if len(sys.argv) > 2 else None)
    torch.set_num_threads(2)
    print(json.dumps({"family": fam, "seed": seed, "results": _CASES[fam](gen)}))
