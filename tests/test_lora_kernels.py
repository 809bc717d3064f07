"""Batched multi-LoRA kernel (`kernels/lora_triton.py`) against the torch reference (`kernels/lora_ref.py`).

CPU: the kernels run under TRITON_INTERPRET=1, which must be set before Triton is imported, so all
interpreter cases run in one child process (this file run as a script) that prints one JSON line;
each test checks its case's entry. Random inputs every run (the seed is in the failure message;
`python tests/test_lora_kernels.py SEED` replays a run).

GPU (`@pytest.mark.gpu`, skipped without CUDA): SmolLM2's four fused projection groups at real
shapes in bf16 and fp32, with and without PDL, and a CUDA-graph capture whose slots buffer changes
between replays.

Checks everywhere: rows with slot -1 keep their bits; fp32 within 1e-5 of the reference relative to
the update's scale; bf16 within 2^-5 of |ref| + |update| per element (an update an ulp off after a different fp32
summation order, then the sum's rounding, can reach just over 2^-6 where y and the update cancel; the
interpreter truncates where the GPU rounds to nearest even. On the GPU, where the rounding is torch's,
nearly every element must also be bit-identical to the reference).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
FP32_TOL = 1e-5
BF16_ELEM_TOL = 2.0 ** -5

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# --------------------------------------------------------------------------------------------
# Inputs and checks (shared by the interpreter child and the GPU tests)
# --------------------------------------------------------------------------------------------

def make_slots(t: int, s: int, pattern: str, gen, device="cpu") -> torch.Tensor:
    """[t] int32 slots: `random` (uniform in -1..s-1), `round_robin` (t % s, every 7th row -1),
    `segments` (contiguous runs, prefill-like, one run -1), `none` (all -1), or one integer."""
    if pattern == "random":
        sl = torch.randint(-1, s, (t,), generator=gen)
    elif pattern == "round_robin":
        sl = torch.arange(t) % s
        sl[3::7] = -1
    elif pattern == "segments":
        cuts = sorted(torch.randint(1, max(2, t), (min(s + 1, max(t - 1, 1)),), generator=gen).tolist())
        sl = torch.empty(t, dtype=torch.long)
        bounds = [0, *cuts, t]
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            sl[a:b] = -1 if i == 1 else i % s
    elif pattern == "none":
        sl = torch.full((t,), -1)
    else:
        sl = torch.full((t,), int(pattern))
    return sl.to(torch.int32).to(device)


def make_inputs(t, s, r, k, n, dtype, gen, device="cpu"):
    """Random y0 [t, n], x [t, k], A [s, r, k], B [s, n, r] (B scaled so the update is about as big as y)."""
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    return rand(t, n), rand(t, k), rand(s, r, k, scale=k ** -0.5), rand(s, n, r, scale=r ** -0.5)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def compare(out: torch.Tensor, ref: torch.Tensor, y0: torch.Tensor, slots: torch.Tensor) -> dict:
    """Metrics of one call: untouched rows bitwise equal, error of the adapted rows."""
    skip = (slots < 0).to(out.device)
    res = {"untouched_ok": bool(torch.equal(bits(out[skip]), bits(y0[skip]))),
           "finite": bool(torch.isfinite(out).all()),
           "identical_frac": float((bits(out) == bits(ref)).float().mean())}
    o, r, y = out.double(), ref.double(), y0.double()
    upd = r - y
    if out.dtype == torch.float32:
        scale = float(upd.abs().max()) + float(y.abs().max()) * 2.0 ** -23 + 1e-30
        res["err"] = float((o - r).abs().max()) / scale
        res["tol"] = FP32_TOL
    else:
        res["err"] = float(((o - r).abs() / (r.abs() + upd.abs() + 1e-30)).max())
        res["tol"] = BF16_ELEM_TOL
    res["moved"] = bool((upd[~skip].abs() > 0).any()) if bool((~skip).any()) else True  # the update was applied
    return res


def run_case(name, t, s, r, k, n, dtype, pattern, gen, device="cpu", strided=False, pdl=False, fused=None) -> dict:
    from kernels.lora_ref import lora_apply_ref
    from kernels.lora_triton import lora_apply_triton

    y0, x, A, B = make_inputs(t, s, r, k, n, dtype, gen, device)
    slots = make_slots(t, s, pattern, gen, device)
    if strided:  # y and x as column windows of wider buffers, A and B rank-sliced from wider stacks
        big_y = torch.randn(t, n + 9, generator=gen).to(dtype).to(device)
        big_y[:, 4:4 + n] = y0
        before = big_y.clone()
        y = big_y[:, 4:4 + n]
        big_x = torch.randn(t, k + 5, generator=gen).to(dtype).to(device)
        big_x[:, 5:] = x
        x = big_x[:, 5:]
        A = torch.cat([A, A[:, :3]], 1)[:, :r]
        B = torch.cat([B, B[..., :2]], 2)[..., :r]
        assert not A.is_contiguous() or r <= 3
    else:
        y = y0.clone()
    out = lora_apply_triton(y, x, A, B, slots, pdl=pdl, fused=fused)
    assert out.data_ptr() == y.data_ptr()
    ref = lora_apply_ref(y0.clone(), x, A, B, slots)
    res = {"name": name, **compare(out, ref, y0, slots)}
    if strided:
        outside = torch.ones_like(big_y, dtype=torch.bool)
        outside[:, 4:4 + n] = False
        res["untouched_ok"] &= bool(torch.equal(bits(big_y[outside]), bits(before[outside])))
    return res


def check(res: dict, seed) -> None:
    where = f"{res['name']} (seed {seed})"
    assert res["untouched_ok"], f"rows with slot -1 (or memory outside y) changed: {where}"
    assert res["finite"], f"non-finite output: {where}"
    assert res["moved"], f"adapted rows unchanged: {where}"
    assert res["err"] < res["tol"], f"error {res['err']:.3g} >= {res['tol']}: {where}"


# --------------------------------------------------------------------------------------------
# Interpreter cases (one child process with TRITON_INTERPRET=1)
# --------------------------------------------------------------------------------------------

# name -> (T, S, R, K, N, dtype, slot pattern, strided). Small shapes; R not a power of two; K and N
# not multiples of the tiles; T on both sides of the tile regimes of `lora_config` (<= 16, <= 64,
# <= 128, <= 512, several chunks of 256), K long enough to be split.
CPU_CASES = {
    "t1_fp32": (1, 3, 5, 40, 24, "float32", "1", False),
    "t1_bf16": (1, 3, 5, 40, 24, "bfloat16", "2", False),
    "t1_skip_fp32": (1, 3, 5, 40, 24, "float32", "none", False),
    "t13_random_fp32": (13, 4, 12, 70, 40, "float32", "random", False),
    "t37_random_fp32": (37, 4, 12, 70, 40, "float32", "random", False),
    "t37_random_bf16": (37, 4, 12, 70, 40, "bfloat16", "random", False),
    "t5_split_k_fp32": (5, 2, 12, 600, 24, "float32", "random", False),  # K in 3 partial sums
    "t100_split_k_bf16": (100, 6, 20, 300, 50, "bfloat16", "random", False),
    "t17_one_slot_fp32": (17, 1, 4, 24, 33, "float32", "0", False),
    "t200_round_robin_fp32": (200, 5, 40, 33, 70, "float32", "round_robin", False),
    "t200_round_robin_bf16": (200, 5, 40, 33, 70, "bfloat16", "round_robin", False),
    "t300_segments_bf16": (300, 3, 20, 72, 130, "bfloat16", "segments", False),
    "t300_random_fp32": (300, 6, 48, 20, 24, "float32", "random", False),
    "t1100_segments_bf16": (1100, 3, 12, 24, 40, "bfloat16", "segments", False),  # two chunks of 1024
    "t20_all_skipped_bf16": (20, 3, 12, 40, 24, "bfloat16", "none", False),
    "t29_strided_fp32": (29, 3, 12, 40, 24, "float32", "random", True),
    "t29_strided_bf16": (29, 3, 12, 40, 24, "bfloat16", "random", True),
}


# The one-launch kernel (`fused=True`; never chosen by shape, see kernels.lora_triton.FUSED_MAX_T) on these
# cases of CPU_CASES too, every regime among them; each result is named "<case>_fused".
FUSED_CASES = ("t1_bf16", "t1_fp32", "t5_split_k_fp32", "t37_random_fp32", "t37_random_bf16", "t200_round_robin_bf16",
               "t300_segments_bf16", "t29_strided_bf16", "t20_all_skipped_bf16")


def _child(seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = [run_case(name, t, s, r, k, n, DTYPES[dt], pat, gen, strided=strided)
           for name, (t, s, r, k, n, dt, pat, strided) in CPU_CASES.items()]
    for base in FUSED_CASES:
        t, s, r, k, n, dt, pat, strided = CPU_CASES[base]
        out.append(run_case(f"{base}_fused", t, s, r, k, n, DTYPES[dt], pat, gen, strided=strided, fused=True))
    return out


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    seed = int.from_bytes(os.urandom(4), "little")
    proc = subprocess.run([sys.executable, __file__, str(seed)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child failed (seed {seed}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    return {"seed": res["seed"], "by_name": {r["name"]: r for r in res["results"]}}


@pytest.mark.parametrize("name", sorted(CPU_CASES) + sorted(f"{c}_fused" for c in FUSED_CASES))
def test_interpreter(interpreter_results, name):
    check(interpreter_results["by_name"][name], interpreter_results["seed"])


def test_config_tiles_are_consistent():
    from kernels.lora_triton import lora_config

    for t in (1, 16, 17, 64, 256, 257, 2048, 8192):
        for r in (4, 5, 24, 64, 192):
            c = lora_config(t, r, 576, 3072)
            sizes = (c.chunk, c.shrink_block_m, c.shrink_block_r, c.shrink_block_k, c.expand_block_m,
                     c.expand_block_n, c.expand_block_r)
            assert all(v >= 16 and v & (v - 1) == 0 for v in sizes), c  # tl.dot needs >= 16 per dim
            assert c.chunk % c.shrink_block_m == 0 and c.chunk % c.expand_block_m == 0, c
            assert c.chunk <= max(16, 2 * t), c
            assert 1 <= c.expand_splits <= -(-3072 // c.expand_block_n), c
            assert 1 <= c.k_splits <= -(-576 // c.shrink_block_k), c
            assert c.shrink_block_r <= max(16, 2 * r), c  # no tile far wider than the rank


# --------------------------------------------------------------------------------------------
# GPU tests
# --------------------------------------------------------------------------------------------

def on_gpu(test):
    """Marked `gpu` (CI selects or skips by it) and skipped where there is no CUDA + Triton."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA or not HAS_TRITON, reason="needs CUDA + Triton")(test))


