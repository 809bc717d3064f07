"""What one attention launch costs the host, piece by piece (CUDA only).

A prefill step runs attention eagerly between its piecewise graphs (engine/piecewise_graphs.py): 30
FlashAttention launches, and 30 paged ones when the step also continues chunks or decodes. On the
H200's host each launch measured 140-200 us (bench/overlap_host_split.py), far more than the GPU
time of the kernel. This script times, with the GPU kept busy so that only host time is measured,
back-to-back calls of:

- our wrappers through `Kernels` (dispatch, plan, scratch, the Triton launch: what the engine pays);
- the wrappers called directly (no dispatch);
- the bare Triton launch of the same compiled kernel (`kernel[grid](...)`, Triton's own launcher);
- the TMA descriptors alone (FA2's three `TensorDescriptor`s);
- the same calls replayed from a launch tape (kernels/launch_tape.py) on another layer's tensors, as
  layers 1.. of a piecewise prefill step run them;
- torch SDPA (for scale: one ATen launch).

    python3 bench/launch_overhead.py
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402
from kernels import paged_attention_triton as pat  # noqa: E402
from kernels import prefill_attention_triton as fa  # noqa: E402
from kernels.dispatch import Kernels  # noqa: E402
from kernels.launch_tape import LaunchTape  # noqa: E402


def host_us(fn, calls: int = 200, rounds: int = 5) -> float:
    """Median over rounds of the host time per call, with a long kernel queued first so that no
    call waits for the GPU and the launch queue never fills."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e8))  # keeps the GPU busy for the whole round
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=60)
    ap.add_argument("--out", default="bench/results/launch_overhead.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device("cuda")
    dt = torch.bfloat16
    hq, hkv, d = 9, 3, 64
    t, b = args.tokens, args.seqs
    lens = [t // b] * b
    lens[-1] += t - sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=dev, dtype=dt)
    q = qkv[:, :hq * d].view(t, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    out = torch.empty(t, hq, d, device=dev, dtype=dt)
    mx = max(lens)
    kern = Kernels("triton", dev, profile=False)
    scale = d ** -0.5
    # A paged launch as a mixed prefill step has it: 64 sequences continuing with 1-64 new rows.
    blocks, page = 4096, 16
    kc = torch.randn(blocks, page, hkv, d, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    pb = 64
    ql = [1 + (i * 7) % 64 for i in range(pb)]
    ctx = [q_ + 200 + 13 * i for i, q_ in enumerate(ql)]
    tp = sum(ql)
    qp = torch.randn(tp, hq, d, device=dev, dtype=dt)
    outp = torch.empty_like(qp)
    width = max(-(-c // page) for c in ctx)
    tables = torch.randint(0, blocks, (pb, width), dtype=torch.int32, device=dev)
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
    qsl = torch.tensor([0] + list(torch.tensor(ql).cumsum(0).tolist()), dtype=torch.int32, device=dev)

    def fa_engine():
        kern.prefill_attention(q, k, v, cu, mx, scale, tuple(lens), out=out)

    def fa_wrapper():
        fa.flash_attention_varlen_triton(q, k, v, cu, mx, scale, out=out)

    bm, bn = fa.DEFAULT_CONFIG["BLOCK_M"], fa.DEFAULT_CONFIG["BLOCK_N"]
    cfg = {kk: vv for kk, vv in fa.DEFAULT_CONFIG.items() if kk not in ("BLOCK_M", "BLOCK_N")}
    descs = fa._descs(q, k, v, bm, bn)
    grid = (hq, b, -(-mx // bm))

    def fa_bare():
        fa._fa2_fwd_tma_kernel[grid](*descs, out, cu, scale, out.stride(0), out.stride(1), mx, fa._seq_bucket(mx),
                                     GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, **cfg)

    def fa_descs():
        fa._descs(q, k, v, bm, bn)

    def paged_engine():
        kern.paged_attention(qp, kc, vc, tables, seq_lens, qsl, max(ql), max(ctx), scale, tuple(ql), tuple(ctx), out=outp)

    def paged_wrapper():
        pat.paged_attention_triton(qp, kc, vc, tables, seq_lens, qsl, max(ql), max(ctx), scale, out=outp)

    def paged_plan():
        pat.plan(pb, hq, hkv, max(ql), max(ctx), dev)

    q4 = q.transpose(0, 1)[None]
    k4 = k.transpose(0, 1)[None]

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q4, k4, k4, is_causal=True, enable_gqa=True)

    for fn in (fa_engine, fa_wrapper, fa_bare, paged_engine, paged_wrapper, sdpa):
        fn()  # compile
    torch.cuda.synchronize()

    def replayer(call, movers: tuple, others: tuple):
        """`call` recorded once with `movers`, replayed with `others` in their place (another layer)."""
        tape = LaunchTape()
        with tape.recording():
            call()
        tape.bind(movers)
        assert tape.replay(others), "the tape refused to replay"

        def replay() -> None:
            tape.replay(others)
        return replay

    qkv2 = torch.randn_like(qkv)
    kc2, vc2, qp2 = torch.randn_like(kc), torch.randn_like(vc), torch.randn_like(qp)
    fa_replay = replayer(fa_engine, (qkv, kc, vc), (qkv2, kc2, vc2))
    paged_replay = replayer(paged_engine, (qp, kc, vc), (qp2, kc2, vc2))
    rows = [
        ("FA2 prefill through Kernels (the engine's call)", host_us(fa_engine)),
        ("FA2 wrapper (flash_attention_varlen_triton)", host_us(fa_wrapper)),
        ("FA2 bare Triton launch, descriptors made once", host_us(fa_bare)),
        ("FA2's three TensorDescriptors alone", host_us(fa_descs)),
        ("FA2 replayed from a tape on another layer", host_us(fa_replay)),
        ("paged (chunks) through Kernels", host_us(paged_engine)),
        ("paged wrapper (paged_attention_triton)", host_us(paged_wrapper)),
        ("paged plan() alone", host_us(paged_plan)),
        ("paged replayed from a tape on another layer", host_us(paged_replay)),
        ("torch SDPA, one ATen launch", host_us(sdpa)),
    ]
    print(f"host time per call, us ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    for name, us in rows:
        print(f"  {name:<52} {us:8.1f}")
    write_results(args.out, dict(device=torch.cuda.get_device_name(), rows=[dict(call=n, host_us=u) for n, u in rows]))


if __name__ == "__main__":
    main()
