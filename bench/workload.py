"""A deterministic mixed-length workload shared by the throughput benchmarks."""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int


def mixed_requests(n: int, seed: int = 0, prompt_range: tuple[int, int] = (16, 256),
                   output_range: tuple[int, int] = (8, 96), vocab: tuple[int, int] = (200, 40000)) -> list[BenchRequest]:
    """Prompts of mixed lengths made of ordinary token ids, and mixed output lengths (EOS ignored,
    so every system does exactly the same useful work)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        plen = rng.randint(*prompt_range)
        out.append(BenchRequest(tuple(rng.randint(*vocab) for _ in range(plen)), rng.randint(*output_range)))
    return out
