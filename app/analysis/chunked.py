"""Chunked prefill read from StepRecords: the token split of every iteration, the time between the
tokens each request receives, the worst stall, and a chunked vs prefill-first run of the same requests.

Time is the engine clock (the running sum of step wall times), so idle UI time never counts and a
scrubbed or reloaded trace gives the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.trace import StepRecord
from engine.weights import LoadedWeights

from app.analysis.side_by_side import step_alternately
from app.analysis.trace_metrics import cumulative_clock
from app.scenarios import RequestSpec, Scenario
from app.session import EngineSession, SessionError


@dataclass(frozen=True, slots=True)
class StepSplit:
    step: int
    prefill_tokens: int
    decode_tokens: int
    prefill_requests: tuple[str, ...]
    wall_seconds: float
    forward_seconds: float


def step_splits(records: list[StepRecord]) -> list[StepSplit]:
    return [StepSplit(r.step, r.num_prefill_tokens, r.num_decode_tokens,
                      tuple(s.request_id for s in r.batch if s.phase == "prefill"), r.wall_seconds,
                      r.forward_seconds) for r in records]


@dataclass(frozen=True, slots=True)
class TokenGap:
    request_id: str
    step: int  # the step that emitted the later token
    time_s: float  # engine clock at the end of that step
    gap_s: float  # time since this request's previous token
    prefill_in_step: bool  # the step also ran a prompt (chunk)


def token_gaps(records: list[StepRecord]) -> list[TokenGap]:
    """Inter-token gaps of every request (its first token has no gap: that is TTFT)."""
    clock = cumulative_clock(records)
    last: dict[str, float] = {}
    out: list[TokenGap] = []
    for r, t in zip(records, clock):
        prefill = r.num_prefill_tokens > 0
        for e in r.emitted:
            if e.request_id in last:
                out.append(TokenGap(e.request_id, r.step, t, t - last[e.request_id], prefill))
            last[e.request_id] = t
    return out


def longest_prompt_request(records: list[StepRecord]) -> str | None:
    if not records or not records[-1].requests:
        return None
    return max(records[-1].requests, key=lambda q: q.prompt_len).request_id


def worst_stall(records: list[StepRecord], exclude: str | None = None) -> TokenGap | None:
    """The longest wait between two tokens of any request other than `exclude` (by default the
    longest prompt: the decodes it interrupts are what stall)."""
    exclude = exclude if exclude is not None else longest_prompt_request(records)
    gaps = [g for g in token_gaps(records) if g.request_id != exclude]
    return max(gaps, key=lambda g: g.gap_s, default=None)


def median_gap(records: list[StepRecord], exclude: str | None = None) -> float | None:
    """None until some request has two tokens (the page shows "–", not "0 ms")."""
    exclude = exclude if exclude is not None else longest_prompt_request(records)
    gaps = sorted(g.gap_s for g in token_gaps(records) if g.request_id != exclude)
    return gaps[len(gaps) // 2] if gaps else None


# ---- chunked vs prefill-first, measured --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ChunkRun:
    chunked: bool
    budget: int
    records: tuple[StepRecord, ...]
    errors: tuple[SessionError, ...]

    @property
    def label(self) -> str:
        return "chunked prefill" if self.chunked else "prefill-first (no chunking)"

    @property
    def key(self) -> str:
        return "chunked" if self.chunked else "unchunked"


def spec_prompt_len(spec: RequestSpec, weights: LoadedWeights) -> int:
    tok = weights.tokenizer
    prompt = spec.engine_prompt()
    return len(tok.apply_chat_template(prompt) if isinstance(prompt, list) else tok.encode(prompt))


def unchunked_budget(scenario: Scenario, weights: LoadedWeights) -> int:
    """Without chunking a whole prompt (plus its max_tokens, the engine's check) must fit one step."""
    need = max((spec_prompt_len(r, weights) + r.max_tokens for r in scenario.requests), default=1)
    return max(scenario.engine_config().max_num_batched_tokens, need)


def compare_chunking(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 400,
                     on_progress: Callable[[int], None] | None = None) -> dict[str, ChunkRun]:
    """Run the scenario with chunked prefill on (its own budget) and off (budget raised to fit the
    longest prompt); the engines step alternately so background load falls on both alike."""
    budget = scenario.engine_config().max_num_batched_tokens
    configs = {True: budget, False: unchunked_budget(scenario, weights)}
    sessions = {on: EngineSession.create(scenario.with_engine(chunked_prefill=on, max_num_batched_tokens=b),
                                         weights, server) for on, b in configs.items()}
    step_alternately(sessions, max_steps, on_progress)
    runs = [ChunkRun(on, configs[on], tuple(s.records), tuple(s.errors)) for on, s in sessions.items()]
    return {r.key: r for r in runs}
