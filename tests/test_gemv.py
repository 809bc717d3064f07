"""The small-M Triton GEMV (`kernels/gemv_triton.py`) against F.linear, and programmatic dependent
launch (PDL) through a whole decode chain of our kernels.

CPU: the kernel runs under TRITON_INTERPRET=1 in a child process (`python tests/test_gemv.py`), fp32,
random inputs, NaN-poisoned outputs, shapes whose N is not a multiple of the column tile and whose
K is not a power of two, M = 1..8.

GPU (`@pytest.mark.gpu`): SmolLM2's projections in bf16 and fp32 with and without PDL; then one
decode layer (RMSNorm + residual, QKV, RoPE + KV store, paged attention with split-KV, O, RMSNorm,
gate_up, SiLU, down) captured in a CUDA graph with every kernel PDL-launched, replayed on new inputs:
bit-identical to the same chain launched without PDL (PDL changes when a kernel starts, never what
it computes).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
INTERPRETER_SHAPES = [(1, 37, 24), (3, 64, 96), (8, 17, 33), (5, 130, 64)]  # (M, N, K)


def _randn(shape, gen, dtype=torch.float32, device="cpu"):
    x = torch.randn(shape, generator=gen)
    return torch.where(x == 0, torch.full_like(x, 0.5), x).to(dtype).to(device)


def _rel_err(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _child() -> None:
    """Runs under TRITON_INTERPRET=1: prints one JSON line of results."""
    import kernels.gemv_triton as mod

    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    res = []
    for m, n, k in INTERPRETER_SHAPES:
        for bn in (1, 4, 16):
            x, w = _randn((m, k), gen), _randn((n, k), gen)
            out = torch.full((m, n), float("nan"))
            y = mod.gemv_triton(x, w, block_n=bn, out=out)
            ref = F.linear(x, w)
            res.append({"name": f"M={m} N={n} K={k} block_n={bn}", "finite": bool(torch.isfinite(y).all()),
                        "rel_err": _rel_err(y, ref)})
    print(json.dumps({"seed": seed, "results": res}))


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_gemv_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert len(out["results"]) == 3 * len(INTERPRETER_SHAPES)
    for r in out["results"]:
        assert r["finite"], f"unwritten output: {r['name']} (seed {out['seed']})"
        assert r["rel_err"] < 1e-6, f"{r['name']}: rel err {r['rel_err']:.3g} (seed {out['seed']})"


def test_dispatch_uses_gemv_for_small_batches_only() -> None:
    from kernels.gemv_triton import MAX_M, MAX_N, gemv_applies

    w = torch.empty(960, 576)
    assert gemv_applies(torch.empty(1, 576), w) and gemv_applies(torch.empty(MAX_M, 576), w)
    assert not gemv_applies(torch.empty(MAX_M + 1, 576), w)  # prefill: cuBLAS
    assert not gemv_applies(torch.empty(1, 576), torch.empty(MAX_N + 1, 576))  # the LM head: cuBLAS


gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs CUDA + Triton")
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_gemv(dtype, m, pdl) -> None:
    from kernels.gemv_triton import gemv_triton

    torch.backends.cuda.matmul.allow_tf32 = False
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for name, (n, k) in SHAPES.items():
        x, w = _randn((m, k), gen, dt, "cuda"), _randn((n, k), gen, dt, "cuda") * 0.05
        y = gemv_triton(x, w, pdl=pdl)
        ref = F.linear(x.double(), w.double())
        tol = 1e-2 if dt == torch.bfloat16 else 1e-6  # bf16: one rounding of the output
        assert _rel_err(y, ref) < tol, f"{name}: {_rel_err(y, ref):.3g}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@gpu
@needs_cuda
def test_gpu_pdl_decode_layer_in_graph(dtype) -> None:
    from kernels.dispatch import Kernels
    from kernels.pdl import pdl_supported

    if not pdl_supported(torch.device("cuda")):
        pytest.skip("PDL needs sm_90+")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    hq, hkv, d, hidden, bs, nb, b = 9, 3, 64, 576, 16, 256, 4
    wts = {name: _randn(shape, gen, dt, "cuda") * 0.05 for name, shape in SHAPES.items()}
    n1, n2 = 1 + 0.1 * _randn((hidden,), gen, dt, "cuda"), 1 + 0.1 * _randn((hidden,), gen, dt, "cuda")
    pos_max = 2048
    inv = 1.0 / (1e5 ** (torch.arange(0, d, 2, dtype=torch.float32, device="cuda") / d))
    ang = torch.arange(pos_max, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
    # Inputs the graph reads (rewritten before each replay) and a pool with long contexts.
    h = torch.zeros(b, hidden, dtype=dt, device="cuda")
    res = torch.zeros_like(h)
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    tables = torch.zeros(b, 64, dtype=torch.int32, device="cuda")
    pos = torch.zeros(b, dtype=torch.int64, device="cuda")
    slots = torch.zeros(b, dtype=torch.int64, device="cuda")
    qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")

    def layer(kern: Kernels, kc, vc):
        x, r = kern.rmsnorm(h, n1, 1e-5, res)
        q, _, _ = kern.rope_store(kern.linear("qkv", x, wts["qkv"]), pos, cos, sin, kc, vc, slots, hq, hkv, d)
        a = kern.paged_attention(q, kc, vc, tables, lens, qsl, 1, 1024, d ** -0.5, [1] * b, [1] * b)
        o = kern.linear("o", a.reshape(b, hq * d), wts["o"])
        x, r = kern.rmsnorm(o, n2, 1e-5, r)
        return kern.linear("down", kern.silu_mul(kern.linear("gate_up", x, wts["gate_up"])), wts["down"]), r

    outs = {}
    for pdl in (False, True):
        kern = Kernels("triton", torch.device("cuda"), profile=False, pdl=pdl)
        assert kern.pdl == pdl
        pool = torch.randn(2, nb, bs, hkv, d, generator=torch.Generator().manual_seed(7)).to(dt).cuda()
        kc, vc = pool[0], pool[1]
        for t in (h, res, lens, tables, pos):  # the previous run left its last trial's inputs
            t.zero_()
        slots.fill_(-1)  # the warm-up and capture runs store nothing into the pool
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(kern, kc, vc)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = layer(kern, kc, vc)
        got = []
        for trial in range(3):
            g2 = torch.Generator().manual_seed(100 + trial)
            h.copy_(_randn((b, hidden), g2, dt, "cuda"))
            res.copy_(_randn((b, hidden), g2, dt, "cuda"))
            ctx = torch.randint(200, 1024, (b,), generator=g2)
            lens.copy_(ctx.to(torch.int32))
            tables.copy_(torch.randperm(nb, generator=g2)[: b * 64].view(b, 64).to(torch.int32))
            pos.copy_(ctx - 1)
            slots.copy_(torch.tensor([int(tables[i, (c - 1) // bs]) * bs + (c - 1) % bs for i, c in enumerate(ctx.tolist())]))
            g.replay()
            torch.cuda.synchronize()
            got.append((out[0].clone(), out[1].clone(), pool.clone()))
        outs[pdl] = got
    for (a0, a1, ap), (b0, b1, bp) in zip(outs[False], outs[True]):
        assert torch.equal(a0, b0) and torch.equal(a1, b1) and torch.equal(ap, bp)
        assert bool(torch.isfinite(a0).all())


if __name__ == "__main__":
    _child()
