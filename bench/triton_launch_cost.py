"""What a Triton launch costs the host in an eager decode step, and how much a direct call saves (CUDA only).

An eager batch-1 decode step of the engine is ~300 launches of small Triton kernels. Each goes through
`JITFunction.run` (argument binding, specialisation key, cache lookup, launch metadata) before the C
launcher. This script measures, with the GPU kept busy so only host time counts:

- per kernel (RMSNorm with residual, the GEMV of the QKV projection, at one row): our wrapper, the bare
  `kernel[grid](...)`, and the compiled kernel's C launcher called directly with the arguments already
  bound (`CompiledKernel.run`), with the current stream asked each call; torch's `add` for scale;
- the engine's eager batch-1 decode step: host time a step, Triton launches a step and the time spent
  inside `JITFunction.run`.

    python3 bench/triton_launch_cost.py
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.launch_overhead import host_us  # noqa: E402 (host time a call, the GPU kept busy)
from bench.results_io import write_results  # noqa: E402


def direct_caller(jit_fn, grid, args: tuple, kwargs: dict):
    """A zero-argument function launching the kernel `jit_fn[grid](*args, **kwargs)` compiled to, through
    its C launcher, every argument bound in advance (constexprs included, as the launcher expects)."""
    compiled = jit_fn[grid](*args, **kwargs)
    names = jit_fn.arg_names
    bound = list(args) + [kwargs[n] for n in names[len(args):]]
    g = tuple(grid) + (1,) * (3 - len(grid))

    def call() -> None:
        stream = torch.cuda.current_stream().cuda_stream
        compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None, None, *bound)
    return call


def kernel_rows(dev: torch.device) -> list[dict]:
    import triton

    from kernels import gemv_triton as gv
    from kernels import rmsnorm_triton as rn
    dt = torch.bfloat16
    x = torch.randn(1, 576, device=dev, dtype=dt)
    res = torch.randn_like(x)
    w = torch.randn(576, device=dev, dtype=dt)
    out, hout = torch.empty_like(x), torch.empty_like(x)
    rows = []

    rn_args = (x, res, w, out, hout, 1, 1e-5, 1 / 576, 576, 576, 576, 576)
    rn_kwargs = dict(H=576, BLOCK_H=1024, BLOCK_T=1, HAS_RESIDUAL=True, PRECISE=True, PDL=False, num_warps=4,
                     enable_fp_fusion=False)
    direct = direct_caller(rn._rmsnorm_kernel, (1,), rn_args, rn_kwargs)
    rows.append(dict(kernel="rmsnorm + residual, 1 row",
                     wrapper=host_us(lambda: rn.rmsnorm_triton(x, w, 1e-5, res)),
                     bare=host_us(lambda: rn._rmsnorm_kernel[(1,)](*rn_args, **rn_kwargs)),
                     direct=host_us(direct)))

    wq = torch.randn(960, 576, device=dev, dtype=dt)
    y = torch.empty(1, 960, device=dev, dtype=dt)
    bn = gv.DEFAULT_BLOCK_N
    grid = (triton.cdiv(960, bn),)
    warps = gv.gemv_num_warps(bn, 1024)
    gv_args = (x, wq, y, 1, 960, 576, 576, 960)
    gv_kwargs = dict(K=576, BLOCK_N=bn, BLOCK_K=1024, PDL=False, num_warps=warps)
    rows.append(dict(kernel="GEMV 1 x 576 -> 960 (QKV)",
                     wrapper=host_us(lambda: gv.gemv_triton(x, wq)),
                     bare=host_us(lambda: gv._gemv_kernel[grid](*gv_args, **gv_kwargs)),
                     direct=host_us(direct_caller(gv._gemv_kernel, grid, gv_args, gv_kwargs))))
    rows.append(dict(kernel="torch.add (one ATen launch, for scale)", wrapper=None, bare=host_us(lambda: torch.add(x, x)),
                     direct=None))
    return rows


def engine_step_row(dev: torch.device, profile_to: str | None = None) -> dict:
    """Host time of the engine's eager batch-1 decode steps, and the part inside `JITFunction.run`."""
    from triton.runtime import jit

    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from engine.weights import load_weights

    weights = load_weights("random")
    cfg = EngineConfig(device="cuda", dtype="bfloat16", weights="random", cuda_graphs=False, overlap_decode=False,
                       num_blocks=256, block_size=16, max_num_seqs=4, max_model_len=2048, profile_kernels=False,
                       trace_detail="light")
    engine = LLMEngine(cfg, weights)
    engine.generate(list(range(10, 200)), SamplingParams(max_tokens=8, ignore_eos=True))  # compile everything

    real_run = jit.JITFunction.run
    stats = {"calls": 0, "seconds": 0.0}

    def counted_run(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_run(self, *args, **kwargs)
        finally:
            stats["calls"] += 1
            stats["seconds"] += time.perf_counter() - t0

    engine.add_request(list(range(10, 200)), SamplingParams(max_tokens=80, ignore_eos=True))
    engine.step()  # prefill
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    steps = 60
    jit.JITFunction.run = counted_run
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        jit.JITFunction.run = real_run
    if profile_to:  # where the host time goes, function by function (cProfile inflates every call alike)
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        prof.disable()
        with open(profile_to, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(45)
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    return dict(step_ms=wall / steps * 1e3, launches_per_step=stats["calls"] / steps,
                inside_run_ms_per_step=stats["seconds"] / steps * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/triton_launch_cost.json")
    ap.add_argument("--profile", default=None, help="also write a cProfile of the eager steps to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device("cuda")
    rows = kernel_rows(dev)
    print(f"{'kernel':44} {'wrapper':>9} {'bare':>9} {'direct':>9}   (host us a call)")
    for r in rows:
        cell = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"  # noqa: E731
        print(f"{r['kernel']:44} {cell(r['wrapper'])} {cell(r['bare'])} {cell(r['direct'])}")
    step = engine_step_row(dev, args.profile)
    print(f"engine eager batch-1 decode step: {step['step_ms']:.2f} ms, {step['launches_per_step']:.0f} Triton launches, "
          f"{step['inside_run_ms_per_step']:.2f} ms inside JITFunction.run")
    write_results(args.out, dict(kernels=rows, engine_step=step, device=torch.cuda.get_device_name()))


if __name__ == "__main__":
    main()
