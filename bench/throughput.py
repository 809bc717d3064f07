"""Engine vs Hugging Face `generate` (padded static batches) on the same mixed-length requests.

Both are credited only with the tokens each request asked for; HF's padded batches also decode
past a request's own limit until the longest in its batch is done, which is the waste continuous
batching removes. Prints a table and writes JSON.

On CUDA both systems first run the whole workload once untimed: the engine's first pass compiles
Triton kernels for new shapes and captures graphs (about a second in all), HF's warms cuBLAS and
its caching allocator; then three timed passes, the steady state a server runs in, of which the
median is reported (the GPU machine's host speed varies from run to run). Before each pass a fixed piece of
Python work is timed (bench/host_probe.py): the table's "host µs" column and each row's `host_probe_ms` say how
fast the host was, so a host-bound row that reads slow can be told from a slower engine.

    python bench/throughput.py --concurrency 16,8,4              # CPU, real model, 16 requests
    python bench/throughput.py --device cuda --weights random --num-requests 256 --batch1

On CUDA the engine runs three ways: eager, with CUDA graphs (decode steps as whole graphs, prefill
steps as piecewise graphs around attention: engine/piecewise_graphs.py), and with CUDA graphs plus
overlapped decode (the host schedules step k + 1 while the GPU computes step k: engine/overlap.py).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.host_probe import host_probe_ms  # noqa: E402
from bench.results_io import engine_results_path, write_results  # noqa: E402
from bench.workload import BenchRequest, mixed_requests  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.host_memory import keep_freed_memory  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import hf_reference_model, load_weights  # noqa: E402


def _passes(device: str) -> int:
    """Runs of the whole workload per system: on CUDA one untimed warm-up pass, then three timed ones
    (the shared machine's host speed varies by tens of percent from run to run: the median is
    reported, every pass is kept in the JSON)."""
    return 4 if device.startswith("cuda") else 1


def _timed(seconds: list[float]) -> list[float]:
    """The timed passes: all but the warm-up one on CUDA."""
    return seconds[1:] if len(seconds) > 1 else seconds


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_engine(weights, reqs: list[BenchRequest], args, cuda_graphs: bool, max_seqs: int | None = None,
                 overlap: bool = False) -> LLMEngine:
    """An engine sized for the workload (every request fits at once), warmed up: Triton kernels
    compiled and every graph bucket the workload can use captured."""
    max_len = max(len(r.prompt_ids) + r.max_tokens for r in reqs)
    max_len = 1 << (max_len - 1).bit_length()
    tokens_needed = sum(len(r.prompt_ids) + r.max_tokens for r in reqs)
    cfg = EngineConfig(
        device=args.device, dtype=args.dtype, weights=args.weights, cuda_graphs=cuda_graphs, overlap_decode=overlap,
        prefill_graphs=args.prefill_graphs, programmatic_launch=args.pdl,
        replay_attention_launches=args.replay_launches,
        num_blocks=-(-tokens_needed // 16) + len(reqs) + 8, block_size=16, max_num_seqs=max_seqs or len(reqs),
        max_num_batched_tokens=args.budget, max_model_len=max_len, profile_kernels=False, trace_detail="light",
    )
    engine = LLMEngine(cfg, weights)
    engine.generate(list(reqs[0].prompt_ids[:8]), SamplingParams(max_tokens=4, ignore_eos=True))
    if cuda_graphs and engine.graph_runner is not None:
        for b in engine.graph_runner.buckets:
            if b <= len(reqs):
                engine.graph_runner.run(_dummy_decode(engine, b))
    return engine


def run_workload(engine: LLMEngine, reqs: list[BenchRequest], on_step=None) -> tuple[float, int]:
    """Add every request, step until done; returns (seconds, steps). `on_step(record)` sees each step."""
    _sync(engine.config.device)
    t0 = time.perf_counter()
    for r in reqs:
        engine.add_request(list(r.prompt_ids), SamplingParams(max_tokens=r.max_tokens, ignore_eos=True))
    steps = 0
    while engine.has_work():
        record = engine.step()
        if on_step is not None:
            on_step(record)
        steps += 1
    _sync(engine.config.device)
    return time.perf_counter() - t0, steps


def run_engine(weights, reqs: list[BenchRequest], args, cuda_graphs: bool, label: str,
               max_seqs: int | None = None, overlap: bool = False) -> dict:
    engine = bench_engine(weights, reqs, args, cuda_graphs, max_seqs, overlap)
    probes, passes = [], []
    for _ in range(_passes(args.device)):
        probes.append(host_probe_ms())
        passes.append(run_workload(engine, reqs))
    times = _timed([secs for secs, _ in passes])
    secs = statistics.median(times)
    useful = sum(r.max_tokens for r in reqs)
    return dict(system=label, seconds=secs, output_tokens=useful, tok_per_s=useful / secs, steps=passes[-1][1],
                pass_seconds=times, **_probe_fields(probes))


def _probe_fields(probes: list[float]) -> dict:
    """The host's speed beside the timed passes (bench/host_probe.py; taken just before each pass)."""
    timed = _timed(probes)
    return dict(host_probe_ms=statistics.median(timed), host_probe_pass_ms=timed)