# SmolLM2-135M's fused projection groups: (K, N, targets stacked in R)
GROUPS = {"qkv": (576, 960, 3), "o": (576, 576, 1), "gate_up": (576, 3072, 2), "down": (1536, 576, 1)}


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("t", [1, 7, 256, 2048])
@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@on_gpu
def test_gpu_real_shapes(dtype, group, t, pdl):
    k, n, targets = GROUPS[group]
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    pattern = "round_robin" if t < 2048 else "segments"
    res = run_case(f"{group} T={t} {dtype} pdl={pdl}", t, 16, 64 * targets, k, n, DTYPES[dtype], pattern, gen,
                   device="cuda", pdl=pdl)
    check(res, seed)
    if dtype == "bfloat16":  # the GPU rounds as torch does: differences only from fp32 summation order
        assert res["identical_frac"] > 0.99, f"{res} (seed {seed})"


@on_gpu
def test_gpu_large_prefill_and_odd_ranks():
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    for t, r, pattern in ((8192, 24, "segments"), (8192, 192, "random"), (300, 4, "random"), (33, 100, "random")):
        check(run_case(f"gate_up T={t} R={r} {pattern}", t, 16, r, 576, 3072, torch.bfloat16, pattern, gen,
                       device="cuda"), seed)


@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("group", sorted(GROUPS))
@on_gpu
def test_gpu_one_launch_kernel_at_real_shapes(group, t):
    """The one-launch kernel, forced (never picked by shape; test_gpu_real_shapes covers the two kernels): exact at
    real shapes."""
    k, n, targets = GROUPS[group]
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    res = run_case(f"{group} T={t} one launch", t, 16, 16 * targets, k, n, torch.bfloat16, "round_robin", gen,
                   device="cuda", fused=True)
    check(res, seed)
    assert res["identical_frac"] > 0.99, f"{res} (seed {seed})"


