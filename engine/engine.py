"""`LLMEngine`: add requests, call `step()`, get a `StepRecord` per real iteration.

The engine knows nothing about any UI. A script can call `generate()`; a page calls `step()` and
keeps the records.
"""
from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import Callable

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.forward_batch import build_forward_batch
from engine.host_memory import keep_freed_memory
from engine.kv_pool import KVPool
from engine.model import LlamaModel
from engine.sampler import sample_next
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import PENDING, ForcedTokens, Sequence, SeqStatus
from engine.pool_view import light_pool_summary, memory_split, pool_summary
from engine.tokenizer import Tokenizer
from engine.trace import (BlockTableView, EmittedToken, MemorySplit, PoolSummary, RequestState,
                          ScheduledSeq, StepRecord)
from engine.weights import LoadedWeights, load_weights
from kernels.device_gate import gpu_work
from kernels.dispatch import Kernels

Prompt = str | list[int] | list[dict]


@dataclass(frozen=True, slots=True)
class SampleOutput:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    logprobs: tuple[float | None, ...] = ()  # with SamplingParams(logprobs=True): per output token (None: forced)


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    samples: tuple[SampleOutput, ...]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.samples[0].token_ids

    @property
    def text(self) -> str:
        return self.samples[0].text


def tokenize_prompt(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """A request's prompt as token ids: text encoded, chat messages through the chat template, ids as given."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise ValueError("prompt must be a string, a list of token ids or a list of chat messages")


class LLMEngine:
    def __init__(self, config: EngineConfig = EngineConfig(), weights: LoadedWeights | None = None) -> None:
        # On a GPU, building the engine (weights and pool onto the device) and every step are GPU work that a
        # CUDA graph capture in another thread must not overlap (kernels/device_gate.py).
        with gpu_work(config.device):
            self._build(config, weights)

    def _build(self, config: EngineConfig, weights: LoadedWeights | None) -> None:
        keep_freed_memory()  # the CPU path's per-layer temporaries otherwise page-fault in some processes
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = getattr(torch, config.dtype)
        self.weights = weights or load_weights(config.weights, device="cpu")
        self.model_config = self.weights.config
        self.tokenizer = self.weights.tokenizer
        self.kernels = Kernels(config.kernel_backend, self.device, config.profile_kernels,
                               pdl=config.programmatic_launch)
        self.model = LlamaModel(self.model_config, self.weights.state_dict, self.kernels, self.device,
                                self.dtype, config.max_model_len)
        self.pool = KVPool(self.model_config, config.num_blocks, config.block_size, self.dtype, self.device,
                           head_major=config.kv_head_major)
        self.block_manager = BlockManager(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.block_manager)
        if config.enable_prefix_cache:
            from engine.radix_cache import RadixCache  # only engines that cache pay for it

            self.scheduler.prefix_cache = RadixCache(self.block_manager, decode=self.tokenizer.decode)
        self.lora = None
        if config.max_loras:
            from engine.lora.manager import LoraManager  # only multi-LoRA engines pay for the slots

            self.lora = LoraManager(self.model_config, config.max_loras, config.max_lora_rank, self.device,
                                    self.dtype)
            self.scheduler.adapters = self.lora
            self.model.lora = self.lora.slots
        self.graph_runner = None
        if config.cuda_graphs:
            if self.device.type != "cuda" or self.kernels.backend != "triton":
                raise ValueError("cuda_graphs needs device='cuda' and the Triton kernels "
                                 "(the torch reference path syncs with the host)")
            from engine.cuda_graphs import DecodeGraphRunner

            self.graph_runner = DecodeGraphRunner(self.model, self.pool, config.max_model_len, config.block_size)
            if config.prefill_graphs:
                from engine.piecewise_graphs import PiecewiseGraphRunner

                self.model.piecewise = PiecewiseGraphRunner(self.model, self.pool, config.max_num_batched_tokens,
                                                            replay_launches=config.replay_attention_launches)
        # Counted from what the forward passes really computed (not from the scheduler's intent).
        self.counters = {"forward_passes": 0, "prefill_tokens_computed": 0, "decode_tokens_computed": 0,
                         "prompt_tokens_cached": 0}
        self.speculator = None
        if config.spec_drafter != "none":
            from engine.speculative import Speculator  # drafters + verifier; adds spec_* counters

            self.speculator = Speculator(self)
            self.scheduler.lookahead = self.speculator.lookahead
        self.step_index = 0
        self.clock = 0.0  # engine time: the sum of step wall times, so idle UI time never counts
        self.sequences: list[Sequence] = []
        self._ids = itertools.count()
        self._orders = itertools.count()
        self._arrival_clock: dict[str, float] = {}
        # Bookkeeping kept incrementally: a step must not walk every sequence ever added (a server
        # run keeps thousands of finished ones).
        self._awaiting_arrival: list[Sequence] = []  # first sequence of requests not yet arrived
        self._unfinished: set[int] = set()  # seq ids
        self._request_ids: set[str] = set()
        self._memory: tuple[int, MemorySplit] | None = None  # (step measured, split): light records
        self._ready_records: collections.deque[StepRecord] = collections.deque()
        # Called with (sequence, finish reason) while the finished sequence still owns its blocks: a
        # prefill worker reads the prompt's KV here to hand it to a decode worker (engine/disaggregated).
        self.on_finish: Callable[[Sequence, str], None] | None = None
        # Called with (sequence, just-sampled token) before the stop checks; may return ForcedTokens to
        # write text into the sequence (budget forcing, engine/test_time/budget.py). None: keep the token.
        # Not called for the tokens overlapped decode fills into placeholders (they are sampled a step late,
        # after the next step was launched on them); TestTimeEngine therefore refuses overlapped decode.
        self.force_tokens: Callable[[Sequence, int], ForcedTokens | None] | None = None
        # Called with (sequence, its logits row) before a token is sampled from them; returns the logits to
        # sample from (constrained decoding masks the tokens a grammar forbids, engine/constrained), as a new
        # tensor: the row is shared by a request's samples. Rows then skip the batched greedy argmax, and
        # SamplingParams(logprobs=True) reports log-probabilities of the returned logits. Like force_tokens, not called for overlapped decode's
        # placeholder tokens nor for tokens a speculative verification accepts; ConstrainedEngine refuses both.
        self.process_logits: Callable[[Sequence, torch.Tensor], torch.Tensor] | None = None
        self.overlap = None
        if config.overlap_decode:
            from engine.overlap import DecodePipeline

            self.overlap = DecodePipeline(self)

    # ---- requests ---------------------------------------------------------------------------------
    @property
    def backend_description(self) -> str:
        return self.kernels.description

    def tokenize(self, prompt: Prompt) -> list[int]:
        return tokenize_prompt(self.tokenizer, prompt)

    def check_request(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """The prompt's token ids if this engine can serve the request; else ValueError naming the field."""
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError("prompt must not be empty")
        ids = self.tokenize(prompt)
        cfg = self.config
        if not ids:
            raise ValueError("prompt must not be empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        if len(ids) + params.max_tokens > cfg.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                             f"context length max_model_len={cfg.max_model_len}")
        if self.block_manager.blocks_for(len(ids) + params.max_tokens) > cfg.num_blocks:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) needs more KV "
                             f"blocks than the whole pool has ({cfg.num_blocks} x {cfg.block_size} tokens)")
        if not cfg.chunked_prefill and len(ids) + params.max_tokens > cfg.max_num_batched_tokens:
            # prompt + max_tokens, not the prompt alone: a preempted request is prefilled again with its output
            # so far, and without chunking that must fit one step too.
            raise ValueError(f"prompt ({len(ids)} tokens) cannot be prefilled in one step: chunked prefill is "
                             f"off and max_num_batched_tokens={cfg.max_num_batched_tokens}, which must hold the "
                             f"prompt and max_tokens ({params.max_tokens}) together, since a preempted request "
                             "is prefilled again with its output so far")
        return ids

    def add_request(self, prompt: Prompt, params: SamplingParams = SamplingParams(),
                    arrival_step: int | None = None, request_id: str | None = None,
                    spec_gamma: int | None = None, adapter: str | None = None) -> str:
        """Queue a request; raises ValueError naming the offending field and leaves the engine as it was.
        `spec_gamma`: drafted tokens per speculative round for this request (None: the engine's
        `spec_gamma`; 0: no speculation); needs `EngineConfig.spec_drafter`. `adapter`: the name of a
        registered LoRA adapter to run this request with (None: the base model)."""
        ids = self.check_request(prompt, params)
        if adapter is not None:
            if self.lora is None:
                raise ValueError("adapter needs an engine that serves adapters: set EngineConfig.max_loras > 0")
            self.lora.check(adapter)
        arrival = self.step_index if arrival_step is None else int(arrival_step)
        if arrival < 0:
            raise ValueError(f"arrival_step must be >= 0, got {arrival_step}")
        rid = request_id or f"r{next(self._ids)}"
        if rid in self._request_ids:
            raise ValueError(f"request_id {rid!r} is already in use")
        if spec_gamma is not None and (not isinstance(spec_gamma, int) or isinstance(spec_gamma, bool)
                                       or not 0 <= spec_gamma <= 16):
            raise ValueError(f"spec_gamma must be an integer in [0, 16] or None, got {spec_gamma!r}")
        if spec_gamma and self.speculator is None:
            raise ValueError("spec_gamma > 0 needs a drafter: set EngineConfig.spec_drafter")
        if params.logprobs and (self.speculator is not None or self.overlap is not None):
            # Verification and overlapped decode emit tokens without their logits row at hand.
            raise ValueError("logprobs needs an engine without a drafter or overlapped decode")
        order = next(self._orders)
        parent = None
        for i in range(params.n):
            seq = Sequence(rid, list(ids), len(ids), params, arrival, order, index=i, fork_parent=parent,
                           spec_gamma=spec_gamma, adapter=adapter)
            seq.make_generator()
            parent = parent or seq
            self.sequences.append(seq)
            self._unfinished.add(seq.seq_id)
            if i == 0:
                self.scheduler.add(seq)
                self._awaiting_arrival.append(seq)
        self._request_ids.add(rid)
        return rid

    def register_adapter(self, adapter) -> None:
        """Make a LoRA adapter (engine.lora.LoraAdapter) servable by name; it is copied to a device slot
        when a request that names it is admitted. ValueError when it does not fit this engine."""
        if self.lora is None:
            raise ValueError("this engine serves no adapters: set EngineConfig.max_loras > 0")
        self.lora.register(adapter)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.lora.adapters)) if self.lora is not None else ()

    def can_adopt(self, prompt_len: int) -> bool:
        """Whether `adopt_prefilled` would take a prefilled prompt of this length now."""
        bm = self.block_manager
        return (len(self.scheduler.running) < self.config.max_num_seqs
                and bm.blocks_for(prompt_len + 1) <= bm.available_blocks())

    def adopt_prefilled(self, request_id: str, token_ids: list[int], prompt_len: int, params: SamplingParams,
                        fill: Callable[[list[int]], None], generator_state: torch.Tensor | None = None
                        ) -> list[int] | None:
        """Take over a request whose prompt another engine prefilled (disaggregated serving): blocks for
        the prompt are allocated in this pool and `fill(blocks)` writes its KV into them (a transport's
        `receive_into`); the request then joins the running batch as a decode. `token_ids` is the prompt
        plus the token(s) the other engine sampled. Returns this pool's block ids, or None with nothing
        changed when there is no room now (max_num_seqs running, or too few free blocks for the prompt
        and one more token)."""
        if request_id in self._request_ids:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if self.scheduler.prefix_cache is not None or self.speculator is not None:
            raise ValueError("adopt_prefilled needs an engine without a prefix cache or a drafter (a decode worker)")
        if not self.can_adopt(prompt_len):
            return None
        bm = self.block_manager
        seq = Sequence(request_id, list(token_ids), prompt_len, params, self.step_index, next(self._orders))
        seq.make_generator()
        if generator_state is not None and seq.generator is not None:
            seq.generator.set_state(generator_state)  # sampling goes on exactly where the other engine left it
        bm.create(seq.seq_id)
        bm.append_slots(seq.seq_id, prompt_len)
        blocks = list(bm.tables[seq.seq_id])
        try:
            fill(blocks)
        except BaseException:
            bm.free(seq.seq_id)  # nothing adopted: the blocks go back
            raise
        seq.num_computed_tokens = prompt_len
        seq.status = SeqStatus.RUNNING
        seq.first_token_step, seq.first_token_time = self.step_index, self.clock
        seq.token_times.append(self.clock)
        self._arrival_clock[request_id] = self.clock
        self.sequences.append(seq)
        self._unfinished.add(seq.seq_id)
        self._request_ids.add(request_id)
        self.scheduler.running.append(seq)
        return blocks

    def abort(self, request_id: str) -> None:
        for seq in self.sequences:
            if seq.request_id == request_id and not seq.finished:
                self._finish(seq, "aborted")

    def wait_until(self, clock: float) -> None:
        """Idle until engine time `clock` (no earlier than now): a load generator with nothing to run
        skips ahead to its next arrival, so TTFT and TPOT read on one clock with the steps."""
        self.clock = max(self.clock, float(clock))

    def has_work(self) -> bool:
        return bool(self._unfinished or self._ready_records or (self.overlap is not None and self.overlap.inflight))

    # ---- one iteration ----------------------------------------------------------------------------
    def step(self) -> StepRecord:
        """Run one iteration and return its record. With `overlap_decode`, records arrive one call
        late (a step's tokens are read while the GPU computes the next one); see engine/overlap.py."""
        with gpu_work(self.device):
            return self._step()

    def _step(self) -> StepRecord:
        if self._ready_records:
            return self._ready_records.popleft()
        if self.overlap is not None:
            record = self.overlap.step()
            if record is not None:
                return record
            if self._ready_records:
                return self._ready_records.popleft()
        t0, step, sched = self._schedule_step()
        return self._run_step(t0, step, sched)

    def _schedule_step(self) -> tuple[float, int, SchedulerOutput]:
        """The host half of an iteration: note arrivals, pick the batch, copy-on-write copies."""
        t0 = time.perf_counter()
        step = self.step_index
        if self._awaiting_arrival:
            # <=: a request added with an arrival step already past arrives now.
            for seq in self._awaiting_arrival:
                if seq.arrival_step <= step:
                    self._arrival_clock[seq.request_id] = self.clock
            self._awaiting_arrival = [s for s in self._awaiting_arrival if s.arrival_step > step]
        if self.lora is not None:
            self.lora.begin_step()
        sched = self.scheduler.schedule(step)
        self.pool.copy_blocks(sched.copies)
        return t0, step, sched

    def _run_step(self, t0: float, step: int, sched: SchedulerOutput) -> StepRecord:
        """Forward pass, sampling and the record of a scheduled iteration (synchronous)."""
        if self.speculator is not None:
            self.speculator.drafter.on_block_copies(sched.copies)
        # Speculative decoding: drafts for sequences scheduled with lookahead slots (trims unused ones).
        drafts = self.speculator.draft(sched) if self.speculator is not None else {}
        emitted: list[EmittedToken] = []
        finished: list[str] = []
        batch_view: list[ScheduledSeq] = []
        forward_seconds = 0.0
        if sched.scheduled:
            # Fresh prefills (starting at position 0) first: they attend only to their own tokens.
            order = sorted(sched.scheduled, key=lambda sn: sn[0].num_computed_tokens != 0)
            fresh, paged, rows, samplers = [], [], [], []  # samplers: (sequence, its row in the logits)
            trees = {}  # paged index -> (depths, mask) of a draft tree under verification
            first_row: dict[int, int] = {}  # seq_id -> its first row in the batch (hidden states)
            row = 0
            for seq, n in order:
                start = seq.num_computed_tokens
                toks = seq.token_ids[start:start + n]
                if seq.seq_id in drafts:  # the last sampled token, then the drafts to verify
                    toks = toks + drafts[seq.seq_id].tokens
                slots = self.block_manager.slots(seq.seq_id, start, n)
                if start == 0:
                    fresh.append((toks, start, slots))
                else:
                    tree = drafts[seq.seq_id].proposal.tree if seq.seq_id in drafts else None
                    if tree is not None:
                        trees[len(paged)] = ([0] + tree.depths, tree.mask())
                    paged.append((toks, start, slots, self.block_manager.tables[seq.seq_id]))
                first_row[seq.seq_id] = row
                row += n
                if seq.seq_id in drafts:  # verification needs the logits of every one of its rows
                    drafts[seq.seq_id].logits_start = len(rows)
                    rows += range(row - n, row)
                elif start + n == seq.num_tokens:
                    samplers.append((seq, len(rows)))
                    rows.append(row - 1)
            lora_rows = self.lora.row_slots(order) if self.lora is not None else None
            batch = build_forward_batch(fresh, paged, rows, self.device, trees, lora_rows)
            tf = time.perf_counter()
            hidden = None
            if self.speculator is not None and self.speculator.drafter.wants_hidden:
                logits, hidden = self.model.forward_with_hidden(batch, self.pool)
            else:
                logits = self._forward(batch)  # [len(rows), vocab]; may be empty
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            forward_seconds = time.perf_counter() - tf
            if self.speculator is not None:
                self.speculator.mirror(batch)  # a draft model keeps its own KV in step with the target
            self.counters["forward_passes"] += 1
            prefill_tokens = decode_tokens = cached_tokens = 0
            for seq, n in sched.scheduled:
                phase = "prefill" if seq.in_prefill else "decode"
                if phase == "prefill":
                    prefill_tokens += n
                else:
                    decode_tokens += n
                if seq.num_computed_tokens == seq.num_cached_tokens:
                    # First pass since admission. Not only prefills: a returning preempted request can
                    # find all but its last token cached, and then this pass looks like a decode.
                    cached_tokens += seq.num_cached_tokens
                start = seq.num_computed_tokens
                seq.num_computed_tokens += n
                if phase == "prefill" and self.scheduler.prefix_cache is not None:
                    self.scheduler.prefix_cache.on_computed(seq)  # publish the prompt's computed blocks now
                r0 = first_row[seq.seq_id]
                if seq.seq_id in drafts:  # accept/reject the drafts, roll back rejected KV, emit tokens
                    first = drafts[seq.seq_id].logits_start
                    self.speculator.verify(seq, drafts[seq.seq_id], logits[first:first + n], forward_seconds,
                                           lambda tok, s=seq: self._sample_into(
                                               s, None, step, self.clock + time.perf_counter() - t0,
                                               emitted, finished, tok),
                                           hidden[r0:r0 + n] if hidden is not None else None)
                elif hidden is not None:  # hidden-state drafters read the target's features later
                    self.speculator.drafter.observe(seq, list(range(start, start + n)), hidden[r0:r0 + n])
                batch_view.append(ScheduledSeq(seq.label, seq.seq_id, phase, n, seq.num_computed_tokens,
                                               seq.num_cached_tokens if phase == "prefill" else 0))
            c = self.counters
            c["prefill_tokens_computed"] += prefill_tokens
            c["decode_tokens_computed"] += decode_tokens
            c["prompt_tokens_cached"] += cached_tokens
            now = self.clock + time.perf_counter() - t0
            # One argmax and one device-to-host copy for every greedy row, not one per row; a greedy
            # row never needs its own logits view (indexing a tensor costs microseconds a row).
            greedy = logits.argmax(-1).tolist() if logits.shape[0] else []
            for seq, i in samplers:
                if (seq.params.greedy and seq.params.n == 1 and not seq.params.logprobs
                        and self.process_logits is None):
                    self._sample_into(seq, None, step, now, emitted, finished, greedy[i])
                    continue
                # n > 1: the other samples fork off the first before it samples, since a first token that
                # ends it (max_tokens = 1, an end of turn, forced text that ends the turn) frees its blocks.
                # Their tokens, and their ends, are still listed after the first sample's.
                forked: list[EmittedToken] = []
                forked_finished: list[str] = []
                for child in self._pending_children(seq):
                    self._fork(seq, child, logits[i], step, now, forked, forked_finished)
                self._sample_into(seq, logits[i], step, now, emitted, finished,
                                  greedy[i] if seq.params.greedy else None)
                emitted.extend(forked)
                finished.extend(forked_finished)
        wall = time.perf_counter() - t0
        self.clock += wall
        record = self._record(step, wall, forward_seconds, batch_view, emitted, sched.preempted, finished)
        self.step_index += 1
        return record

    def _pending_children(self, parent: Sequence) -> list[Sequence]:
        if parent.params.n == 1 or parent.index != 0:
            return []
        return [s for s in self.sequences if s.fork_parent is parent]

    def _fork(self, parent: Sequence, child: Sequence, logits: torch.Tensor, step: int, now: float,
              emitted: list[EmittedToken], finished: list[str]) -> None:
        """n > 1: the child shares the parent's prompt blocks (ref counts) and samples its own token."""
        child.fork_parent = None
        child.token_ids = list(parent.token_ids[: parent.prompt_len])
        child.num_computed_tokens = parent.prompt_len
        self.block_manager.fork(parent.seq_id, child.seq_id)
        if self.block_manager.num_tokens[child.seq_id] > parent.prompt_len:
            self.block_manager.truncate(child.seq_id, parent.prompt_len)
        child.status = SeqStatus.RUNNING
        self.scheduler.running.append(child)
        if self.lora is not None:
            self.lora.on_admit(child, step)  # the parent's adapter is resident: this pins its slot once more
        self._sample_into(child, logits, step, now, emitted, finished)

    def _forward(self, batch) -> torch.Tensor:
        runner = self.graph_runner
        if (runner is not None and batch.num_fresh_tokens == 0 and batch.max_query_len == 1
                and runner.bucket_for(batch.num_tokens) is not None):
            return self._graph_replay(lambda: runner.run(batch))
        return self.model.forward(batch, self.pool)

    def _graph_replay(self, replay: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A decode step replayed as a CUDA graph (synchronous, or overlapped: engine/overlap.py), timed
        as one region when profiling."""
        t0 = time.perf_counter()
        logits = replay()
        self.kernels.timer.add_cuda_region("decode (CUDA graph replay)", "cuda-graph", t0)
        return logits

    def _sample_into(self, seq: Sequence, logits: torch.Tensor | None, step: int, now: float,
                     emitted: list[EmittedToken], finished: list[str], token: int | None = None,
                     at: int | None = None) -> None:
        """Append the sampled (or given) token, or with `at` put it in place of a pending
        placeholder (overlapped decode); then check the stop conditions."""
        if logits is not None and at is None and self.process_logits is not None:
            logits = self.process_logits(seq, logits)
            token = None  # a greedy argmax taken before processing is stale
        if token is None:
            token = sample_next(logits, seq.params, seq.generator)
        logprob = None
        if seq.params.logprobs and logits is not None:
            logprob = float(torch.log_softmax(logits.float(), dim=-1)[token])
        forcing = self.force_tokens(seq, token) if self.force_tokens is not None and at is None else None
        if forcing is None or not forcing.replace:
            if at is None:
                seq.token_ids.append(token)
            else:
                seq.token_ids[at] = token
            if seq.params.logprobs:
                seq.logprobs.append(logprob)
            emitted.append(EmittedToken(seq.label, seq.seq_id, token, self.tokenizer.decode_token(token), logprob))
        if forcing is not None:
            # Written after (or instead of) the sampled token and not computed yet: the next step's
            # scheduler brings this sequence's computed tokens up to them, a chunk of len(tokens) + 1.
            for t in forcing.tokens:
                seq.token_ids.append(t)
                if seq.params.logprobs:
                    seq.logprobs.append(None)
                emitted.append(EmittedToken(seq.label, seq.seq_id, t, self.tokenizer.decode_token(t),
                                            forced=forcing.label))
            token = seq.token_ids[-1]
        if seq.first_token_step < 0:
            seq.first_token_step = step
            seq.first_token_time = now
        seq.token_times.append(now)
        reason = self._stop_reason(seq, token, None if at is None else at + 1)
        if reason:
            self._finish(seq, reason, step)
            finished.append(seq.label)

    def _stop_reason(self, seq: Sequence, token: int, length: int | None = None) -> str:
        """`length`: the sequence's known tokens when placeholders follow (overlapped decode)."""
        p = seq.params
        if not p.ignore_eos and token in self.model_config.eos_token_ids:
            return "eos"
        end = seq.num_tokens if length is None else length
        if p.stop:
            text = self.tokenizer.decode(seq.token_ids[seq.prompt_len:end])
            if any(s in text for s in p.stop):
                return "stop"
        if end - seq.prompt_len >= p.max_tokens:
            return "length"
        return ""

    def _finish(self, seq: Sequence, reason: str, step: int | None = None) -> None:
        while seq.token_ids and seq.token_ids[-1] == PENDING:  # overlapped decode ran one step ahead
            seq.token_ids.pop()
        seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens)
        if self.on_finish is not None and seq.seq_id in self.block_manager.tables:
            self.on_finish(seq, reason)
        prefix_cache = self.scheduler.prefix_cache
        if prefix_cache is not None and seq.seq_id in self.block_manager.tables:
            prefix_cache.on_finish(seq)
        self.scheduler.finish(seq)
        self.block_manager.free(seq.seq_id)
        if self.speculator is not None:
            self.speculator.drafter.forget(seq.seq_id)
        seq.finish_reason = reason
        seq.finish_step = self.step_index if step is None else step
        seq.fork_parent = None
        self._unfinished.discard(seq.seq_id)

    # ---- records ----------------------------------------------------------------------------------
    def _record(self, step, wall, forward_seconds, batch_view, emitted, preempted, finished) -> StepRecord:
        bm = self.block_manager
        if self.config.trace_detail == "light":
            return StepRecord(
                step=step, wall_seconds=wall, forward_seconds=forward_seconds, batch=tuple(batch_view),
                emitted=tuple(emitted), block_tables=(), pool=self._light_pool_summary(),
                preempted=tuple(s.label for s in preempted), finished=tuple(finished),
                kernels=self.kernels.timer.drain(), memory=self._light_memory_split(step), requests=(),
                backend=self.kernels.description, extras=(("counters", dict(self.counters)),))
        tables = tuple(BlockTableView(s.label, s.seq_id, tuple(bm.tables[s.seq_id]), tuple(bm.block_fills(s.seq_id)))
                       for s in self.scheduler.running if s.seq_id in bm.tables)
        return StepRecord(
            step=step, wall_seconds=wall, forward_seconds=forward_seconds, batch=tuple(batch_view),
            emitted=tuple(emitted), block_tables=tables, pool=self.pool_summary(),
            preempted=tuple(s.label for s in preempted), finished=tuple(finished),
            kernels=self.kernels.timer.drain(), memory=self.memory_split(),
            requests=tuple(self._request_state(s, step) for s in self.sequences),
            backend=self.kernels.description,
            extras=self._extras(),
        )

    def _extras(self) -> tuple:
        extras = [("counters", dict(self.counters))]
        if self.scheduler.prefix_cache is not None:
            extras.append(("radix", self.scheduler.prefix_cache.snapshot()))
        if self.speculator is not None:
            extras.append(("spec", self.speculator.snapshot()))
        if self.lora is not None:
            extras.append(("lora", self.lora.snapshot(self.scheduler.running)))
        return tuple(extras)

    def _request_state(self, seq: Sequence, step: int) -> RequestState:
        if seq.finished:
            status = "finished"
        elif seq.status == SeqStatus.RUNNING:
            status = "prefill" if seq.in_prefill else "decode"
        else:
            status = "preempted" if seq.num_preemptions else "waiting"
        arrival = self._arrival_clock.get(seq.request_id)
        ttft = seq.first_token_time - arrival if seq.first_token_time >= 0 and arrival is not None else -1.0
        times = seq.token_times
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else -1.0
        return RequestState(seq.label, status, seq.prompt_len, seq.output_len, seq.num_computed_tokens,
                            seq.arrival_step, seq.first_token_step, seq.finish_step, seq.num_preemptions,
                            seq.finish_reason, ttft, tpot,
                            self._text(seq) if seq.output_len else "")

    def pool_summary(self) -> PoolSummary:
        return pool_summary(self.block_manager, self.config, self.sequences, self.scheduler.running,
                            self.scheduler.prefix_cache)

    def _light_pool_summary(self) -> PoolSummary:
        return light_pool_summary(self.block_manager)

    def memory_split(self) -> MemorySplit:
        return memory_split(self.model.weight_bytes, self.pool.nbytes, self.device)

    def _light_memory_split(self, step: int, every: int = 64) -> MemorySplit:
        """Re-measured every `every` steps: reading the CUDA allocator's statistics costs ~0.5 ms,
        a third of a batch-1 decode step, and peak memory moves only when the batch shape does."""
        if self._memory is None or step - self._memory[0] >= every:
            self._memory = (step, self.memory_split())
        return self._memory[1]

    # ---- scripts ----------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt] | Prompt, params: SamplingParams | list[SamplingParams] = SamplingParams(),
                 max_steps: int = 100_000) -> list[GenerationResult]:
        """Run until these requests finish; returns results in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], (int, dict))):
            prompts = [prompts]
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        for _ in range(max_steps):
            if not any(not s.finished for s in self.sequences if s.request_id in rids):
                break
            self.step()
        return [self.result(r) for r in rids]

    def result(self, request_id: str) -> GenerationResult:
        seqs = sorted((s for s in self.sequences if s.request_id == request_id), key=lambda s: s.index)
        if not seqs:
            raise KeyError(request_id)
        samples = tuple(SampleOutput(tuple(s.output_ids), self._text(s), s.finish_reason, tuple(s.logprobs))
                        for s in seqs)
        return GenerationResult(request_id, tuple(seqs[0].token_ids[: seqs[0].prompt_len]), samples)

    def _text(self, seq: Sequence) -> str:
        ids = [t for t in seq.output_ids if t != PENDING]
        if seq.finish_reason == "eos":
            ids = ids[:-1]  # the end-of-turn marker is a control token, not text
        text = self.tokenizer.decode(ids)
        for s in seq.params.stop:
            if s in text:
                text = text[: text.index(s)]
        return text
