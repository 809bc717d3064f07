"""Tensor- and pipeline-parallel decode steps: what one rank computes, and (with several GPUs) what the wire costs.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/parallel.py                    # CPU: real weights, fp32, eager
    python3 bench/parallel.py --device cuda                                     # GPU: random weights, bf16

One rank of a tensor-parallel group (the page's `TensorParallelModel`, holding rank 0 only) runs a
decode step (batch B, every sequence `--context` tokens in): its vocabulary slice of the embedding, for every layer
its heads' attention and O columns and its MLP channels, its slice of the logits. The all-reduces between them
are left out (a rank alone has no one to reduce with), so the time is the rank's compute, which is what tensor
parallelism divides. Timed eager and, on a GPU, as one CUDA graph per step (median of `--timed` rounds of
`--reps` replays). Pipeline stages (tp = 1) likewise: each stage's layers as one graph; the embedding goes with
the first stage and the LM head with the last. Those plain torch functions launch about 60 kernels a layer, so
on a GPU at small batch their time is mostly kernel count; `engine_rank` therefore also runs one rank's shapes
(9/tp query heads, 3/tp KV heads, 1536/tp MLP channels, 49152/tp vocabulary rows) and one pipeline stage's
(its layers, with an embedding and LM head) through the engine's own decode step: fused Triton kernels replayed
as CUDA graphs, what this project serves with.

With two or more GPUs it also spawns one process per GPU and times NCCL all-reduces of one decode step's
hidden state (576 x B bf16) over 2 .. n GPUs: the 61 collectives per step a tensor-parallel rank waits for. The
machines lent so far have one GPU, so that part has not run yet; `all_reduce` stays empty then. On the CPU
(`--processes N`, default 3) the same all-reduces run between N processes over gloo (fp32), and the real model
runs tensor-parallel over real processes (engine/parallel/distributed.py), one rank each: the same tokens as the
ranks taking turns in one process, and each decode step's compute and wire as rank 0 saw them (`distributed`).

Prints a table and writes JSON to --out (default bench/results/parallel_<cpu|h200>.json, and $OUT/ when set).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.results_io import write_results_and_out  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.lora.merge_lab import engine_config  # noqa: E402
from engine.parallel.distributed import free_port, run_distributed  # noqa: E402
from engine.parallel.generate import generate  # noqa: E402
from engine.parallel.lab import ParallelSettings  # noqa: E402
from engine.parallel.plan import stage_layers  # noqa: E402
from engine.parallel.tensor_parallel import TensorParallelModel  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import LoadedWeights, load_weights, random_state_dict  # noqa: E402

BATCHES = (1, 16, 64, 256)
PROMPT = ParallelSettings().prompt  # the page's default


def _time(fn, reps: int, timed: int, cuda: bool) -> float:  # noqa: ANN001
    """Median milliseconds per call over `timed` rounds of `reps` calls."""
    rounds = []
    for _ in range(timed):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            torch.cuda.synchronize()
            rounds.append(a.elapsed_time(b) / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            rounds.append((time.perf_counter() - t0) * 1e3 / reps)
    return statistics.median(rounds)


def as_graph(fn):  # noqa: ANN001, ANN201
    """fn captured as one CUDA graph (static inputs: fn closes over them); returns the replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def time_rank(model: TensorParallelModel, batch: int, context: int, layers: range, first: bool, last: bool,
              args, cuda: bool) -> tuple[float, float | None]:  # noqa: ANN001
    """The decode step of the one rank `model` holds (built with ranks=[0]) over `layers`, `context` tokens in: its
    group of one hands each partial back as it is, so the partial sums are added locally where an all-reduce would
    add all ranks' (the same arithmetic and memory traffic on this rank, without the wire). (eager, graph) ms."""
    [cache] = model.new_caches(batch, layers)
    for t in cache.k + cache.v:
        if t is not None:
            t.normal_()
    dev = model.device
    ids = torch.randint(0, model.cfg.vocab_size, (batch, 1), device=dev)
    h = None if first else torch.randn(batch, 1, model.cfg.hidden_size, device=dev, dtype=model.shards[0].embed.dtype)

    def step() -> torch.Tensor:
        model.trace.segments.clear()  # the records of one step at a time, not of every repetition
        model.group.reset()
        x = model.layers(model.embed(ids) if first else h, context, [cache], layers)
        return model.logits(x[:, -1]) if last else x

    with torch.inference_mode():
        for _ in range(args.warmup):
            step()
        eager = _time(step, args.reps, args.timed, cuda)
        graph = _time(as_graph(step), args.reps * 10, args.timed, True) if cuda else None
    return eager, graph


