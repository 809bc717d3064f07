"""What a disaggregated run records: every worker step on its worker's clock, every KV handoff, and
where each request stands. Frozen and JSON-friendly like `StepRecord`, which each `WorkerStep` holds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.trace import StepRecord

Worker = Literal["prefill", "decode"]
Stage = Literal["waiting", "prefill", "transfer", "decode", "finished"]


@dataclass(frozen=True, slots=True)
class WorkerStep:
    """One iteration of one worker, placed on that worker's own clock (seconds since the run began)."""

    worker: Worker
    start: float
    end: float
    record: StepRecord


@dataclass(frozen=True, slots=True)
class KVHandoff:
    """A request's prompt KV, from the prefill worker's blocks to the decode worker's."""

    request_id: str
    prompt_len: int  # tokens whose K and V moved (the whole prompt)
    first_token: int  # sampled by the prefill worker; the decode worker computes its KV
    src_blocks: tuple[int, ...]  # in the prefill worker's pool
    dst_blocks: tuple[int, ...]  # in the decode worker's pool (empty until taken)
    nbytes: int  # whole blocks, every layer, K and V
    send_seconds: float  # measured: prefill pool -> transport
    receive_seconds: float  # measured: transport -> decode pool (0 until taken)
    sent_at: float  # prefill worker's clock at the end of the step that produced the first token
    taken_at: float  # decode worker's clock once the copy in is done and the request joins its batch (-1 until then)
    sent_tick: int
    taken_tick: int  # -1 until taken
    transport: str

    @property
    def taken(self) -> bool:
        return self.taken_tick >= 0

    @property
    def waited_seconds(self) -> float:
        """From the end of the prefill step to the decode worker starting the copy in: copy out, this and the
        copy in are the whole handoff (taken_at already includes the copy in)."""
        return max(self.taken_at - self.sent_at - self.receive_seconds, 0.0)


@dataclass(frozen=True, slots=True)
class ClusterRequestState:
    request_id: str
    stage: Stage
    prompt_len: int
    output_len: int
    arrival_time: float  # seconds on the run's clock
    first_token_time: float  # -1 until the prefill worker sampled it
    finish_time: float  # -1 until finished
    finish_reason: str
    token_times: tuple[float, ...]  # every output token's time on the run's clock
    text: str

    @property
    def ttft_seconds(self) -> float:
        return self.first_token_time - self.arrival_time if self.first_token_time >= 0 else -1.0


@dataclass(frozen=True, slots=True)
class ClusterStepRecord:
    """One tick: the decode worker's next iteration, and the prefill-worker steps that ran meanwhile
    (none while a long prefill is still going, several when prefills are short)."""

    step: int
    clock: float  # the decode worker's clock after the tick (the run's "now")
    prefill_steps: tuple[WorkerStep, ...]
    decode_step: WorkerStep | None
    sent: tuple[KVHandoff, ...]  # handoffs the prefill worker made this tick
    taken: tuple[KVHandoff, ...]  # handoffs the decode worker took this tick
    in_flight: tuple[KVHandoff, ...]  # sent and not yet taken, after the tick
    requests: tuple[ClusterRequestState, ...]
    backend: str

    @property
    def last_prefill_record(self) -> StepRecord | None:
        return self.prefill_steps[-1].record if self.prefill_steps else None

    @property
    def decode_record(self) -> StepRecord | None:
        return self.decode_step.record if self.decode_step else None
