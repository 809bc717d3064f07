"""Disaggregated prefill/decode read from `ClusterStepRecord`s: each worker's steps on its own clock,
where every request's first moments went, the time between tokens, and the same requests measured on
one engine (colocated), one engine with chunked prefill, and the two workers.

Times are the run's clock (each worker's summed step times plus its idle waits, engine/disaggregated),
so scrubbing or reloading gives the same numbers.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import Callable

from engine.disaggregated import ClusterStepRecord, DisaggregatedEngine, KVHandoff, WorkerStep
from engine.disaggregated.side_by_side import RequestInput, ServedRun, StepSpan, serve_side_by_side
from engine.config import EngineConfig
from engine.engine import LLMEngine, tokenize_prompt
from engine.trace import BlockTableView, StepRecord
from engine.weights import LoadedWeights

from app.analysis.chunked import TokenGap
from app.scenarios import Scenario

CHUNKED_BUDGET = 64  # the colocated-with-chunking run's token budget (the chunked prefill page's default)


def worker_steps(history: list[ClusterStepRecord]) -> tuple[list[WorkerStep], list[WorkerStep]]:
    """(prefill worker's steps, decode worker's steps) up to the selected tick, in order."""
    prefill = [s for t in history for s in t.prefill_steps]
    decode = [t.decode_step for t in history if t.decode_step is not None]
    return prefill, decode


def latest_records(history: list[ClusterStepRecord]) -> tuple[StepRecord | None, StepRecord | None]:
    """Each worker's newest record at the selected tick (a worker may not have stepped in this tick)."""
    prefill, decode = worker_steps(history)
    return (prefill[-1].record if prefill else None), (decode[-1].record if decode else None)


def latest_prefill_step(history: list[ClusterStepRecord]) -> tuple[WorkerStep | None, tuple[KVHandoff, ...]]:
    """The prefill worker's newest step at the selected tick and the handoffs it sent."""
    for tick in reversed(history):
        if tick.prefill_steps:
            step = tick.prefill_steps[-1]
            return step, tuple(h for h in tick.sent if h.sent_at == step.end)
    return None, ()


def pool_at_send(record: StepRecord, sent: tuple[KVHandoff, ...]) -> StepRecord:
    """The prefill worker's pool as its step left it, with the blocks of the prompts it just sent drawn as
    they were while their KV was copied out (the engine frees them right after, inside the same step)."""
    pool = record.pool
    owners, refs = list(pool.owners), list(pool.ref_counts)
    tables = list(record.block_tables)
    bs = pool.block_size
    for h in sent:
        for b in h.src_blocks:
            owners[b], refs[b] = h.request_id, max(refs[b], 1)
        fills = tuple(min(bs, max(0, h.prompt_len - i * bs)) for i in range(len(h.src_blocks)))
        tables.append(BlockTableView(h.request_id, -1, h.src_blocks, fills))
    used = sum(1 for r in refs if r)
    pool = dataclasses.replace(pool, owners=tuple(owners), ref_counts=tuple(refs), used_blocks=used,
                               free_blocks=pool.num_blocks - used)
    return dataclasses.replace(record, pool=pool, block_tables=tuple(tables))


def handoffs_until(history: list[ClusterStepRecord]) -> list[KVHandoff]:
    """Every handoff the decode worker has taken by the selected tick, in order."""
    return [h for t in history for h in t.taken]


def cluster_token_gaps(history: list[ClusterStepRecord]) -> list[TokenGap]:
    """Time between consecutive tokens of each request on the run's clock. The first token comes from the
    prefill worker, the rest from the decode worker; `prefill_in_step` is never set: no decode iteration
    runs a prompt."""
    last: dict[str, float] = {}
    out: list[TokenGap] = []
    for tick in history:
        steps = list(tick.prefill_steps) + ([tick.decode_step] if tick.decode_step else [])
        for s in steps:
            for e in s.record.emitted:
                if e.request_id in last:
                    out.append(TokenGap(e.request_id, tick.step, s.end, s.end - last[e.request_id], False))
                last[e.request_id] = s.end
    return sorted(out, key=lambda g: g.time_s)