def _dummy_decode(engine: LLMEngine, n: int):
    from engine.forward_batch import build_forward_batch
    paged = [([1], 0, [-1], [0]) for _ in range(n)]
    return build_forward_batch([], paged, list(range(n)), engine.device)


def run_hf(weights, reqs: list[BenchRequest], args, batch_size: int, label: str) -> dict:
    dtype = getattr(torch, args.dtype)
    model = hf_reference_model(weights, attn_implementation=args.hf_attn).to(device=args.device, dtype=dtype).eval()
    pad = 0
    with torch.no_grad():
        warm = torch.tensor([list(reqs[0].prompt_ids[:8])], device=args.device)
        model.generate(warm, max_new_tokens=2, do_sample=False, pad_token_id=pad)
        times, probes = [], []
        for _ in range(_passes(args.device)):
            probes.append(host_probe_ms())
            _sync(args.device)
            t0 = time.perf_counter()
            _hf_pass(model, reqs, args, batch_size, pad)
            _sync(args.device)
            times.append(time.perf_counter() - t0)
    times = _timed(times)
    secs = statistics.median(times)
    useful = sum(r.max_tokens for r in reqs)
    return dict(system=label, seconds=secs, output_tokens=useful, tok_per_s=useful / secs, steps=None,
                pass_seconds=times, **_probe_fields(probes))