def rank_config(cfg: ModelConfig, tp: int, layers: int | None = None) -> ModelConfig:
    """The shapes one tensor-parallel rank computes (its heads, channels and vocabulary slice; the hidden size and
    the norms whole), or a pipeline stage's (`layers` of them): a smaller model of the same family, which the
    engine runs with its own fused kernels."""
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp, vocab_size=cfg.vocab_size // tp,
                               num_layers=layers or cfg.num_layers, name=f"{cfg.name} rank of tp {tp}")


def engine_step_ms(cfg: ModelConfig, tokenizer, batch: int, context: int, warmup: int, timed: int,  # noqa: ANN001
                   device: str = "cuda") -> float:
    """Median wall time of the engine's full-batch decode steps (Triton kernels, CUDA graphs) on random weights of
    `cfg`'s shapes, every row `context` tokens in."""
    w = LoadedWeights(cfg, random_state_dict(cfg, 0), "random", tokenizer)
    cuda = device == "cuda"
    e = LLMEngine(engine_config(device, "bfloat16" if cuda else "float32", batch, context + warmup + timed + 2,
                                cuda_graphs=cuda), w)
    prompt = torch.randint(3, cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    p = SamplingParams(temperature=0.0, max_tokens=warmup + timed + 1, ignore_eos=True)
    for _ in range(batch):
        e.add_request(list(prompt), p)
    walls, done = [], 0
    while e.has_work():
        rec = e.step()
        if rec.num_prefill_tokens or rec.num_decode_tokens != batch:
            continue
        if done >= warmup:
            walls.append(rec.wall_seconds * 1e3)
        done += 1
    return statistics.median(walls)


def all_reduce_worker(rank: int, world: int, backend: str, port: int, batches: list[int], reps: int,
                      queue) -> None:  # noqa: ANN001
    """One process of `world`: all-reduces of [B, 576] over the first 2 .. world ranks, rank 0 reporting the mean
    time of `reps` back-to-back calls. NCCL: one GPU per process, bf16, CUDA events. gloo: CPU processes, fp32 (the
    CPU path's dtype), wall clock (a gloo call returns when it is done)."""
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world)
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    rows = []
    for ranks in range(2, world + 1):
        group = dist.new_group(list(range(ranks)))
        for b in batches:
            x = torch.randn(b, 576, device=dev, dtype=dtype)
            if rank < ranks:
                for _ in range(20):
                    dist.all_reduce(x, group=group)
                us = _time(lambda: dist.all_reduce(x, group=group), reps, 3, cuda) * 1e3  # noqa: B023
                if rank == 0:
                    rows.append({"backend": backend, "ranks": ranks, "bytes": x.numel() * x.element_size(),
                                 "dtype": str(dtype).removeprefix("torch."), "us": us})
            dist.barrier()
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def measure_all_reduce(backend: str, world: int, batches: list[int], reps: int) -> list[dict]:
    if world < 2:
        return []
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(all_reduce_worker, args=(world, backend, free_port(), batches, reps, q), nprocs=world,
                       join=True, start_method="spawn")
    return q.get()