@pytest.mark.parametrize("t, fused", [(8, True), (8, None), (64, None)])  # the one-launch kernel, the two kernels
@pytest.mark.parametrize("pdl", [False, True])
@on_gpu
def test_gpu_cuda_graph_slots_change_between_replays(pdl, t, fused):
    from kernels.lora_ref import lora_apply_ref
    from kernels.lora_triton import lora_apply_triton

    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    s, (k, n, targets) = 8, GROUPS["qkv"]
    y0, x, A, B = make_inputs(t, s, 16 * targets, k, n, torch.bfloat16, gen, "cuda")
    y = y0.clone()
    slots = make_slots(t, s, "round_robin", gen, "cuda")
    lora_apply_triton(y, x, A, B, slots, pdl=pdl, fused=fused)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lora_apply_triton(y, x, A, B, slots, pdl=pdl, fused=fused)
    for pattern in ("random", "none", "segments", "3", "round_robin"):
        new = make_slots(t, s, pattern, gen, "cuda")
        slots.copy_(new)
        y.copy_(y0)
        x.copy_(torch.randn(t, k, generator=gen).to(torch.bfloat16))
        g.replay()
        torch.cuda.synchronize()
        ref = lora_apply_ref(y0.clone(), x, A, B, new)
        res = compare(y, ref, y0, new)
        res["name"] = f"graph replay, slots {pattern}"
        if pattern == "none":
            assert torch.equal(bits(y), bits(y0)), f"all rows skipped, y changed (seed {seed})"
            continue
        check(res, seed)


if __name__ == "__main__":
    # Child-process entry: `TRITON_INTERPRET=1 python tests/test_lora_kernels.py [seed]`.
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else int.from_bytes(os.urandom(4), "little")
    print(json.dumps({"seed": seed, "results": _child(seed)}))