def _hf_pass(model, reqs: list[BenchRequest], args, batch_size: int, pad: int) -> None:
    for i in range(0, len(reqs), batch_size):
        chunk = reqs[i:i + batch_size]
        width = max(len(r.prompt_ids) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(chunk):  # left padding, as generation needs
            ids[j, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[j, width - len(r.prompt_ids):] = 1
        model.generate(ids.to(args.device), attention_mask=mask.to(args.device), do_sample=False,
                       max_new_tokens=max(r.max_tokens for r in chunk), min_new_tokens=max(r.max_tokens for r in chunk),
                       pad_token_id=pad)


def add_engine_options(ap: argparse.ArgumentParser, device: str, weights: str, num_requests: int) -> None:
    """The workload and engine options the throughput benchmarks share."""
    ap.add_argument("--device", default=device)
    ap.add_argument("--weights", default=weights, choices=["real", "random"])
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--num-requests", type=int, default=num_requests)
    ap.add_argument("--budget", type=int, default=0, help="engine token budget per step (default 512 CPU / 8192 GPU)")
    ap.add_argument("--batch1-tokens", type=int, default=256, help="tokens generated by the batch-1 request")
    ap.add_argument("--no-prefill-graphs", dest="prefill_graphs", action="store_false",
                    help="with CUDA graphs, run prefill steps eagerly (graphs for decode steps only)")
    ap.add_argument("--no-launch-replay", dest="replay_launches", action="store_false",
                    help="in piecewise prefill steps, launch every layer's attention through the kernels' wrappers")
    ap.add_argument("--no-pdl", dest="pdl", action="store_false",
                    help="launch every kernel only after the previous one finished (no programmatic dependent launch)")


def cuda_workload(args: argparse.Namespace, needs: str) -> tuple:
    """(weights, requests) of the throughput workload for a CUDA-only benchmark, after the device
    defaults; exits saying `needs` (what wants CUDA) on another device."""
    if not apply_device_defaults(args):
        raise SystemExit(f"{needs} need CUDA: run on a CUDA machine")
    keep_freed_memory()
    return load_weights(args.weights), mixed_requests(args.num_requests)


def apply_device_defaults(args: argparse.Namespace) -> bool:
    """bf16 and an 8192-token step budget on CUDA (and one host thread for torch's CPU ops), fp32 and 512
    on the CPU, unless given; True on CUDA."""
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.budget = args.budget or (8192 if cuda else 512)
    if cuda:
        # Both systems drive the GPU from one host thread and need no CPU parallelism. With torch's
        # default pool (16 threads on the H200 machine) some whole processes ran ~1.5x slower on
        # the host; with one thread none did in the runs of bench/NOTES_kernels.md v8 (probably idle
        # OpenMP threads spinning beside the launching thread). HF and the engine alike.
        torch.set_num_threads(1)
    return cuda


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_options(ap, device="cpu", weights="real", num_requests=16)
    ap.add_argument("--concurrency", default="",
                    help="comma-separated caps on requests in flight, applied to both systems (HF: static batch "
                         "size; engine: max_num_seqs). Default: all requests at once")
    ap.add_argument("--batch1", action="store_true", help="also measure one request alone (decode speed)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"],
                    help="Hugging Face attention implementation (sdpa: transformers' default)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cuda = apply_device_defaults(args)
    # Both systems under the same host allocator settings (the engine sets them when it is built;
    # HF's passes would otherwise depend on whether an engine ran first). engine/host_memory.py.
    keep_freed_memory()
    weights = load_weights(args.weights)
    reqs = mixed_requests(args.num_requests)
    rows = []
    if args.batch1:
        one = [BenchRequest(reqs[0].prompt_ids[:32], args.batch1_tokens)]
        if cuda:
            rows.append(dict(run_engine(weights, one, args, True, "engine batch 1 (CUDA graphs, overlapped)",
                                        overlap=True), workload="batch 1"))
            rows.append(dict(run_engine(weights, one, args, True, "engine batch 1 (CUDA graphs)"), workload="batch 1"))
        rows.append(dict(run_engine(weights, one, args, False, "engine batch 1 (eager)"), workload="batch 1"))
        if not args.no_hf:
            hf_one = [BenchRequest(one[0].prompt_ids, min(args.batch1_tokens, 64))]
            rows.append(dict(run_hf(weights, hf_one, args, 1, "HF generate batch 1"), workload="batch 1"))
    caps = [int(c) for c in args.concurrency.split(",") if c] or [len(reqs)]
    for cap in caps:
        # Same concurrency for both: a static batch of `cap`, or at most `cap` sequences running.
        wl = f"{len(reqs)} mixed, <= {cap} at once"
        if cuda:
            rows.append(dict(run_engine(weights, reqs, args, True, "engine (continuous, graphs, overlapped)", cap,
                                        overlap=True), workload=wl))
            rows.append(dict(run_engine(weights, reqs, args, True, "engine (continuous, CUDA graphs)", cap), workload=wl))
        rows.append(dict(run_engine(weights, reqs, args, False, "engine (continuous, eager)", cap), workload=wl))
        if not args.no_hf:
            rows.append(dict(run_hf(weights, reqs, args, cap, f"HF generate (padded static batches of {cap})"),
                             workload=wl))
    base = {r["workload"]: r["tok_per_s"] for r in rows if r["system"].startswith("HF")}
    print(f"\nHF attention: {args.hf_attn}; device={args.device} ({torch.cuda.get_device_name() if cuda else platform.processor() or 'cpu'}) "
          f"weights={args.weights} dtype={args.dtype} torch={torch.__version__}")
    # "host µs": bench/host_probe.py beside the passes; a host-bound row slows as it grows.
    print(f"{'workload':<22} {'system':<44} {'tokens':>7} {'seconds':>8} {'tok/s':>9} {'vs HF':>6} {'host µs':>8}")
    for r in rows:
        ratio = r["tok_per_s"] / base[r["workload"]] if r["workload"] in base else float("nan")
        r["speedup_vs_hf"] = ratio
        print(f"{r['workload']:<22} {r['system']:<44} {r['output_tokens']:>7} {r['seconds']:>8.2f} "
              f"{r['tok_per_s']:>9.1f} {ratio:>6.2f} {r['host_probe_ms'] * 1e3:>8.0f}")
    write_results(args.out or engine_results_path("throughput", cuda),
                  dict(device=args.device, weights=args.weights, dtype=args.dtype, hf_attn=args.hf_attn,
                       torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
