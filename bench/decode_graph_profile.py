"""Where the GPU time of one decode step goes: per-kernel time inside the engine's CUDA graph.

Builds the engine on CUDA (random weights, bf16, CUDA graphs), captures the decode graph of one
batch-size bucket, times its replay with CUDA events, then lists the kernels of 20 replays with the
torch profiler (time per replay, calls per replay, time per call), and the host time of one replay
call. `--context N` times the replays at N tokens of context per row over pages spread in the pool
(no KV written). Inside graphs of small batches (<= 8 rows) every kernel is launched with
programmatic dependent launch: it starts before its predecessor ends and waits inside, so the
profiler's per-kernel times overlap and add up to more than the replay.

    python3 bench/decode_graph_profile.py --batch 1 --max-model-len 512
    python3 bench/decode_graph_profile.py --batch 64 --max-model-len 2048 --context 1024
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

from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--context", type=int, default=0,
                    help="every row's context length in the timed replays (default: what generate left)")
    args = ap.parse_args()
    cfg = EngineConfig(device="cuda", dtype="bfloat16", weights="random", cuda_graphs=True, num_blocks=64 * args.batch + 64,
                       max_num_seqs=args.batch, max_model_len=args.max_model_len, profile_kernels=False,
                       trace_detail="light")
    engine = LLMEngine(cfg, load_weights("random"))
    engine.generate([list(range(300 + i, 340 + i)) for i in range(args.batch)],
                    SamplingParams(max_tokens=8, ignore_eos=True))
    runner = engine.graph_runner
    bucket = runner.bucket_for(args.batch)
    # No KV writes in the timed replays; contexts of --context tokens over blocks spread in the pool.
    runner.slot_mapping.fill_(-1)
    if args.context:
        ctx = min(args.context, args.max_model_len)
        runner.seq_lens[:bucket].fill_(ctx)
        blocks = -(-ctx // cfg.block_size)
        runner.block_tables[:bucket, :blocks].copy_(
            torch.randint(0, cfg.num_blocks, (bucket, blocks), dtype=torch.int32, device="cuda"))
    if bucket not in runner.graphs:  # generate's decode steps may not have used this bucket
        runner._replay(bucket, args.batch)
    graph = runner.graphs[bucket]
    for _ in range(50):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_us = start.elapsed_time(end) / 200 * 1e3
    # Host cost of one replay call (cudaGraphLaunch walks the graph's nodes), each call made on an
    # idle GPU so a full launch queue never blocks it.
    host = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    host_us = 1e6 * statistics.median(host)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / args.replays, e.count / args.replays)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"batch {args.batch}, max_model_len {args.max_model_len}: graph replay {replay_us:.1f} us, "
          f"kernel time {total:.1f} us per replay, host time of a replay call {host_us:.1f} us")
    print(f"{'kernel':<60} {'us/replay':>10} {'calls':>6} {'us/call':>8} {'share':>6}")
    for name, us, calls in rows:
        print(f"{name[:60]:<60} {us:>10.1f} {calls:>6.0f} {us / calls:>8.2f} {100 * us / total:>5.1f}%")


if __name__ == "__main__":
    main()
