"""Greedy generation on the tensor-parallel model, with what each step cost each rank and the wire."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.parallel.tensor_parallel import TensorParallelModel


@dataclass(frozen=True, slots=True)
class StepCost:
    step: int  # 0: the prefill
    tokens: int  # tokens this forward pass processed (batch x length)
    rank_seconds: tuple[float, ...]  # each rank's compute, summed over the pass
    critical_seconds: float  # per segment the slowest rank, summed: the pass on tp GPUs, wire excluded
    collectives: int
    sent_bytes_per_rank: float  # at bf16, ring formulas
    wire_seconds: float = 0.0  # the collectives' measured time: over real processes only (distributed.py)

    @property
    def serial_seconds(self) -> float:
        """All ranks' compute in turn: what this process really spent."""
        return sum(self.rank_seconds)


@dataclass(frozen=True, slots=True)
class Generation:
    tp: int
    tokens: tuple[tuple[int, ...], ...]  # per sequence, the generated ids
    steps: tuple[StepCost, ...]
    weight_bytes_per_rank: tuple[int, ...]
    cache_bytes_per_rank: tuple[int, ...]
    collective_sites: tuple[tuple[str, str, int], ...]  # one decode step's (kind, site, payload bytes)


def _cost(model: TensorParallelModel, step: int, tokens: int) -> StepCost:
    segs = model.trace.segments
    ranks = tuple(sum(s.rank_seconds[r] for s in segs) for r in range(len(model.shards)))  # the ranks held here
    calls = model.group.calls
    return StepCost(step, tokens, ranks, sum(max(s.rank_seconds) for s in segs), len(calls),
                    sum(c.sent_bytes_per_rank for c in calls), sum(c.seconds for c in calls))


def generate(model: TensorParallelModel, prompts: list[list[int]], max_new_tokens: int,
             stop_ids: tuple[int, ...] = ()) -> Generation:
    """Greedy tokens for equal-length prompts (one batch). Stops when every sequence has hit a stop id."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("the prompts of one tensor-parallel batch must have the same length")
    B, n = len(prompts), len(prompts[0])
    if n + max_new_tokens > model.max_len:
        raise ValueError(f"{n} prompt tokens + {max_new_tokens} new ones exceed the model's {model.max_len} positions")
    caches = model.new_caches(B)
    ids = torch.tensor(prompts, device=model.device)
    out: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    steps, sites = [], ()
    start = 0
    for step in range(max_new_tokens):
        model.trace.segments.clear()
        model.group.reset()
        logits = model.forward(ids, start, caches)
        steps.append(_cost(model, step, ids.numel()))
        if step == 1:
            sites = tuple((c.kind, c.site, c.payload_bytes) for c in model.group.calls)
        start += ids.shape[1]
        nxt = logits.argmax(-1)
        for b in range(B):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = int(nxt[b]) in stop_ids
        if all(done):
            break
        ids = nxt[:, None]
    return Generation(model.tp, tuple(tuple(t) for t in out), tuple(steps),
                      tuple(s.nbytes for s in model.shards), tuple(c.nbytes for c in caches), sites)
