"""Serve the same requests on several engines, arriving at the same moments, and keep what each did.

Arrival steps mean different moments on different engines: a colocated engine's step that runs a long
prompt lasts far longer than the decode worker's, so "step 12" comes later on it. The first engine (the
baseline) takes each request at its `arrival_step`; the moment that step began on the baseline's clock
becomes the request's arrival time on every other engine. An `LLMEngine` takes a request at its first
step that starts at or after that time (its clock jumps ahead when it has nothing to do); a
`DisaggregatedEngine` takes it at that moment (`arrival_time`). Time to first token is measured from
the arrival time everywhere. The other engines step in turn, so background load falls on them alike.

On a GPU the first steps of an engine compile Triton kernels and capture CUDA graphs (seconds): with
`warmup_passes` every engine first serves the same requests untimed; the measured run's steps and times
then count from where the warm-up left each engine.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Union

from engine.disaggregated.cluster import DisaggregatedEngine
from engine.engine import LLMEngine, Prompt
from engine.sampling_params import SamplingParams

AnyEngine = Union[LLMEngine, DisaggregatedEngine]


@dataclass(frozen=True, slots=True)
class RequestInput:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    arrival_step: int = 0


@dataclass(frozen=True, slots=True)
class StepSpan:
    """One iteration of a colocated engine on its clock, and whether it computed prompt tokens."""

    start: float
    end: float
    prefill_tokens: int


@dataclass(frozen=True, slots=True)
class ServedRun:
    key: str
    records: tuple  # StepRecords (LLMEngine) or ClusterStepRecords (DisaggregatedEngine)
    arrival_times: dict[str, float]
    token_times: dict[str, tuple[float, ...]]  # every output token's time on this run's clock
    outputs: dict[str, tuple[int, ...]]
    spans: tuple[StepSpan, ...] = ()  # colocated engines only
    errors: tuple[str, ...] = ()

    def ttft(self, request_id: str) -> float:
        times = self.token_times.get(request_id, ())
        return times[0] - self.arrival_times[request_id] if times else -1.0


@dataclass
class _Runner:
    key: str
    engine: AnyEngine
    step0: int = 0  # the engine's step index and clock when the measured run began
    clock0: float = 0.0
    records: list = field(default_factory=list)
    spans: list[StepSpan] = field(default_factory=list)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    feed: list[tuple[float, RequestInput]] = field(default_factory=list)  # LLMEngine: time-fed, earliest first
    accepted: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.step0, self.clock0 = self.engine.step_index, self.engine.clock

    def has_work(self) -> bool:
        return bool(self.feed) or self.engine.has_work()

    def step(self) -> None:
        engine = self.engine
        if isinstance(engine, LLMEngine):
            if self.feed and not engine.has_work():
                engine.clock = max(engine.clock, self.clock0 + self.feed[0][0])  # idle until the next arrival
            while self.feed and self.clock0 + self.feed[0][0] <= engine.clock:
                self._add(self.feed.pop(0)[1])
            if not engine.has_work():
                return
        start = engine.clock - self.clock0
        record = engine.step()
        self.records.append(record)
        if isinstance(engine, LLMEngine):
            end = engine.clock - self.clock0
            self.spans.append(StepSpan(start, end, record.num_prefill_tokens))
            for e in record.emitted:
                self.token_times.setdefault(e.request_id, []).append(end)

    def _add(self, r: RequestInput, **arrival) -> None:  # noqa: ANN003
        try:
            self.engine.add_request(r.prompt, r.params, request_id=r.request_id, **arrival)
            self.accepted.add(r.request_id)
        except ValueError as e:
            self.errors.append(f"{r.request_id}: {e}")


def serve_side_by_side(baseline: tuple[str, LLMEngine], others: dict[str, AnyEngine], requests: list[RequestInput],
                       max_steps: int = 2000, on_progress: Callable[[int], None] | None = None,
                       warmup_passes: int = 0) -> dict[str, ServedRun]:
    """Run `baseline` with step arrivals, then `others` side by side with the baseline's arrival moments.
    `warmup_passes`: serve the same requests (renamed) that many times first, untimed. Two are needed on a
    GPU: the first pass's arrival moments are stretched by compiles and captures, so the time-fed engines
    batch differently in it than in a warm pass; the second pass batches like the measured one."""
    for i in range(warmup_passes):
        renamed = [dataclasses.replace(r, request_id=f"warmup{i}-{r.request_id}") for r in requests]
        _serve_once(baseline, others, renamed, max_steps, None)
    return _serve_once(baseline, others, requests, max_steps, on_progress)


def _serve_once(baseline: tuple[str, LLMEngine], others: dict[str, AnyEngine], requests: list[RequestInput],
                max_steps: int, on_progress: Callable[[int], None] | None) -> dict[str, ServedRun]:
    key, engine = baseline
    base = _Runner(key, engine)
    for r in requests:
        base._add(r, arrival_step=base.step0 + r.arrival_step)
    arrivals: dict[str, float] = {}
    steps = 0
    while base.engine.has_work() and steps < max_steps:
        for r in requests:  # the moment its arrival step begins
            if r.arrival_step == engine.step_index - base.step0 and r.request_id not in arrivals:
                arrivals[r.request_id] = engine.clock - base.clock0
        base.step()
        steps += 1
        if on_progress:
            on_progress(steps)
    runners = [base]
    for k, other in others.items():
        runner = _Runner(k, other)
        timed = sorted(((arrivals.get(r.request_id, 0.0), r) for r in requests), key=lambda x: x[0])
        if isinstance(other, DisaggregatedEngine):
            for t, r in timed:
                runner._add(r, arrival_time=runner.clock0 + t)
        else:
            runner.feed = timed
        runners.append(runner)
    rounds = 0
    rest = runners[1:]
    while rest and any(r.has_work() for r in rest) and rounds < max_steps:
        first = rounds % len(rest)
        for r in rest[first:] + rest[:first]:
            if r.has_work():
                r.step()
        rounds += 1
        if on_progress:
            on_progress(steps + rounds)
    return {r.key: _served(r, arrivals) for r in runners}


def _served(r: _Runner, arrivals: dict[str, float]) -> ServedRun:
    engine = r.engine
    if isinstance(engine, DisaggregatedEngine) and r.records:
        states = [q for q in r.records[-1].requests if q.request_id in r.accepted]
        times = {q.request_id: tuple(t - r.clock0 for t in q.token_times) for q in states}
        arrival_times = {q.request_id: q.arrival_time - r.clock0 for q in states}
    else:
        times = {k: tuple(v) for k, v in r.token_times.items()}
        arrival_times = {k: arrivals.get(k, 0.0) for k in r.accepted}
    outputs = {rid: engine.result(rid).token_ids for rid in r.accepted}
    return ServedRun(r.key, tuple(r.records), arrival_times, times, outputs, tuple(r.spans), tuple(r.errors))
