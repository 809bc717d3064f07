"""Facts derived from a list of StepRecords: Gantt segments, copy-on-write events, latencies.

Everything is computed from records alone, so it works the same for a live run, a scrubbed
earlier step, or a trace loaded from JSON.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from engine.trace import PoolSummary, StepRecord


@dataclass(frozen=True, slots=True)
class Segment:
    request_id: str
    status: str
    start: int  # first step in this status
    end: int  # last step in this status (inclusive)


@dataclass(frozen=True, slots=True)
class CowEvent:
    step: int
    request_id: str
    logical_block: int
    shared_block: int  # the physical block that was shared before this step
    new_block: int  # the private copy this sequence writes into from now on


@dataclass(frozen=True, slots=True)
class RequestLatency:
    request_id: str
    arrival_step: int
    finish_step: int
    output_tokens: int
    ttft_s: float
    e2e_s: float  # engine clock from the start of its arrival step to the end of its finish step
    num_preemptions: int


def request_ids(records: list[StepRecord]) -> list[str]:
    """Every request label in order of first appearance."""
    seen: dict[str, None] = {}
    for r in records:
        for q in r.requests:
            seen.setdefault(q.request_id, None)
    return list(seen)


def status_at(record: StepRecord, request_id: str) -> str:
    """What a request was doing *during* a step: the batch says whether it ran (prefill or decode);
    otherwise its state after the step says why not (waiting, preempted, stalled, finished).

    RequestState alone is not enough: it is the state after the step, so a prompt that was prefilled
    this step already reads "decode"."""
    for s in record.batch:
        if s.request_id == request_id:
            return s.phase
    emitted = any(e.request_id == request_id for e in record.emitted)
    for q in record.requests:
        if q.request_id == request_id:
            if emitted:  # an n > 1 sample forked from its sibling's prefill: it shared that prefill
                return "prefill" if q.first_token_step == record.step else "decode"
            if q.status == "finished":
                return "finished"
            if q.arrival_step > record.step:
                return "not arrived"
            if q.status in ("prefill", "decode"):
                return "stalled"  # admitted (holds blocks) but not scheduled this step
            return q.status  # "waiting" or "preempted"
    return "not arrived"


def gantt_segments(records: list[StepRecord]) -> list[Segment]:
    """Runs of equal status per request (time before arrival is left out)."""
    segments: list[Segment] = []
    for rid in request_ids(records):
        run: list = []  # [status, start, end] of the run being extended
        for rec in records:
            status = status_at(rec, rid)
            if run and run[0] == status:
                run[2] = rec.step
                continue
            if run and run[0] != "not arrived":
                segments.append(Segment(rid, run[0], run[1], run[2]))
            run = [status, rec.step, rec.step]
        if run and run[0] != "not arrived":
            segments.append(Segment(rid, run[0], run[1], run[2]))
    return segments


def cow_events(records: list[StepRecord]) -> list[CowEvent]:
    """Steps where a sequence's block-table entry switched away from a block that was shared
    (ref count > 1) in the previous record: a copy-on-write."""
    events: list[CowEvent] = []
    for prev, cur in zip(records, records[1:]):
        before = {t.request_id: t.block_ids for t in prev.block_tables}
        for t in cur.block_tables:
            old = before.get(t.request_id)
            if not old:
                continue
            for i, (a, b) in enumerate(zip(old, t.block_ids)):
                if a != b and prev.pool.ref_counts[a] > 1:
                    events.append(CowEvent(cur.step, t.request_id, i, a, b))
    return events


def cumulative_clock(records: list[StepRecord]) -> list[float]:
    """Engine clock at the end of each record (sum of step wall times)."""
    return list(accumulate(r.wall_seconds for r in records))


def request_latencies(records: list[StepRecord]) -> list[RequestLatency]:
    if not records:
        return []
    clock = cumulative_clock(records)
    start_of = {r.step: c - r.wall_seconds for r, c in zip(records, clock)}
    end_of = {r.step: c for r, c in zip(records, clock)}
    out: list[RequestLatency] = []
    for q in records[-1].requests:
        if q.finish_step < 0:
            continue
        t0 = start_of.get(q.arrival_step, 0.0)
        out.append(RequestLatency(q.request_id, q.arrival_step, q.finish_step, q.output_len, q.ttft_seconds,
                                  end_of.get(q.finish_step, clock[-1]) - t0, q.num_preemptions))
    return out


def output_tokens(records: list[StepRecord]) -> int:
    return sum(len(r.emitted) for r in records)


def throughput(records: list[StepRecord]) -> float:
    """Generated tokens per second of engine time (steps that did nothing still count)."""
    total = sum(r.wall_seconds for r in records)
    return output_tokens(records) / total if total > 0 else 0.0


def block_fills(record: StepRecord) -> dict[int, int]:
    """Tokens written in each used physical block (the fullest view when several tables share it)."""
    fills: dict[int, int] = {}
    for t in record.block_tables:
        for b, f in zip(t.block_ids, t.fills):
            fills[b] = max(fills.get(b, 0), f)
    bs = record.pool.block_size
    for b, owner in enumerate(record.pool.owners):
        if owner == "cache":
            fills[b] = bs
    return fills


def tokens_by_owner(record: StepRecord) -> dict[str, int]:
    """Cached tokens attributed to the block's owner (a shared block counts once, as 'shared')."""
    out: dict[str, int] = {}
    for b, f in block_fills(record).items():
        owner = record.pool.owners[b] or "?"
        out[owner] = out.get(owner, 0) + f
    return out


def fullest_before(record: StepRecord, history: list[StepRecord],
                   measure: Callable[[PoolSummary], int] = lambda pool: pool.used_blocks) -> StepRecord | None:
    """The step of `history` whose pool held the most (blocks, or what `measure` counts), when `record`'s pool
    holds nothing and that one's does: after Run to end every request has returned its blocks, and an empty
    view is right but teaches nothing."""
    if measure(record.pool) or not history:
        return None
    fullest = max(history, key=lambda r: measure(r.pool))
    return fullest if measure(fullest.pool) else None