@dataclass(frozen=True, slots=True)
class FirstMoments:
    """Where one request's time went from arrival to its second token (seconds on the run's clock)."""

    request_id: str
    arrival: float
    prefill_start: float  # the prefill step that computed the last of its prompt
    first_token: float  # end of that step: the first token is out
    taken: float  # the decode worker has its KV (copied in)
    second_token: float  # -1 until then
    copy_out: float = 0.0  # seconds of that prefill step spent copying this request's KV out (at its end)

    @property
    def handoff(self) -> float:
        """The whole handoff: the copy out (inside the prefill step), the wait for the decode worker, the copy in."""
        return self.copy_out + max(self.taken - self.first_token, 0.0)


def first_moments(history: list[ClusterStepRecord]) -> list[FirstMoments]:
    if not history:
        return []
    states = {q.request_id: q for q in history[-1].requests}
    handed = {h.request_id: h for h in handoffs_until(history)}
    ends = {}  # request -> the prefill step that produced its first token
    for t in history:
        for s in t.prefill_steps:
            for e in s.record.emitted:
                ends.setdefault(e.request_id, s)
    out = []
    for rid, h in handed.items():
        q, s = states[rid], ends.get(rid)
        if s is None:
            continue
        second = q.token_times[1] if len(q.token_times) > 1 else -1.0
        out.append(FirstMoments(rid, q.arrival_time, s.start, s.end, h.taken_at, second, h.send_seconds))
    return out


