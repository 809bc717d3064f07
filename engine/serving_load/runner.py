"""One engine configuration serving one arrival trace, on engine time.

The engine's clock is the sum of its measured step times. Requests join at the first step boundary after
their arrival time (a real server also picks new work up between iterations), and when nothing is left to
run the clock skips to the next arrival (`LLMEngine.wait_until`), so idle seconds are neither lost nor
spent waiting for real. Every step is a real forward pass of the model; only the gaps are skipped.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving_load.prompts import prompt_ids
from engine.serving_load.slo import SLO, RequestTiming, attainment, percentile
from engine.serving_load.workload import LoadRequest
from engine.weights import LoadedWeights

BLOCK_SIZE = 16
MAX_SEQS = 64
MAX_BUDGET = 8192
MAX_STEPS = 50_000  # a guard against a scheduler that stops making progress, far above any real run


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """The serving knobs under test: batch cap, per-step token budget, chunking, output cap."""

    label: str
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    chunked_prefill: bool = True
    output_cap: int = 0  # 0: every request generates its own output length; else at most this many tokens

    def __post_init__(self) -> None:
        where = f"configuration {self.label!r}: " if self.label else "configuration: "
        if not self.label or not self.label.strip():
            raise ValueError("every configuration needs a name")
        if not _is_int(self.max_num_seqs) or not 1 <= self.max_num_seqs <= MAX_SEQS:
            raise ValueError(f"{where}batch cap must be an integer in [1, {MAX_SEQS}], got {self.max_num_seqs!r}")
        if not _is_int(self.max_num_batched_tokens) or not 16 <= self.max_num_batched_tokens <= MAX_BUDGET:
            raise ValueError(f"{where}token budget must be an integer in [16, {MAX_BUDGET}], "
                             f"got {self.max_num_batched_tokens!r}")
        if not isinstance(self.chunked_prefill, bool):
            raise ValueError(f"{where}chunked prefill must be on or off, got {self.chunked_prefill!r}")
        if not _is_int(self.output_cap) or self.output_cap < 0:
            raise ValueError(f"{where}output cap must be an integer >= 0 (0 = none), got {self.output_cap!r}")

    def max_tokens(self, request: LoadRequest) -> int:
        return min(request.output_len, self.output_cap) if self.output_cap else request.output_len

    def check_fits(self, requests: tuple[LoadRequest, ...]) -> None:
        """Without chunking a whole prompt (plus its answer, the engine's rule) must fit one step's budget."""
        if self.chunked_prefill or not requests:
            return
        need = max(r.prompt_len + self.max_tokens(r) for r in requests)
        if need > self.max_num_batched_tokens:
            raise ValueError(f"configuration {self.label!r}: with chunked prefill off the token budget must hold "
                             f"the longest prompt and its answer ({need} tokens), but it is "
                             f"{self.max_num_batched_tokens}; raise the budget or turn chunking on")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class StepSample:
    start_s: float
    seconds: float
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True, slots=True)
class LoadRun:
    config: LoadConfig
    rate: float
    timings: tuple[RequestTiming, ...]  # in request order
    steps: tuple[StepSample, ...]
    outputs: tuple[tuple[int, ...], ...]  # each request's generated token ids, in request order
    backend: str
    capture_s: float = 0.0  # CUDA graph capture that fell inside this run's steps (0 on the CPU)

    @property
    def makespan_s(self) -> float:
        if not self.timings:
            return 0.0
        return max(t.finish_s for t in self.timings) - min(t.arrival_s for t in self.timings)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.timings)

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """Share of the run's span the engine spent computing steps (the rest it waited for arrivals)."""
        return sum(s.seconds for s in self.steps) / self.makespan_s if self.makespan_s > 0 else 0.0

    def attainment(self, slo: SLO) -> float:
        return attainment(self.timings, slo)

    def goodput_req_s(self, slo: SLO) -> float:
        """Requests that met the SLO per second of the run (the 'rate of good requests' reading)."""
        good = sum(t.meets(slo) for t in self.timings)
        return good / self.makespan_s if self.makespan_s > 0 else 0.0

    def ttft_percentile(self, q: float) -> float:
        return percentile([t.ttft_s for t in self.timings], q)

    def tpot_percentile(self, q: float) -> float:
        return percentile([t.tpot_s for t in self.timings if t.output_tokens > 1], q)


def engine_config(config: LoadConfig, requests: tuple[LoadRequest, ...], server: Mapping[str, str]) -> EngineConfig:
    """An engine for this configuration whose KV pool holds a full batch of the longest requests, so the
    run measures scheduling, not preemption (the KV cache page shows that)."""
    longest = max((r.prompt_len + config.max_tokens(r) for r in requests), default=1)
    blocks_per_seq = -(-longest // BLOCK_SIZE)
    on_gpu = server.get("device", "cpu").startswith("cuda")
    return EngineConfig(block_size=BLOCK_SIZE, num_blocks=config.max_num_seqs * blocks_per_seq + 1,
                        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                        max_model_len=max(longest, 2048), chunked_prefill=config.chunked_prefill,
                        device=server.get("device", "cpu"), dtype=server.get("dtype", "float32"),
                        weights=server.get("weights", "real"),  # type: ignore[arg-type]
                        # Kernel timing syncs the GPU after every launch; an SLO run wants the served speed.
                        profile_kernels=False, cuda_graphs=on_gpu, trace_detail="light")


def new_engine(weights: LoadedWeights, server: Mapping[str, str], config: LoadConfig,
               requests: tuple[LoadRequest, ...]) -> LLMEngine:
    """An engine for `config` sized for `requests` (and any trace of the same lengths), to serve run after run;
    `run_load` checks that each trace fits the configuration."""
    return LLMEngine(engine_config(config, requests, server), weights)


def capture_seconds(engine: LLMEngine) -> float:
    """Time the engine has spent capturing CUDA graphs so far (decode graphs and piecewise prefill graphs)."""
    total = 0.0
    if engine.graph_runner is not None:
        total += engine.graph_runner.capture_seconds
    piecewise = getattr(engine.model, "piecewise", None)
    if piecewise is not None:
        total += piecewise.capture_seconds
    return total


def run_load(weights: LoadedWeights, server: Mapping[str, str], config: LoadConfig, requests: tuple[LoadRequest, ...],
             rate: float, on_step: Callable[[], None] | None = None, engine: LLMEngine | None = None) -> LoadRun:
    """Serve `requests` (arrival times already set for `rate`); greedy, fixed lengths. `engine`: one from
    `new_engine` to reuse (its CUDA graphs already captured), idle; None builds a fresh one. Times in the
    result count from this run's start."""
    config.check_fits(requests)
    if engine is None:
        engine = new_engine(weights, server, config, requests)
    if engine.has_work():
        raise ValueError("the engine still has requests of an earlier run")
    t0 = engine.clock
    captured_before = capture_seconds(engine)
    tag = f"{engine.step_index}:"  # request ids stay unique on a reused engine
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.index)))
    admitted: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    tokens: dict[str, list[int]] = {tag + r.request_id: [] for r in requests}
    steps: list[StepSample] = []
    for _ in range(MAX_STEPS):
        while pending and t0 + pending[0].arrival_s <= engine.clock:
            r = pending.popleft()
            engine.add_request(prompt_ids(weights.tokenizer, r.prompt_len, r.index),
                               SamplingParams(max_tokens=config.max_tokens(r), ignore_eos=True),
                               request_id=tag + r.request_id)
        if not engine.has_work():
            if not pending:
                break
            engine.wait_until(t0 + pending[0].arrival_s)
            continue
        start = engine.clock - t0
        record = engine.step()
        end = engine.clock - t0
        for s in record.batch:
            admitted.setdefault(s.request_id, start)
        for e in record.emitted:
            first.setdefault(e.request_id, end)
            last[e.request_id] = end
            tokens[e.request_id].append(e.token_id)
        steps.append(StepSample(start, record.wall_seconds, len(record.batch), record.num_prefill_tokens,
                                record.num_decode_tokens))
        if on_step is not None:
            on_step()
    else:
        raise RuntimeError(f"configuration {config.label!r} did not finish within {MAX_STEPS} steps")
    ordered = sorted(requests, key=lambda r: r.index)
    timings = tuple(RequestTiming(r.request_id, r.arrival_s, admitted[tag + r.request_id], first[tag + r.request_id],
                                  last[tag + r.request_id], r.prompt_len, len(tokens[tag + r.request_id]))
                    for r in ordered)
    outputs = tuple(tuple(tokens[tag + r.request_id]) for r in ordered)
    return LoadRun(config, rate, timings, tuple(steps), outputs, engine.backend_description,
                   capture_seconds(engine) - captured_before)
