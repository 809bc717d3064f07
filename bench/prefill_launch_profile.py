"""Is an eager prefill step bound by the GPU or by launching its kernels from Python?

Builds the engine on CUDA (random weights, bf16), makes one batch of fresh prompts (the bench
workload's first prefill step: `--seqs` prompts, `--tokens` in all), and times `model.forward` three
ways: host time until the call returns (every launch queued, no sync), wall time to a synchronised
finish, and GPU time from CUDA events. Then lists the host-side cost per op with the torch profiler.
Prints a table and writes JSON.

    python3 bench/prefill_launch_profile.py --seqs 60 --tokens 8192 [--graphs] [--decodes 128 --decode-ctx 512]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402

from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.forward_batch import build_forward_batch  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--graphs", action="store_true",
                    help="the engine with CUDA graphs: the step runs as piecewise graphs (engine/piecewise_graphs.py)")
    ap.add_argument("--decodes", type=int, default=0,
                    help="also this many decode rows in the step (a mixed step, as continuous batching runs)")
    ap.add_argument("--decode-ctx", type=int, default=512, help="context length of each decode row")
    ap.add_argument("--out", default="bench/results/prefill_launch_profile.json")
    args = ap.parse_args()
    per = args.tokens // args.seqs
    fresh_blocks = -(-per // 16) * args.seqs
    ctx_blocks = -(-args.decode_ctx // 16)
    blocks = fresh_blocks + ctx_blocks * args.decodes + 8
    longest = max(per, args.decode_ctx if args.decodes else 0)
    cfg = EngineConfig(device="cuda", dtype="bfloat16", weights="random", num_blocks=blocks,
                       max_num_seqs=args.seqs + args.decodes, max_num_batched_tokens=args.tokens + args.decodes,
                       max_model_len=1 << (longest - 1).bit_length(),
                       profile_kernels=False, trace_detail="light", cuda_graphs=args.graphs)
    engine = LLMEngine(cfg, load_weights("random"))
    fresh = [(list(range(100 + s, 100 + s + per)), 0, list(range(s * -(-per // 16) * 16, s * -(-per // 16) * 16 + per)))
             for s in range(args.seqs)]
    rows = [(s + 1) * per - 1 for s in range(args.seqs)]
    paged = []
    for j in range(args.decodes):  # one new token at position decode_ctx - 1, its pages after the prompts'
        table = list(range(fresh_blocks + j * ctx_blocks, fresh_blocks + (j + 1) * ctx_blocks))
        pos = args.decode_ctx - 1
        paged.append(([7], pos, [table[pos // 16] * 16 + pos % 16], table))
    rows += [per * args.seqs + j for j in range(args.decodes)]
    model, pool = engine.model, engine.pool
    batch = build_forward_batch(fresh, paged, rows, engine.device)
    for _ in range(3):
        model.forward(batch, pool)
    torch.cuda.synchronize()
    host, wall, gpu = [], [], []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        model.forward(batch, pool)
        end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
        gpu.append(start.elapsed_time(end) / 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.forward(batch, pool)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    launches = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    res = dict(graphs=args.graphs, seqs=args.seqs, tokens=per * args.seqs, decodes=args.decodes,
               decode_ctx=args.decode_ctx, host_ms=1e3 * statistics.median(host),
               wall_ms=1e3 * statistics.median(wall), gpu_ms=1e3 * statistics.median(gpu), gpu_kernels=launches,
               profile=table)
    print(f"{'piecewise graphs' if args.graphs else 'eager'}: {res['tokens']} tokens in {args.seqs} fresh prompts"
          f"{f' + {args.decodes} decode rows' if args.decodes else ''}: host (launch) {res['host_ms']:.2f} ms, "
          f"wall {res['wall_ms']:.2f} ms, GPU {res['gpu_ms']:.2f} ms, {launches} GPU kernels "
          f"(medians of {args.repeats})")
    print(table)
    write_results(args.out, res)


if __name__ == "__main__":
    main()
