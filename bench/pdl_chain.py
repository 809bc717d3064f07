"""Does programmatic dependent launch (PDL) make batch-1 decode kernels cheaper? (H200)

Everything is captured in a CUDA graph and replayed, as the engine's decode step is; 30 distinct
weight sets so nothing is served from L2 between uses.

1. Single projections of SmolLM2 at M = 1: cuBLAS (F.linear) against `kernels.gemv_triton` with and
   without PDL, for several column-tile widths (30 launches of the same shape in a row).
2. The non-attention part of 30 decoder layers (RMSNorm + residual, QKV, O, RMSNorm + residual,
   gate_up, SiLU-mul, down): cuBLAS + our norms, Triton GEMV without PDL, and every kernel with PDL.
   (Its "rel_err_vs_cublas" is bf16 rounding carried through 30 random layers; each projection
   alone matches F.linear, and the engine's fp32 tokens are identical: tests/test_engine_gpu.py.)

`python3 bench/pdl_chain.py --out bench/results/pdl_chain_h200.json`
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.results_io import write_results  # noqa: E402
from kernels.gemv_triton import gemv_triton  # noqa: E402
from kernels.rmsnorm_triton import rmsnorm_triton  # noqa: E402
from kernels.silu_mul_triton import silu_mul_triton  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
LAYERS = 30


def graph_time_us(fn, replays: int = 200) -> float:
    """Mean wall time of one replay of a CUDA graph of `fn`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / replays


def single_projections(dtype: torch.dtype) -> list[dict]:
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = 4 if name == "lm_head" else LAYERS
        ws = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.05 for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=dtype)
        ref = F.linear(x, ws[0])
        err = float((gemv_triton(x, ws[0]) - ref).abs().max() / ref.abs().max())
        t_cublas = graph_time_us(lambda: [F.linear(x, w) for w in ws]) / copies
        rows.append({"shape": name, "N": n, "K": k, "impl": "cuBLAS", "block_n": None, "us": round(t_cublas, 2)})
        for bn in (1, 2, 4, 8, 16, 32):
            for pdl in (False, True):
                outs = [torch.empty(1, n, device="cuda", dtype=dtype) for _ in ws]
                t = graph_time_us(lambda: [gemv_triton(x, w, pdl=pdl, block_n=bn, out=o) for w, o in zip(ws, outs)])
                rows.append({"shape": name, "N": n, "K": k, "impl": "gemv" + (" +PDL" if pdl else ""),
                             "block_n": bn, "us": round(t / copies, 2), "rel_err": err})
        best = min((r for r in rows if r["shape"] == name and r["impl"] != "cuBLAS"), key=lambda r: r["us"])
        print(f"{name:8s} cuBLAS {t_cublas:6.2f}  best gemv {best['us']:6.2f} us ({best['impl']}, block_n {best['block_n']})",
              flush=True)
    return rows


def random_layers(rand: Callable[..., torch.Tensor]) -> list[dict]:
    """30 layers' norm scales and projection weights of SmolLM2's shapes, from `rand(*shape)`."""
    return [dict(n1=1 + rand(576), qkv=rand(960, 576), o=rand(576, 576), n2=1 + rand(576),
                 gu=rand(3072, 576), down=rand(576, 1536)) for _ in range(LAYERS)]


def decoder_chain(layers: list[dict], h0: torch.Tensor, r0: torch.Tensor, mode: str) -> torch.Tensor:
    """The non-attention part of the layers on rows h0 (residual r0): projections by cuBLAS ("cublas") or the
    Triton GEMV ("gemv"), or every kernel PDL-launched ("gemv+pdl"). Shared with bench/small_m_chain.py."""
    pdl = mode == "gemv+pdl"
    lin = F.linear if mode == "cublas" else (lambda x, w: gemv_triton(x, w, pdl=pdl))
    h, res = h0, r0
    for L in layers:
        x, res = rmsnorm_triton(h, L["n1"], 1e-5, res, pdl=pdl)
        qkv = lin(x, L["qkv"])
        attn = qkv[:, :576]  # stands in for RoPE + attention (not part of this comparison)
        o = lin(attn, L["o"])
        x, res = rmsnorm_triton(o, L["n2"], 1e-5, res, pdl=pdl)
        h = lin(silu_mul_triton(lin(x, L["gu"]), pdl=pdl), L["down"])
    return h


def layer_chain(dtype: torch.dtype) -> list[dict]:
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype) * 0.05

    layers = random_layers(rand)
    h0, r0 = rand(1, 576), rand(1, 576)

    def run(mode: str):
        return decoder_chain(layers, h0, r0, mode)

    outs = {m: run(m) for m in ("cublas", "gemv", "gemv+pdl")}
    rows = []
    for mode in ("cublas", "gemv", "gemv+pdl"):
        t = graph_time_us(lambda: run(mode))
        err = float((outs[mode].float() - outs["cublas"].float()).abs().max() / outs["cublas"].float().abs().max())
        rows.append({"mode": mode, "us_per_30_layers": round(t, 1), "us_per_layer": round(t / LAYERS, 2),
                     "kernels_per_layer": 7, "rel_err_vs_cublas": err})
        print(f"chain {mode:9s} {t:8.1f} us / 30 layers = {t / LAYERS:6.2f} us per layer (rel err {err:.3g})", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="bench/results/pdl_chain_h200.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    result = {"device": torch.cuda.get_device_name(), "dtype": args.dtype,
              "chain": layer_chain(dtype), "single": single_projections(dtype)}
    write_results(args.out, result)


if __name__ == "__main__":
    main()