# ---- the same requests three ways, measured ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ServingRun:
    """One way of serving the scenario, run to the end (times on its own clock, arrivals at the same moments
    in every run: engine/disaggregated/side_by_side.py)."""

    key: str
    label: str
    devices: int  # model replicas it takes: 1 colocated, 2 disaggregated
    ttft: tuple[tuple[str, float], ...]  # (request, seconds from its arrival)
    gaps: tuple[TokenGap, ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # (request, generated token ids)
    finished_at: float  # the run's clock when the last request finished
    errors: tuple[str, ...]
    prefill_bands: tuple[tuple[float, float], ...] = ()  # colocated: intervals of steps that ran prompt tokens

    def ttft_of(self, request_id: str) -> float:
        return dict(self.ttft).get(request_id, -1.0)


def _gaps(run: ServedRun) -> list[TokenGap]:
    if not run.spans:  # the two workers: first token from the prefill worker, the rest from the decode worker
        return cluster_token_gaps(list(run.records))
    step_of = {span.end: i for i, span in enumerate(run.spans)}
    out = [TokenGap(rid, step_of.get(b, -1), b, b - a, run.spans[step_of[b]].prefill_tokens > 0 if b in step_of else False)
           for rid, times in run.token_times.items() for a, b in zip(times, times[1:])]
    return sorted(out, key=lambda g: g.time_s)


def _bands(spans: tuple[StepSpan, ...]) -> tuple[tuple[float, float], ...]:
    """Merged intervals of consecutive steps that computed prompt tokens."""
    out: list[tuple[float, float]] = []
    for s in spans:
        if not s.prefill_tokens:
            continue
        if out and abs(out[-1][1] - s.start) < 1e-9:
            out[-1] = (out[-1][0], s.end)
        else:
            out.append((s.start, s.end))
    return tuple(out)


def _serving_run(run: ServedRun, label: str, devices: int) -> ServingRun:
    ids = list(run.outputs)
    return ServingRun(run.key, label, devices, tuple((r, run.ttft(r)) for r in ids), tuple(_gaps(run)),
                      tuple((r, run.outputs[r]) for r in ids),
                      max((t[-1] for t in run.token_times.values() if t), default=0.0), run.errors, _bands(run.spans))


def request_inputs(scenario: Scenario) -> list[RequestInput]:
    """The scenario's requests, named as an engine names them (unnamed ones r0, r1, ... in order)."""
    unnamed = itertools.count()
    return [RequestInput(spec.request_id or f"r{next(unnamed)}", spec.engine_prompt(), spec.sampling_params(),
                         spec.arrival_step) for spec in scenario.requests]


def compare_serving(scenario: Scenario, weights: LoadedWeights, server: dict[str, str], max_steps: int = 600,
                    on_progress: Callable[[int], None] | None = None) -> dict[str, ServingRun]:
    """The scenario on one engine without chunked prefill (the baseline: each prompt in one step, its budget
    raised to the largest request where needed; requests arrive at their steps), then, with the requests
    arriving at the same moments, on one engine with chunked prefill (budget 64) and on the two workers as
    configured. The baseline turns chunking off itself: the scenario's own engine chunks by default, and a
    budget of 64 made "colocated" and "chunked" the same run."""
    chunked = scenario.with_engine(chunked_prefill=True,
                                   max_num_batched_tokens=min(CHUNKED_BUDGET,
                                                              scenario.engine_config().max_num_batched_tokens))
    config = scenario.engine_config(**server)
    inputs = request_inputs(scenario)
    colocated = LLMEngine(unchunked_config(config, inputs, weights), weights)
    runs = serve_side_by_side(("colocated", colocated),
                              {"chunked": LLMEngine(chunked.engine_config(**server), weights),
                               "disaggregated": DisaggregatedEngine(config, weights)},
                              inputs, max_steps, on_progress)
    budget = colocated.config.max_num_batched_tokens
    return {"colocated": _serving_run(runs["colocated"], f"colocated: one engine, no chunking, budget {budget}",
                                      1),
            "chunked": _serving_run(runs["chunked"], f"colocated + chunked prefill, budget "
                                    f"{chunked.engine_config().max_num_batched_tokens}", 1),
            "disaggregated": _serving_run(runs["disaggregated"], "disaggregated: a prefill worker + a decode worker",
                                          2)}


def unchunked_config(config: EngineConfig, inputs: list[RequestInput], weights: LoadedWeights) -> EngineConfig:
    """`config` with chunked prefill off and a token budget that holds every request's prompt and max_tokens in
    one step (what an engine without chunking needs: a preempted request is prefilled again with its output)."""
    need = max((len(tokenize_prompt(weights.tokenizer, r.prompt)) + r.params.max_tokens for r in inputs), default=0)
    return dataclasses.replace(config, chunked_prefill=False,
                               max_num_batched_tokens=max(config.max_num_batched_tokens, need))


def worst_gap(gaps: list[TokenGap]) -> TokenGap | None:
    return max(gaps, key=lambda g: g.gap_s, default=None)


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else 0.0


def coinciding_requests(runs: dict[str, ServingRun], exclude: str | None = None) -> dict[str, list[list[str]]]:
    """Per run, groups of requests (two or more, `exclude` left out) whose time-between-tokens series are the
    same: they decode in the same iterations, so their lines in that run's panel lie on one another. Per run,
    not across all: chat1 coincided with chat2 and chat3 in two panels of three and went unnamed."""
    out: dict[str, list[list[str]]] = {}
    for key, run in runs.items():
        series: dict[str, list[tuple[float, float]]] = {}
        for g in run.gaps:
            if g.request_id != exclude:
                series.setdefault(g.request_id, []).append((round(g.time_s, 9), round(g.gap_s, 9)))
        groups: dict[tuple[tuple[float, float], ...], list[str]] = {}
        for rid, points in series.items():
            groups.setdefault(tuple(points), []).append(rid)
        # In name order, numbers as numbers: "chat2, chat3" (the gaps' order wrote "chat3, chat2"), r2 before r10.
        out[key] = [sorted(ids, key=lambda r: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", r)])
                    for ids in groups.values() if len(ids) > 1]
    return out
