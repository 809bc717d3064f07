"""The fused low-bit decode kernel (`kernels/paged_decode_quant_triton.py`) against its torch reference.

CPU: the kernel runs under TRITON_INTERPRET=1 in a child process (this file run as a script, which
prints one JSON line), since the interpreter must be switched on before Triton is imported. Random
pools, queries and shuffled block tables every run (the seed is in the failure message;
`python tests/test_quant_decode_kernel.py SEED` replays a run). Every format, split and unsplit,
contexts that end mid-page and mid-tile, outputs poisoned with NaN before the call; fp32 only, as
Triton 3.6's interpreter garbles bf16 tiles (the engine's own paged kernel's too).

GPU (`@pytest.mark.gpu`): SmolLM2's decode shape in bf16 at long contexts, split and unsplit.

The reference dequantizes into the query's dtype before attending, the kernel folds per-row scales
out of its products: in fp32 the two agree to rounding (1e-4 relative); in bf16 within bf16's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_kernels import make_paged, ref_tables, rel_err

ROOT = Path(__file__).resolve().parents[1]

HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
FORMATS = ("bf16", "fp8", "int8", "int4")
FP32_TOL = 1e-4
BF16_TOL = 1e-2


def _case(fmt: str, ctx: list[int], splits: int | None, dtype: torch.dtype, device: str, gen,
          hq: int = 9, hkv: int = 3, d: int = 64, page: int = 16) -> dict:
    from kernels.paged_decode_quant_ref import paged_decode_quant_ref
    from kernels.paged_decode_quant_triton import decode_splits, paged_decode_quant_triton
    from kernels.quant_kv_pool import quantize_pool

    q, kc, vc, tables, seq_lens, _ = make_paged(ctx, [1] * len(ctx), hq, hkv, d, page, dtype, device, gen,
                                                head_major=True)
    pool = quantize_pool(kc, vc, fmt)
    max_seq = max(ctx) + int(torch.randint(0, 40, (1,), generator=gen))  # a graph bucket past every context
    scale = d ** -0.5
    out = torch.full_like(q, float("nan"))
    paged_decode_quant_triton(q, pool, tables, seq_lens, max_seq, scale, splits=splits, out=out)
    ref = paged_decode_quant_ref(q, pool, ref_tables(tables, ctx, page), seq_lens, max_seq, scale)
    used = splits if splits is not None else decode_splits(len(ctx), hq, hkv, max_seq, q.device)
    return {"name": f"{fmt} ctx={ctx} splits={used} {dtype}", "format": fmt, "splits": used,
            "all_written": bool(torch.isfinite(out).all()), "rel_err": rel_err(out, ref),
            "tol": FP32_TOL if dtype == torch.float32 else BF16_TOL}


def interpreter_cases(gen) -> list[dict]:
    results = []
    for fmt in FORMATS:
        ctx = torch.randint(1, 90, (3,), generator=gen).tolist()
        ctx[0] = int(torch.randint(50, 90, (1,), generator=gen))  # several tiles of 16 keys
        results.append(_case(fmt, ctx, None, torch.float32, "cpu", gen))  # the plan splits these
        results.append(_case(fmt, ctx, 1, torch.float32, "cpu", gen))
    results.append(_case("int4", [37, 5], 3, torch.float32, "cpu", gen))  # splits that own no key
    results.append(_case("fp8", [64], 2, torch.float32, "cpu", gen, hq=4, hkv=2, d=32))
    return results


def _check(r: dict, seed: int) -> None:
    where = f"{r['name']} (seed {seed})"
    assert r["all_written"], f"unwritten or NaN output: {where}"
    assert r["rel_err"] < r["tol"], f"relative error {r['rel_err']:.3g} >= {r['tol']}: {where}"


@pytest.fixture(scope="module")
def interpreted() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_every_format_matches_the_reference_under_the_interpreter(interpreted):
    assert {r["format"] for r in interpreted["results"]} == set(FORMATS)
    assert any(r["splits"] > 1 for r in interpreted["results"]), "no case exercised split-KV and its merge"
    for r in interpreted["results"]:
        _check(r, interpreted["seed"])


def test_pool_keeps_the_lab_formats_bytes():
    """The pool holds what the KV compression lab's formats store: INT4 is a quarter of BF16's codes plus
    a scale and a zero point per 32 numbers; INT8 and FP8 half plus one scale a row."""
    from kernels.quant_kv_pool import quantize_pool

    k = torch.randn(5, 16, 3, 64)
    sizes = {f: quantize_pool(k, k, f).bytes_per_token() for f in FORMATS}
    assert sizes == {"bf16": 2 * 3 * 128, "fp8": 2 * 3 * (64 + 2), "int8": 2 * 3 * (64 + 2),
                     "int4": 2 * 3 * (32 + 2 * 2 * 2)}
    pool = quantize_pool(k, k, "int4")
    assert pool.head_dim == 64 and pool.page_size == 16 and pool.kv_heads == 3
    back, _ = pool.dequantized(torch.float32)
    assert back.shape == k.shape
    assert float((back - k).abs().max()) < float(k.abs().max()) / 7  # 16 levels over each group's range


def test_formats_the_kernel_cannot_read_are_refused():
    from kernels.quant_kv_pool import quantize_pool

    k = torch.randn(2, 16, 3, 64)
    with pytest.raises(ValueError, match="int2-kivi"):
        quantize_pool(k, k, "int2-kivi")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs CUDA + Triton")
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_real_shapes(fmt):
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    for ctx, splits in (([4096, 1000, 17, 2500], None), ([300, 8000], 1), ([16384] * 8, None)):
        r = _case(fmt, ctx, splits, torch.bfloat16, "cuda", gen)
        _check(r, seed)


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else int.from_bytes(os.urandom(4), "little")
    torch.set_num_threads(2)
    print(json.dumps({"seed": seed, "results": interpreter_cases(torch.Generator().manual_seed(seed))}))
