"""`StepRecord`: the immutable picture of one engine iteration.

Pages draw these and nothing else; scrubbing the timeline redraws old records and never re-runs the
engine. Records are plain frozen dataclasses of ints, floats, strings and tuples, so thousands fit in
memory and a trace round-trips through JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, get_args, get_origin, get_type_hints

Phase = Literal["waiting", "prefill", "decode", "finished", "preempted"]


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One sequence's share of this step's batch."""

    request_id: str
    seq_id: int
    phase: Phase  # "prefill" (a prompt chunk, possibly the whole prompt) or "decode"
    num_tokens: int  # tokens computed this step
    context_len: int  # tokens in the KV cache after this step
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)


@dataclass(frozen=True, slots=True)
class EmittedToken:
    request_id: str
    seq_id: int
    token_id: int
    text: str
    logprob: float | None = None  # log p(token) under the model, when the request asked for logprobs
    forced: str = ""  # "" = sampled by the model; else the label of the engine's forcing ("wait", "cue", ...)


@dataclass(frozen=True, slots=True)
class BlockTableView:
    """A sequence's logical-to-physical map: block i of the sequence lives in physical block ids[i]."""

    request_id: str
    seq_id: int
    block_ids: tuple[int, ...]
    fills: tuple[int, ...]  # tokens written in each block (block_size for all but maybe the last)


@dataclass(frozen=True, slots=True)
class PoolSummary:
    num_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int  # held only by the prefix cache (evictable)
    allocated_tokens: int  # slots in used blocks
    filled_tokens: int  # slots holding a real token
    internal_waste_tokens: int  # allocated but unused slots in partly filled blocks
    contiguous_reserved_tokens: int  # what max_model_len reservations would hold for the same sequences
    contiguous_waste_tokens: int
    ref_counts: tuple[int, ...]  # per physical block, 0 = free
    owners: tuple[str, ...]  # per physical block: request id, "shared", "cache" or ""
    free_list: tuple[int, ...] = ()  # free block ids in the order they will be handed out

    @property
    def paged_waste_fraction(self) -> float:
        return self.internal_waste_tokens / self.allocated_tokens if self.allocated_tokens else 0.0

    @property
    def contiguous_waste_fraction(self) -> float:
        r = self.contiguous_reserved_tokens
        return self.contiguous_waste_tokens / r if r else 0.0


@dataclass(frozen=True, slots=True)
class KernelTiming:
    """Aggregated calls of one kernel in one step."""

    name: str
    backend: str  # "torch", "triton", "cuda-graph"
    calls: int
    seconds: float
    flops: float
    bytes: float


@dataclass(frozen=True, slots=True)
class MemorySplit:
    weights_bytes: int
    kv_pool_bytes: int
    other_bytes: int


@dataclass(frozen=True, slots=True)
class RequestState:
    """Where every known request stands after this step (for Gantt charts and tables)."""

    request_id: str
    status: Phase
    prompt_len: int
    output_len: int
    num_computed_tokens: int
    arrival_step: int
    first_token_step: int  # -1 until the first token
    finish_step: int  # -1 until finished
    num_preemptions: int
    finish_reason: str  # "", "eos", "length", "stop", "aborted"
    ttft_seconds: float = -1.0  # engine clock: arrival to first token (-1 until then)
    tpot_seconds: float = -1.0  # mean time per output token after the first (-1 until two tokens)
    text: str = ""  # output so far


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    wall_seconds: float  # the whole iteration: schedule + forward + sample
    forward_seconds: float
    batch: tuple[ScheduledSeq, ...]
    emitted: tuple[EmittedToken, ...]
    block_tables: tuple[BlockTableView, ...]
    pool: PoolSummary
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    kernels: tuple[KernelTiming, ...]
    memory: MemorySplit
    requests: tuple[RequestState, ...]
    backend: str  # "torch (CPU reference)" / "triton" ...
    extras: tuple[tuple[str, Any], ...] = ()  # feature-specific payloads (radix, spec...), JSON-able

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.batch)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.batch if s.phase == "prefill")

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.batch if s.phase == "decode")

    def extra(self, key: str, default: Any = None) -> Any:
        for k, v in self.extras:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict:
        return _to_jsonable(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepRecord":
        return _from_jsonable(cls, data)


def _to_jsonable(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    return obj


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _from_jsonable(tp: Any, data: Any) -> Any:
    if is_dataclass(tp) and isinstance(data, dict):
        hints = get_type_hints(tp)
        return tp(**{f.name: _from_jsonable(hints[f.name], data[f.name]) for f in fields(tp) if f.name in data})
    origin = get_origin(tp)
    if origin is tuple and isinstance(data, list):
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_jsonable(args[0], x) for x in data)
        if args:
            return tuple(_from_jsonable(a, x) for a, x in zip(args, data))
        return _freeze(data)
    return _freeze(data)


def save_trace(records: Iterable[StepRecord], path: str | Path) -> None:
    Path(path).write_text(json.dumps([r.to_dict() for r in records]))


def load_trace(path: str | Path) -> list[StepRecord]:
    return [StepRecord.from_dict(d) for d in json.loads(Path(path).read_text())]
