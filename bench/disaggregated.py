"""Disaggregated prefill/decode vs one engine, measured on the same requests (seed chapter 10).

Short chats decode while long prompts arrive every few steps. Three runs: one colocated engine (a whole
prompt in one iteration; the long prompts arrive at its steps), then, with the requests arriving at the
same moments and stepped in turn, one with chunked prefill (a smaller budget) and `DisaggregatedEngine`
(a prefill worker and a decode worker, the KV handed over; engine/disaggregated/side_by_side.py).
Reports the chats' time between tokens (median, p99, worst), the long prompts' TTFT, the handoffs (MB,
copy GB/s, wait) and whether every run produced the same tokens.

    python3 bench/disaggregated.py                                        # CPU, real model
    python3 bench/disaggregated.py --device cuda --weights random         # H200: Triton, CUDA graphs
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import engine_results_path, write_results  # noqa: E402
from bench.workload import mixed_requests  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.disaggregated import DisaggregatedEngine  # noqa: E402
from engine.disaggregated.side_by_side import RequestInput, serve_side_by_side  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def _agreement(outputs: dict[str, tuple[int, ...]], reference: dict[str, tuple[int, ...]]) -> float:
    """Share of the reference's tokens each request reproduces before its first different one: 1.0 is the
    same tokens. In bf16 a batch of another shape can flip a near-tie argmax (tests/test_disaggregated_gpu.py
    checks fp32 exactly), after which the two runs continue from different contexts."""
    same = sum(next((i for i, (a, b) in enumerate(zip(outputs.get(k, ()), ref)) if a != b), len(ref))
               for k, ref in reference.items())
    return same / max(sum(len(ref) for ref in reference.values()), 1)


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    weights = load_weights(args.weights, device="cpu")
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    base = EngineConfig(device=args.device, dtype=dtype, weights=args.weights, block_size=16,
                        num_blocks=args.num_blocks, max_model_len=args.long_len + 256, max_num_seqs=args.chats + 8,
                        max_num_batched_tokens=args.long_len + args.chats + 64,
                        cuda_graphs=args.device == "cuda", profile_kernels=False, trace_detail="light")
    chunked = dataclasses.replace(base, max_num_batched_tokens=args.chunk_budget)
    chats = mixed_requests(args.chats, seed=1, prompt_range=(24, 64), output_range=(args.chat_tokens, args.chat_tokens))
    longs = mixed_requests(args.long_prompts, seed=2, prompt_range=(args.long_len, args.long_len),
                           output_range=(8, 8))
    requests = [RequestInput(f"chat{i}", list(r.prompt_ids), SamplingParams(max_tokens=r.max_tokens, ignore_eos=True))
                for i, r in enumerate(chats)]
    requests += [RequestInput(f"long{i}", list(r.prompt_ids), SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                              args.first_long + i * args.long_every) for i, r in enumerate(longs)]
    cluster = DisaggregatedEngine(base, weights)
    # On the GPU every engine first serves the same requests twice, untimed: Triton compiles and CUDA graph
    # captures (seconds) otherwise land in the measured steps (engine/disaggregated/side_by_side.py).
    runs = serve_side_by_side(("colocated", LLMEngine(base, weights)),
                              {"chunked": LLMEngine(chunked, weights), "disaggregated": cluster}, requests,
                              warmup_passes=2 if args.device == "cuda" else 0)
    reference = runs["colocated"].outputs
    rows = []
    for k, r in runs.items():
        gaps = [b - a for rid, ts in r.token_times.items() if rid.startswith("chat") for a, b in zip(ts, ts[1:])]
        ttft = [r.ttft(q.request_id) for q in requests if q.request_id.startswith("long")]
        rows.append({"run": k, "devices": 2 if k == "disaggregated" else 1,
                     "chat_tbt_median_ms": _pct(gaps, 0.5) * 1e3, "chat_tbt_p99_ms": _pct(gaps, 0.99) * 1e3,
                     "chat_tbt_worst_ms": max(gaps, default=0.0) * 1e3,
                     "long_ttft_mean_ms": sum(ttft) / max(len(ttft), 1) * 1e3,
                     "finished_s": max(ts[-1] for ts in r.token_times.values()),
                     "token_agreement": _agreement(r.outputs, reference),
                     "errors": list(r.errors)})
    handoffs = [h for h in cluster.handoffs if not h.request_id.startswith("warmup")]  # the measured pass's
    copy_s = [h.send_seconds + h.receive_seconds for h in handoffs]
    return {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "args": vars(args),
            "transport": cluster.transport.name, "runs": rows,
            "arrival_s": {q.request_id: runs["colocated"].arrival_times[q.request_id] for q in requests},
            "handoffs": {"count": len(handoffs), "mean_MB": sum(h.nbytes for h in handoffs) / max(len(handoffs), 1) / 1e6,
                         "long_MB": max((h.nbytes for h in handoffs), default=0) / 1e6,
                         "copy_GBps": sum(h.nbytes for h in handoffs) / max(sum(copy_s), 1e-12) / 1e9,
                         "mean_copy_ms": sum(copy_s) / max(len(copy_s), 1) * 1e3,
                         "mean_wait_ms": sum(h.taken_at - h.sent_at for h in handoffs) / max(len(handoffs), 1) * 1e3},
            "decode_worker_prefill_tokens": cluster.decode.counters["prefill_tokens_computed"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--weights", default="real", choices=["real", "random"])
    p.add_argument("--chats", type=int, default=None, help="requests decoding throughout (4 CPU, 32 CUDA)")
    p.add_argument("--chat-tokens", type=int, default=None, help="tokens each chat generates (32 CPU, 256 CUDA)")
    p.add_argument("--long-prompts", type=int, default=None, help="long prompts arriving (2 CPU, 4 CUDA)")
    p.add_argument("--long-len", type=int, default=None, help="their length in tokens (300 CPU, 4096 CUDA)")
    p.add_argument("--first-long", type=int, default=4, help="the decode step the first long prompt arrives at")
    p.add_argument("--long-every", type=int, default=None, help="steps between long prompts (8 CPU, 40 CUDA)")
    p.add_argument("--chunk-budget", type=int, default=None, help="the chunked run's budget (64 CPU, 512 CUDA)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks of 16 tokens per engine")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    gpu = args.device == "cuda"
    defaults = {"chats": (4, 32), "chat_tokens": (32, 256), "long_prompts": (2, 4), "long_len": (300, 4096),
                "long_every": (8, 40), "chunk_budget": (64, 512)}
    for name, (cpu, cuda) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, cuda if gpu else cpu)
    if args.num_blocks is None:
        args.num_blocks = 16 + (args.chats * (64 + args.chat_tokens) + args.long_prompts * (args.long_len + 16)) // 16
    out = run(args)
    print(f"{out['device']}, transport: {out['transport']}; {args.chats} chats x {args.chat_tokens} tokens, "
          f"{args.long_prompts} prompts of {args.long_len} tokens")
    print(f"{'run':<15}{'devices':>8}{'TBT p50 ms':>12}{'TBT p99 ms':>12}{'TBT max ms':>12}{'long TTFT ms':>14}"
          f"{'done s':>9}{'same tokens':>13}")
    for r in out["runs"]:
        print(f"{r['run']:<15}{r['devices']:>8}{r['chat_tbt_median_ms']:>12.2f}{r['chat_tbt_p99_ms']:>12.2f}"
              f"{r['chat_tbt_worst_ms']:>12.2f}{r['long_ttft_mean_ms']:>14.2f}{r['finished_s']:>9.3f}"
              f"{r['token_agreement']:>12.1%}")
    h = out["handoffs"]
    print(f"handoffs: {h['count']}, mean {h['mean_MB']:.2f} MB (long prompt {h['long_MB']:.1f} MB), copy "
          f"{h['copy_GBps']:.2f} GB/s, {h['mean_copy_ms']:.3f} ms each, waited {h['mean_wait_ms']:.2f} ms for the "
          f"decode worker; decode worker computed {out['decode_worker_prefill_tokens']} prompt tokens")
    write_results(args.out or engine_results_path("disaggregated", gpu), out)


if __name__ == "__main__":
    main()
