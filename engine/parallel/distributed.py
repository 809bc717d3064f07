"""Tensor parallelism over real processes: one rank per process, the collectives through torch.distributed (gloo
between CPU processes, NCCL between GPUs).

The model is `TensorParallelModel` holding one shard; only its group changes. Here the partial sums meet on a real
wire, and each collective is timed. In one process the ranks take turns and nothing is sent. Over processes each
rank computes only its share, then waits in the all-reduce for the slowest.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import ModelConfig
from engine.parallel.collectives import SERVING_BYTES, CollectiveCall, all_gather_bytes, ring_all_reduce_bytes
from engine.parallel.generate import generate
from engine.parallel.tensor_parallel import TensorParallelModel


class DistributedGroup:
    """This process's rank of a torch.distributed group; each collective timed (the wait for the other ranks
    included, as a GPU's would be)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[CollectiveCall] = []

    def reset(self) -> None:
        self.calls = []

    def _sync(self, t: torch.Tensor) -> None:
        if t.is_cuda:
            torch.cuda.synchronize(t.device)

    def all_reduce(self, parts: list[torch.Tensor], site: str) -> torch.Tensor:
        [part] = parts
        t0 = time.perf_counter()
        dist.all_reduce(part)
        self._sync(part)
        payload = part.numel() * SERVING_BYTES
        self.calls.append(CollectiveCall("all_reduce", site, payload, ring_all_reduce_bytes(payload, self.size),
                                         time.perf_counter() - t0))
        return part

    def all_gather(self, parts: list[torch.Tensor], site: str) -> torch.Tensor:
        [part] = parts
        t0 = time.perf_counter()
        out = [torch.empty_like(part) for _ in range(self.size)]
        dist.all_gather(out, part)
        self._sync(part)
        whole = torch.cat(out, dim=-1)
        payload = whole.numel() * SERVING_BYTES
        self.calls.append(CollectiveCall("all_gather", site, payload, all_gather_bytes(payload, self.size),
                                         time.perf_counter() - t0))
        return whole


@dataclass(frozen=True, slots=True)
class DistributedRun:
    tp: int
    backend: str
    tokens: tuple[int, ...]
    compute_seconds: tuple[float, ...]  # rank 0's compute per step (0: the prefill)
    wire_seconds: tuple[float, ...]  # rank 0's time in collectives per step, waiting for the others included
    collectives_per_step: int
    setup_seconds: float  # processes started, weights loaded and sharded, group joined (rank 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, tp: int, backend: str, port: int, weights: str | tuple[ModelConfig, dict],
            prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...], max_len: int, queue) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    gpu = backend == "nccl"  # one GPU per rank, bf16; else CPU processes in fp32
    if gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # one core per rank at most: several ranks share this machine's cores
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend, rank=rank, world_size=tp)
    try:
        if isinstance(weights, str):
            from engine.weights import load_weights
            w = load_weights(weights)
            cfg, sd = w.config, w.state_dict
        else:
            cfg, sd = weights
        model = TensorParallelModel(cfg, sd, tp, max_len, group=DistributedGroup(tp), ranks=[rank],
                                    device=f"cuda:{rank}" if gpu else "cpu",
                                    dtype=torch.bfloat16 if gpu else torch.float32)
        del sd
        dist.barrier()
        setup = time.perf_counter() - t0
        gen = generate(model, [prompt], max_new_tokens, stop_ids)
        if rank == 0:
            queue.put(DistributedRun(tp, backend, gen.tokens[0], tuple(s.critical_seconds for s in gen.steps),
                                     tuple(s.wire_seconds for s in gen.steps), gen.steps[-1].collectives, setup))
    finally:
        dist.destroy_process_group()


def run_distributed(weights: str | tuple[ModelConfig, dict], tp: int, prompt: list[int], max_new_tokens: int,
                    stop_ids: tuple[int, ...] = (), backend: str = "gloo", max_len: int = 1024) -> DistributedRun:
    """Greedy generation of one prompt by `tp` processes, one rank each. `weights`: "real" or "random" (each process
    loads them), or (config, state dict) passed to every process (small models). `backend`: "gloo" (CPU processes)
    or "nccl" (rank r on GPU r, bf16; needs `tp` GPUs, not yet run: the machines lent so far have one)."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(tp, backend, free_port(), weights, list(prompt), max_new_tokens, tuple(stop_ids),
                                      max_len, queue), nprocs=tp, join=True, start_method="spawn")
    return queue.get()
