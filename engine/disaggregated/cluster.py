"""`DisaggregatedEngine`: a prefill worker and a decode worker, stepped like one engine.

Each worker is a full `LLMEngine` with its own KV pool and scheduler (on a real cluster, its own
GPUs). A request goes to the prefill worker, which computes its whole prompt and samples the first
token; while its blocks are still allocated the prompt's KV is copied out through the transport,
then the decode worker copies it into blocks of its own pool and decodes the rest. The decode worker
never computes a prompt token (its `prefill_tokens_computed` counter stays 0 unless it has to
recompute after a preemption) and its iterations never wait behind a long prompt.

Time. The two workers would run at the same time on separate devices; here they take turns on one
machine, so each keeps its own clock, the sum of its measured step times plus the time it sat idle
waiting for work. One `step()` is one tick: the decode worker's next iteration (the run's heartbeat,
so `arrival_step` counts decode iterations, as on the other pages), after the prefill worker has run
every step that would have started by then. A handoff made at prefill-clock t is taken by the decode
worker at its first iteration that starts at or after t: nothing happens before its cause.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.disaggregated.records import ClusterRequestState, ClusterStepRecord, KVHandoff, Stage, WorkerStep
from engine.disaggregated.transport import Parcel, Transport, transport_for
from engine.engine import GenerationResult, LLMEngine, Prompt, SampleOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.trace import StepRecord
from engine.weights import LoadedWeights, load_weights
from kernels.device_gate import gpu_work

MAX_IDLE_JUMPS = 10_000  # a tick that finds nothing to do after this many events is a bug, not a wait


@dataclass
class _Request:
    """The cluster's own bookkeeping of one request, on the run's clock."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_step: int
    arrival_at: float | None = None  # arrives at this time instead of at tick arrival_step
    arrival_time: float = -1.0  # when it did arrive (-1 until then)
    stage: Stage = "waiting"
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    finish_time: float = -1.0
    finish_reason: str = ""


@dataclass
class _InFlight:
    handoff: KVHandoff
    parcel: Parcel
    token_ids: list[int]
    generator_state: torch.Tensor | None


