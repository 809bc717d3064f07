"""What arrives: how many requests, how long their prompts and outputs are, and when they come.

Lengths are drawn once per workload seed and arrival gaps are drawn as unit exponentials once too, then
divided by the rate: every rate sees the same requests in the same order, only closer together or further
apart (common random numbers), so a difference between two rates is the load, not a luckier draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_REQUESTS = 64


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    num_requests: int
    prompt_tokens: tuple[int, int]  # inclusive range, drawn uniformly
    output_tokens: tuple[int, int]
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.num_requests <= MAX_REQUESTS:
            raise ValueError(f"number of requests must be in [1, {MAX_REQUESTS}], got {self.num_requests}")
        for what, (lo, hi) in (("prompt", self.prompt_tokens), ("output", self.output_tokens)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{what} lengths must satisfy 1 <= min <= max, got {lo}..{hi}")

    def with_requests(self, num_requests: int, seed: int | None = None) -> "WorkloadSpec":
        return WorkloadSpec(self.name, num_requests, self.prompt_tokens, self.output_tokens,
                            self.seed if seed is None else seed)


# Sized for the CPU reference path (a decode step there costs ~45-105 ms, a prompt token ~1-2 ms).
WORKLOADS: dict[str, WorkloadSpec] = {
    "Chat (short prompts, longer answers)": WorkloadSpec("chat", 16, (24, 96), (12, 32)),
    "RAG (long prompts, short answers)": WorkloadSpec("rag", 16, (256, 512), (6, 16)),
    "Mixed (chat and RAG interleaved)": WorkloadSpec("mixed", 16, (24, 512), (6, 40)),
}


@dataclass(frozen=True, slots=True)
class LoadRequest:
    index: int
    arrival_s: float  # engine time at which it reaches the server
    prompt_len: int
    output_len: int

    @property
    def request_id(self) -> str:
        return f"q{self.index:02d}"


def arrivals(num_requests: int, rate: float, seed: int) -> np.ndarray:
    """Poisson arrivals at `rate` requests per second; the first one at time 0."""
    if not rate > 0 or not np.isfinite(rate):
        raise ValueError(f"request rate must be a positive number of requests per second, got {rate!r}")
    gaps = np.random.default_rng([seed, 1]).exponential(1.0, num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps) / rate


def make_requests(spec: WorkloadSpec, rate: float) -> tuple[LoadRequest, ...]:
    rng = np.random.default_rng([spec.seed, 0])
    prompts = rng.integers(spec.prompt_tokens[0], spec.prompt_tokens[1] + 1, spec.num_requests)
    outputs = rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, spec.num_requests)
    if spec.name == "mixed":  # every other request is a RAG-style one: long prompt, short answer
        rag = np.arange(spec.num_requests) % 2 == 1
        prompts = np.where(rag, np.maximum(prompts, (spec.prompt_tokens[0] + spec.prompt_tokens[1]) // 2),
                           np.minimum(prompts, spec.prompt_tokens[0] + 72))
        outputs = np.where(rag, np.minimum(outputs, 16), np.maximum(outputs, 16))
    times = arrivals(spec.num_requests, rate, spec.seed)
    return tuple(LoadRequest(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(times, prompts, outputs)))
