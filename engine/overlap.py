"""Overlapped decode: the host prepares step k + 1 while the GPU computes step k.

A decode step's graph replay is ~1 ms on the H200 at batch 1 and ~1.5 ms at batch 256, and the
host's share of a step (scheduling, building the batch, reading the tokens, stop checks, the
record) is another 0.2 to 3 ms depending on the batch. Run one after the other they add up; here
they overlap:

- When a greedy decode step is launched its argmax stays on the GPU (plus an asynchronous copy to
  pinned host memory), and each sequence gets a placeholder token (`PENDING`) on the host.
- The scheduler then schedules step k + 1 as usual (a decode adds exactly one token, whatever it
  is), and the rows whose input is a placeholder take their token from step k's argmax with a
  gather on the device, queued behind step k on the same stream.
- Only after launching step k + 1 does the host wait for step k (not for k + 1) and resolve its
  placeholders, check stop conditions, and build step k's record, while the GPU runs k + 1.

What it costs: a request that stops on EOS or a stop string at step k has already been scheduled
into step k + 1, so that row's work is thrown away (it writes one KV slot in blocks the request has
just freed; the stream orders that write before any later owner's). Requests that stop on length
are known in advance and never run the extra row. Records arrive one call late.

Only steps whose rows are all greedy single-sample decodes, and whose batch fits a CUDA-graph
bucket, overlap; any other step (a prefill chunk, temperature sampling, n > 1, a preemption)
first collects everything in flight and then runs synchronously.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.sequence import PENDING, Sequence
from engine.trace import EmittedToken, ScheduledSeq, StepRecord

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.scheduler import SchedulerOutput


@dataclass(slots=True)
class InflightStep:
    """A launched decode step whose tokens the host has not read yet."""

    step: int
    rows: list[tuple[Sequence, int]]  # (sequence, index of its placeholder; -1: its last token, appended)
    batch_view: list[ScheduledSeq]
    preempted: list[Sequence]
    tokens: torch.Tensor  # [n] int64 on the GPU: each row's greedy token
    host_tokens: torch.Tensor  # [n] int64 pinned: its asynchronous copy
    start: torch.cuda.Event
    end: torch.cuda.Event


class DecodePipeline:
    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine
        self.inflight: collections.deque[InflightStep] = collections.deque()
        self._mark = 0.0  # when the last record of this call was produced (splits a call's wall time)
        # Events record on this stream, given explicitly: asking torch for the current stream at
        # every record costs a device lookup (~30 us a step at batch 1 under the profiler).
        self.stream = torch.cuda.current_stream(engine.device) if engine.device.type == "cuda" else None

    # ---- one call of engine.step() -----------------------------------------------------------------
    def step(self) -> StepRecord | None:
        """A record, or None when this call ran a step synchronously (its records, and any it
        collected first, are in the engine's ready queue)."""
        eng = self.engine
        self._mark = time.perf_counter()
        while True:
            t0, step, sched = eng._schedule_step()
            if not sched.scheduled:
                if self.inflight:  # everything still running waits on tokens in flight
                    return self._collect()
                return eng._run_step(t0, step, sched)  # an idle step, as in synchronous mode
            if not self._overlappable(sched):
                while self.inflight:
                    eng._ready_records.append(self._collect())
                # Requests the collected tokens just finished (EOS, stop string) leave this step.
                sched.scheduled = [(s, n) for s, n in sched.scheduled if not s.finished]
                eng._ready_records.append(eng._run_step(time.perf_counter(), step, sched))
                return None
            self._launch(step, sched)
            if len(self.inflight) > 1:  # the pipeline is full: read the older step while the GPU runs
                return self._collect()

    def _overlappable(self, sched: "SchedulerOutput") -> bool:
        eng = self.engine
        runner = eng.graph_runner
        if runner is None or eng.speculator is not None or sched.preempted:
            return False
        if runner.bucket_for(len(sched.scheduled)) is None:
            return False
        latest = {seq.seq_id for seq, _ in self.inflight[-1].rows} if self.inflight else set()
        for seq, n in sched.scheduled:
            p = seq.params
            if n != 1 or seq.in_prefill or not p.greedy or p.n != 1:
                return False
            if seq.token_ids[seq.num_computed_tokens] == PENDING and seq.seq_id not in latest:
                return False  # its input token is not the latest step's output
        return True

    # ---- launch --------------------------------------------------------------------------------------
    def _launch(self, step: int, sched: "SchedulerOutput") -> None:
        eng = self.engine
        bm = eng.block_manager
        prev = self.inflight[-1] if self.inflight else None
        prev_row = {seq.seq_id: i for i, (seq, _) in enumerate(prev.rows)} if prev is not None else {}
        toks, positions, slots, tables, versions, src = [], [], [], [], [], []
        all_tables, all_versions, bs = bm.tables, bm.versions, bm.block_size
        for seq, _ in sched.scheduled:
            sid = seq.seq_id
            start = seq.num_computed_tokens
            tok = seq.token_ids[start]
            src.append(prev_row[sid] if tok == PENDING else -1)
            toks.append(max(tok, 0))
            positions.append(start)
            table = all_tables[sid]
            slots.append(table[start // bs] * bs + start % bs)  # bm.slots(sid, start, 1), inlined: per row
            tables.append(table)
            versions.append(all_versions[sid])
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
        stream = self.stream
        start_ev.record(stream)
        gather = (prev.tokens, src) if prev is not None and max(src) >= 0 else None
        logits = eng._graph_replay(lambda: eng.graph_runner.replay_rows(toks, positions, slots, tables, gather,
                                                                        versions))
        tokens = logits.argmax(-1)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        end_ev.record(stream)
        # The host state moves on as if the step had run: one more computed token per row, and a
        # placeholder for the token it produced unless that token is the request's last (length).
        rows, view = [], []
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += 1
            view.append(ScheduledSeq(seq.label, seq.seq_id, "decode", 1, seq.num_computed_tokens, 0))
            if seq.output_len + 1 >= seq.params.max_tokens:
                rows.append((seq, -1))
            else:
                seq.token_ids.append(PENDING)
                rows.append((seq, seq.num_tokens - 1))
        c = eng.counters
        c["forward_passes"] += 1
        c["decode_tokens_computed"] += len(rows)
        self.inflight.append(InflightStep(step, rows, view, list(sched.preempted), tokens, host, start_ev, end_ev))
        eng.step_index += 1

    # ---- collect -------------------------------------------------------------------------------------
    def _collect(self) -> StepRecord:
        """Wait for the oldest step in flight, resolve its placeholders and build its record."""
        eng = self.engine
        st = self.inflight.popleft()
        st.end.synchronize()
        tokens = st.host_tokens.tolist()
        now = eng.clock + time.perf_counter() - self._mark
        emitted: list[EmittedToken] = []
        finished: list[str] = []
        for (seq, at), tok in zip(st.rows, tokens):
            if seq.finished:  # stopped on an earlier step's token, or aborted: this row was spare
                continue
            eng._sample_into(seq, None, st.step, now, emitted, finished, tok, at=None if at < 0 else at)
        t = time.perf_counter()
        wall, self._mark = t - self._mark, t
        eng.clock += wall
        forward = st.start.elapsed_time(st.end) / 1e3
        return eng._record(st.step, wall, forward, st.batch_view, emitted, st.preempted, finished)