class DisaggregatedEngine:
    """Duck-types the parts of `LLMEngine` a page session uses: `add_request`, `step`, `has_work`,
    `step_index`, `config`, `model_config`, `tokenizer`, `backend_description`."""

    # Samples per request it serves (a form offers no more): one sequence's KV is handed on per request.
    max_request_n = 1

    def __init__(self, config: EngineConfig = EngineConfig(), weights: LoadedWeights | None = None,
                 transport: Transport | None = None) -> None:
        if config.spec_drafter != "none":
            raise ValueError("the disaggregated engine runs without speculative decoding (spec_drafter='none')")
        if config.overlap_decode:
            raise ValueError("the disaggregated engine reads every step's tokens at once (overlap_decode=False)")
        self.config = config
        weights = weights or load_weights(config.weights, device="cpu")
        self.prefill = LLMEngine(config, weights)
        # A decode worker never prefills a prompt it could share, so it keeps no prefix cache.
        self.decode = LLMEngine(dataclasses.replace(config, enable_prefix_cache=False), weights)
        self.model_config = self.prefill.model_config
        self.tokenizer = self.prefill.tokenizer
        self.transport: Transport = transport or transport_for(self.prefill.device)
        self.prefill.on_finish = self._on_prefill_finish
        self.step_index = 0
        self._requests: dict[str, _Request] = {}
        self._pending: list[_Request] = []  # added, not yet arrived
        self._in_flight: list[_InFlight] = []
        self._sent_now: list[_InFlight] = []  # made during the prefill step that is running
        self.handoffs: list[KVHandoff] = []  # every handoff taken so far, in order

    @property
    def backend_description(self) -> str:
        return self.prefill.backend_description

    @property
    def clock(self) -> float:
        """The run's "now": the decode worker's clock (the prefill worker's may be ahead, mid-prefill)."""
        return self.decode.clock

    @property
    def device(self) -> torch.device:
        return self.prefill.device

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams = SamplingParams(),
                    arrival_step: int | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Queue a request (ValueError naming the field, nothing changed, when it cannot be served). It
        arrives at tick `arrival_step` (default: the next), or, given `arrival_time`, at that moment of the
        run's clock (how a comparison makes requests arrive at the same moments as in another run)."""
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if params.n != 1:
            raise ValueError(f"n must be 1 here (got {params.n}): a disaggregated request hands one sequence's KV on")
        ids = self.decode.check_request(prompt, params)  # the whole request must fit the decode worker
        self.prefill.check_request(ids, dataclasses.replace(params, max_tokens=1))
        arrival = self.step_index if arrival_step is None else int(arrival_step)
        if arrival < 0:
            raise ValueError(f"arrival_step must be >= 0, got {arrival_step}")
        if arrival_time is not None and not arrival_time >= 0:
            raise ValueError(f"arrival_time must be >= 0 seconds, got {arrival_time}")
        rid = request_id or f"r{len(self._requests)}"
        while request_id is None and rid in self._requests:
            rid = f"r{int(rid[1:]) + 1}"
        if rid in self._requests:
            raise ValueError(f"request_id {rid!r} is already in use")
        req = _Request(rid, ids, params, arrival, arrival_at=arrival_time)
        self._requests[rid] = req
        self._pending.append(req)
        return rid

    def has_work(self) -> bool:
        return bool(self._pending or self._in_flight or self.prefill.has_work() or self.decode.has_work())

    # ---- one tick ---------------------------------------------------------------------------------
    def step(self) -> ClusterStepRecord:
        with gpu_work(self.device):  # the KV handoffs too are GPU work a capture must not overlap
            return self._step()

    def _step(self) -> ClusterStepRecord:
        P, D = self.prefill, self.decode
        prefill_steps: list[WorkerStep] = []
        taken: list[KVHandoff] = []
        sent: list[KVHandoff] = []
        for _ in range(MAX_IDLE_JUMPS):
            self._release_arrivals(D.clock, prefill_steps, sent)
            self._run_prefill(lambda: P.clock <= D.clock, prefill_steps, sent)
            taken += self._take_ready()
            if D.has_work():
                break
            waiting = [f.handoff.sent_at for f in self._in_flight if f.handoff.sent_at > D.clock]
            if self._in_flight and not waiting:
                raise RuntimeError(f"{self._in_flight[0].handoff.request_id} does not fit the idle decode worker")
            later = [r.arrival_at for r in self._pending if r.arrival_at is not None]
            events = waiting + ([P.clock] if P.has_work() else []) + later
            if not events:
                # Nothing to do until a later tick's arrival: the run's clock moves on to the prefill worker's
                # last event, so every token it produced is in the past.
                D.clock = max(D.clock, P.clock)
                break
            D.clock = max(D.clock, min(events))  # the decode worker sits idle until then
        decode_step = None
        if D.has_work():
            start = D.clock
            record = D.step()
            decode_step = WorkerStep("decode", start, D.clock, record)
            self._note_decode(record, D.clock)
        tick = ClusterStepRecord(self.step_index, D.clock, tuple(prefill_steps), decode_step, tuple(sent),
                                 tuple(taken), tuple(f.handoff for f in self._in_flight), self._states(D.clock),
                                 P.backend_description)
        self.step_index += 1
        return tick

    def _release_arrivals(self, now: float, out: list[WorkerStep], sent: list[KVHandoff]) -> None:
        """Hand the requests due by `now` to the prefill worker, earliest first, after it has run the steps
        that began before each arrived (a step never includes a request that arrived after it started)."""
        due = [(now if r.arrival_at is None else r.arrival_at, r) for r in self._pending
               if (r.arrival_step <= self.step_index if r.arrival_at is None else r.arrival_at <= now)]
        if not due:
            return
        arrived = {id(r) for _, r in due}
        self._pending = [r for r in self._pending if id(r) not in arrived]
        P = self.prefill
        for t, req in sorted(due, key=lambda x: x[0]):
            self._run_prefill(lambda t=t: P.clock < t, out, sent)
            if not P.has_work():
                P.clock = max(P.clock, t)  # it sat idle until this one came
            req.arrival_time = t
            # The prefill worker's part of a request ends with its first token.
            P.add_request(req.prompt_ids, dataclasses.replace(req.params, max_tokens=1), request_id=req.request_id)

    def _run_prefill(self, may_start, out: list[WorkerStep], sent: list[KVHandoff]) -> None:  # noqa: ANN001
        P = self.prefill
        while P.has_work() and may_start():
            start = P.clock
            record = P.step()  # _on_prefill_finish fills _sent_now while the blocks are still allocated
            out.append(WorkerStep("prefill", start, P.clock, record))
            for s in record.batch:
                self._requests[s.request_id].stage = "prefill"
            for e in record.emitted:
                req = self._requests[e.request_id]
                req.output_ids.append(e.token_id)
                req.token_times.append(P.clock)
            for f in self._sent_now:
                f.handoff = dataclasses.replace(f.handoff, sent_at=P.clock, sent_tick=self.step_index)
                self._requests[f.handoff.request_id].stage = "transfer"
                self._in_flight.append(f)
                sent.append(f.handoff)
            self._sent_now = []
            for rid in record.finished:
                req = self._requests[rid]
                if req.stage != "transfer":  # done at the prefill worker: EOS, a stop string, or one token wanted
                    self._finish(req, P.result(rid).samples[0].finish_reason, P.clock)
            if not record.batch:
                break  # nothing schedulable (cannot happen with validated requests): never spin

    def _on_prefill_finish(self, seq: Sequence, reason: str) -> None:
        req = self._requests[seq.request_id]
        if reason != "length" or req.params.max_tokens == 1:
            return
        P = self.prefill
        blocks = P.block_manager.tables[seq.seq_id][: P.block_manager.blocks_for(seq.prompt_len)]
        parcel = self.transport.send(P.pool, blocks)
        # sent_at / sent_tick are filled in when the step ends (its wall time includes this copy).
        handoff = KVHandoff(request_id=seq.request_id, prompt_len=seq.prompt_len, first_token=seq.token_ids[-1],
                            src_blocks=tuple(blocks), dst_blocks=(), nbytes=parcel.nbytes,
                            send_seconds=parcel.send_seconds, receive_seconds=0.0, sent_at=-1.0, taken_at=-1.0,
                            sent_tick=-1, taken_tick=-1, transport=parcel.via or self.transport.name)
        state = seq.generator.get_state() if seq.generator is not None else None
        self._sent_now.append(_InFlight(handoff, parcel, list(seq.token_ids), state))

    def _take_ready(self) -> list[KVHandoff]:
        """First come, first served: a handoff waits (its parcel untouched) until the decode worker has room."""
        D = self.decode
        taken = []
        while self._in_flight:
            f = self._in_flight[0]
            h = f.handoff
            if h.sent_at > D.clock or not D.can_adopt(h.prompt_len):
                break
            self._in_flight.pop(0)
            t0 = time.perf_counter()
            req = self._requests[h.request_id]
            blocks = D.adopt_prefilled(h.request_id, f.token_ids, h.prompt_len, req.params,
                                       lambda dst, parcel=f.parcel: self.transport.receive_into(parcel, D.pool, dst),
                                       f.generator_state)
            assert blocks is not None  # can_adopt said yes
            seconds = time.perf_counter() - t0  # the copy in, and the decode worker's bookkeeping around it
            D.clock += seconds  # the decode worker spends it
            done = dataclasses.replace(h, dst_blocks=tuple(blocks), receive_seconds=seconds, taken_at=D.clock,
                                       taken_tick=self.step_index)
            req.stage = "decode"
            self.handoffs.append(done)
            taken.append(done)
        return taken

    def _note_decode(self, record: StepRecord, now: float) -> None:
        for e in record.emitted:
            req = self._requests[e.request_id]
            req.output_ids.append(e.token_id)
            req.token_times.append(now)
        for rid in record.finished:
            self._finish(self._requests[rid], self.decode.result(rid).samples[0].finish_reason, now)

    def _finish(self, req: _Request, reason: str, now: float) -> None:
        req.stage, req.finish_reason, req.finish_time = "finished", reason, now

    # ---- views ------------------------------------------------------------------------------------
    def _states(self, now: float) -> tuple[ClusterRequestState, ...]:
        """Every request as of `now`. The prefill worker may have computed a step that, on its clock, is
        still running at `now` (a long prompt): its first token and handoff are not visible yet."""
        # A "light" trace (benchmarks: hundreds of requests, thousands of ticks) skips the text, as
        # LLMEngine's does: detokenising every request's whole output on every tick is the costliest part.
        with_text = self.config.trace_detail == "full"
        out = []
        for r in self._requests.values():
            times = [t for t in r.token_times if t <= now]
            stage = r.stage
            if r.token_times and r.token_times[0] > now:
                stage = "prefill"
            elif stage == "finished" and r.finish_time > now:
                stage = "decode"
            reason = r.finish_reason if stage == "finished" else ""
            out.append(ClusterRequestState(r.request_id, stage, len(r.prompt_ids), len(times), r.arrival_time,
                                           times[0] if times else -1.0, r.finish_time if reason else -1.0, reason,
                                           tuple(times),
                                           self._text(r.output_ids[: len(times)], reason, r.params) if with_text else ""))
        return tuple(out)

    def _text(self, output_ids: list[int], finish_reason: str, params: SamplingParams) -> str:
        ids = output_ids[:-1] if finish_reason == "eos" else output_ids
        text = self.tokenizer.decode(ids)
        for s in params.stop:  # as LLMEngine reports it: the text ends before the stop string
            if s in text:
                text = text[: text.index(s)]
        return text

    def result(self, request_id: str) -> GenerationResult:
        req = self._requests[request_id]
        return GenerationResult(request_id, tuple(req.prompt_ids),
                                (SampleOutput(tuple(req.output_ids), self._text(req.output_ids, req.finish_reason, req.params),
                                              req.finish_reason),))

    def generate(self, prompts: list[Prompt], params: SamplingParams = SamplingParams(),
                 max_steps: int = 100_000) -> list[GenerationResult]:
        """Run these requests to the end; results in prompt order."""
        rids = [self.add_request(p, params) for p in prompts]
        for _ in range(max_steps):
            if not self.has_work():
                break
            self.step()
        return [self.result(r) for r in rids]