def distributed_run(mode: str, tp: int, w, tokens: int, backend: str = "gloo") -> dict:  # noqa: ANN001 (LoadedWeights)
    """The model over `tp` processes, one rank each (gloo: CPU processes, fp32; nccl: one GPU each, bf16), against
    the ranks taking turns in one process (on GPU 0 for nccl): the same greedy tokens? (In bf16 a different order
    of the partial sums may flip a near tie.) And per decode step, rank 0's compute and its time in the 62
    collectives."""
    prompt = w.tokenizer.chat_prompt_ids(PROMPT)
    run = run_distributed(mode, tp, prompt, tokens, w.config.eos_token_ids, backend, len(prompt) + tokens + 1)
    gpu = backend == "nccl"
    here = generate(TensorParallelModel(w.config, w.state_dict, tp, len(prompt) + tokens + 1,
                                        device="cuda" if gpu else "cpu",
                                        dtype=torch.bfloat16 if gpu else torch.float32), [prompt], tokens,
                    w.config.eos_token_ids)
    decode = slice(1, None)
    return {"tp": tp, "backend": backend, "prompt_tokens": len(prompt), "tokens": len(run.tokens),
            "same_tokens_as_one_process": run.tokens == here.tokens[0],
            "setup_s": run.setup_seconds, "collectives_per_step": run.collectives_per_step,
            "decode_compute_ms": statistics.median(run.compute_seconds[decode]) * 1e3,
            "decode_wire_ms": statistics.median(run.wire_seconds[decode]) * 1e3,
            "prefill_compute_ms": run.compute_seconds[0] * 1e3, "prefill_wire_ms": run.wire_seconds[0] * 1e3,
            "one_process_critical_ms": statistics.median(s.critical_seconds for s in here.steps[decode]) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--weights", default=None, choices=("real", "random"), help="default: real on CPU, random on GPU")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tp", default="1,3")
    ap.add_argument("--pp", default="2,3")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timed", type=int, default=5)
    ap.add_argument("--processes", type=int, default=3,
                    help="CPU: also time gloo all-reduces over 2 .. this many processes and run each TP degree <= it "
                         "over real processes (0: neither)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = args.device == "cuda"
    mode = args.weights or ("random" if cuda else "real")
    dtype = torch.bfloat16 if cuda else torch.float32
    w = load_weights(mode)
    cfg, batches = w.config, [int(b) for b in args.batches.split(",")]
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name}, {mode} weights, {dtype}, context {args.context}")
    tp_rows, pp_rows = [], []
    print(f"{'':>10} {'batch':>6} {'eager ms':>9} {'graph ms':>9}")
    for tp in [int(t) for t in args.tp.split(",")]:
        rank0 = TensorParallelModel(cfg, w.state_dict, tp, args.context + 1, ranks=[0], device=args.device,
                                    dtype=dtype)  # every rank has the same shapes
        for b in batches:
            eager, graph = time_rank(rank0, b, args.context, range(cfg.num_layers), True, True, args, cuda)
            tp_rows.append({"tp": tp, "rank": 0, "batch": b, "eager_ms": eager, "graph_ms": graph})
            print(f"{'tp ' + str(tp):>10} {b:>6} {eager:9.3f} {graph if graph is not None else float('nan'):9.3f}")
        del rank0
    full = TensorParallelModel(cfg, w.state_dict, 1, args.context + 1, device=args.device, dtype=dtype)
    for pp in [int(p) for p in args.pp.split(",")]:
        for s, layers in enumerate(stage_layers(cfg.num_layers, pp)):
            for b in batches:
                eager, graph = time_rank(full, b, args.context, layers, s == 0, s == pp - 1, args, cuda)
                pp_rows.append({"pp": pp, "stage": s, "first_layer": layers.start, "last_layer": layers.stop - 1,
                                "batch": b, "eager_ms": eager, "graph_ms": graph})
                print(f"{f'pp {pp} s{s}':>10} {b:>6} {eager:9.3f} {graph if graph is not None else float('nan'):9.3f}")
    engine_rows = []
    if cuda:  # the same shapes through the engine's own decode step: fused Triton kernels in CUDA graphs
        shapes = [("tp", t, rank_config(cfg, t)) for t in [int(t) for t in args.tp.split(",")]]
        shapes += [("pp", p, rank_config(cfg, 1, len(stage_layers(cfg.num_layers, p)[0]))) for p in
                   [int(p) for p in args.pp.split(",")]]
        for kind, degree, rc in shapes:
            for b in batches:
                ms = engine_step_ms(rc, w.tokenizer, b, args.context, 3, 10)
                engine_rows.append({"kind": kind, "degree": degree, "layers": rc.num_layers, "batch": b, "step_ms": ms})
                print(f"{f'engine {kind} {degree}':>10} {b:>6} {'':>9} {ms:9.3f}")
    if cuda:
        ar = measure_all_reduce("nccl", torch.cuda.device_count(), batches, 200)
    else:
        ar = measure_all_reduce("gloo", args.processes, batches, 200) if args.processes > 1 else []
    for r in ar:
        print(f"all-reduce ({r['backend']}) over {r['ranks']} ranks, {r['bytes']} B: {r['us']:.1f} us")
    dist_rows = []
    procs = torch.cuda.device_count() if cuda else args.processes
    if procs > 1:  # several GPUs (nccl; not run yet: one-GPU machines only) or CPU processes (gloo)
        for tp in [t for t in (int(t) for t in args.tp.split(",")) if 1 < t <= procs]:
            row = distributed_run(mode, tp, w, 16, "nccl" if cuda else "gloo")
            dist_rows.append(row)
            print(f"tp {tp} over {tp} processes ({row['backend']}): same tokens as one process {row['same_tokens_as_one_process']}; "
                  f"decode step compute {row['decode_compute_ms']:.1f} ms + collectives {row['decode_wire_ms']:.1f} ms "
                  f"({row['collectives_per_step']} a step); in one process, slowest rank per segment "
                  f"{row['one_process_critical_ms']:.1f} ms")
    data = {"device": name, "torch": torch.__version__, "gpus": torch.cuda.device_count() if cuda else 0,
            "weights": mode, "dtype": str(dtype).removeprefix("torch."), "context": args.context,
            "tp_decode": tp_rows, "pp_stage": pp_rows, "engine_rank": engine_rows, "all_reduce": ar,
            "distributed": dist_rows, "cpu_cores": os.cpu_count(),
            "command": "python3 " + " ".join(sys.argv)}
    tag = "h200" if cuda and "H200" in name else args.device
    out = args.out or str(ROOT / "bench" / "results" / f"parallel_{tag}.json")
    write_results_and_out(out, data)


if __name__ == "__main__":
    main()
