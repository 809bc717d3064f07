"""Which sequences run this iteration, and with how many tokens.

One rule in the style of vLLM v1: every running sequence wants to bring its computed tokens up to
its known tokens; a per-step token budget and a cap on running sequences decide how much of that
happens now. Prefill chunks, decodes and recomputation after preemption all fall out of it.

Policies:
- continuous + chunked prefill (default): running sequences first (decodes cost 1 token, unfinished
  prompts take a chunk of what is left of the budget), then waiting requests FCFS.
- continuous, chunked prefill off ("prefill-first"): a step that can admit waiting prompts runs only
  whole prompts and the decodes stall; otherwise it runs every decode.
- static: a batch is admitted only when the previous one has drained completely.
Preemption is by recompute: when blocks run out, the latest-arrived running sequence loses its
blocks and goes back to the front of the queue; its tokens are recomputed when it returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.block_manager import BlockCopy, BlockManager
from engine.config import EngineConfig
from engine.sequence import Sequence, SeqStatus


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        # Optional prefix cache (radix tree); it decides how much of a new prompt is already cached.
        self.prefix_cache = None
        # Optional speculative-decoding hook: extra slots to reserve for a decoding sequence's drafts.
        self.lookahead = None
        # Optional multi-LoRA hook (engine/lora/manager.py): admission pins the sequence's adapter in a
        # device slot, or the sequence waits while every slot is pinned by other adapters.
        self.adapters = None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.waiting.sort(key=lambda s: s.arrival_order)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self, step: int) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        cfg = self.config
        if self.prefix_cache is not None:
            self.prefix_cache.begin_step(step)  # the cache labels accesses and evictions with the step
        if cfg.policy == "static":
            if not self.running:
                budget = self._admit(step, budget, out, whole_prompts_only=not cfg.chunked_prefill)
            self._schedule_running(budget, out, skip={id(s) for s, _ in out.scheduled})
            return out
        if not cfg.chunked_prefill:
            self._admit(step, budget, out, whole_prompts_only=True)
            if out.scheduled:
                return out  # prefill-first: the decodes of running sequences stall this step
            self._schedule_running(budget, out)
            return out
        budget = self._schedule_running(budget, out)
        if not out.preempted:
            self._admit(step, budget, out, whole_prompts_only=False)
        return out

    def _schedule_running(self, budget: int, out: SchedulerOutput, skip: set[int] = frozenset()) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if id(seq) in skip:
                i += 1
                continue
            n = min(seq.remaining + (self.lookahead(seq) if self.lookahead is not None else 0), budget)
            if n <= 0:
                i += 1
                continue
            copies = self.bm.try_append(seq.seq_id, n)
            while copies is None:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
                copies = self.bm.try_append(seq.seq_id, n)
            if seq.status != SeqStatus.RUNNING:
                continue  # seq itself was preempted; self.running shrank under index i
            if copies:
                out.copies += copies
            out.scheduled.append((seq, n))
            budget -= n
            i += 1
        return budget

    def _admit(self, step: int, budget: int, out: SchedulerOutput, whole_prompts_only: bool) -> int:
        for seq in list(self.waiting):
            if seq.arrival_step > step or seq.fork_parent is not None:
                continue
            if len(self.running) >= self.config.max_num_seqs or budget <= 0:
                break
            if self.adapters is not None and not self.adapters.can_admit(seq):
                continue  # its adapter has no slot now; later requests with resident adapters may go
            cached_blocks, cached_tokens = self._match_prefix(seq)
            todo = seq.num_tokens - cached_tokens
            n = min(todo, budget)
            if whole_prompts_only and n < todo:
                break
            # Share the cached blocks first, then ask for room: before create() the matched blocks may
            # count as evictable in available_blocks(), after it they no longer are.
            self.bm.create(seq.seq_id, cached_blocks, cached_tokens)
            if not self.bm.can_append(seq.seq_id, n):
                self.bm.free(seq.seq_id)  # undo the increfs; nothing else changed
                break  # FCFS: later arrivals do not jump the queue
            if self.prefix_cache is not None:
                self.prefix_cache.on_admit(seq, cached_tokens)  # lock before append_slots may evict
            if self.adapters is not None:
                self.adapters.on_admit(seq, step)
            out.copies += self.bm.append_slots(seq.seq_id, n)
            seq.num_computed_tokens = cached_tokens
            seq.num_cached_tokens = cached_tokens
            seq.status = SeqStatus.RUNNING
            self.waiting.remove(seq)
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return budget

    def _match_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        if self.prefix_cache is None:
            return [], 0
        return self.prefix_cache.match_for_admission(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        if self.prefix_cache is not None:
            self.prefix_cache.on_release(seq)
        if self.adapters is not None:
            self.adapters.on_release(seq)
        self.bm.free(seq.seq_id)
        seq.status = SeqStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.num_preemptions += 1
        out.preempted.append(seq)
        out.scheduled = [(s, n) for s, n in out.scheduled if s is not seq]
        self.add(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            if self.adapters is not None:
                self.adapters.on_release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
