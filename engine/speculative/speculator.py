"""`Speculator`: the engine-side driver of speculative decoding (drafting, verification, rollback).

One round for a decoding sequence, all inside one `LLMEngine.step()`:

1. before scheduling, `lookahead(seq)` tells the scheduler how many extra slots to reserve
   (gamma, capped by what the request may still emit and by what the drafter can propose);
2. after scheduling, `draft(sched)` asks the drafter for up to n - 1 tokens for every sequence
   the scheduler gave n > 1 slots, trims reserved slots a proposal cannot use (block manager
   `truncate`, and the scheduled count), and returns the rounds;
3. the engine runs ONE target pass in which such a sequence contributes 1 + g query rows (its last
   sampled token, then the g drafts), causal by absolute position over its cached context, and
   asks for logits at every one of those rows;
4. `verify(...)` applies the acceptance rule, rolls the KV back to the last accepted token
   (`BlockManager.truncate` and `num_computed_tokens`), and emits the accepted drafts plus the
   bonus/resampled token one by one through the engine's usual stop checks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from engine.sampler import filtered_probs
from engine.sequence import Sequence
from engine.speculative.acceptance import verify_greedy, verify_sampled
from engine.speculative.drafters import DraftProposal, make_drafter
from engine.speculative.tree import TreeVerdict, verify_tree_greedy, verify_tree_sampled

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.scheduler import SchedulerOutput

# Counter keys this feature adds to `engine.counters` (all ints).
COUNTER_KEYS = ("spec_rounds", "spec_drafted_tokens", "spec_accepted_tokens", "spec_rejected_rounds",
                "spec_emitted_tokens")
MAX_GAMMA = 16


@dataclass(slots=True)
class SpecRound:
    """One sequence's round in flight (engine-internal; the trace gets `Speculator.round_dict`)."""

    seq: Sequence
    gamma: int  # what the request asks for this round (its gamma after the max_tokens cap)
    proposal: DraftProposal
    draft_seconds: float
    logits_start: int = 0  # first of this round's rows in the verification logits (set by the engine)

    @property
    def tokens(self) -> list[int]:
        return self.proposal.tokens


@dataclass(slots=True)
class _StepLog:
    draft_seconds: float = 0.0
    accept_seconds: float = 0.0
    verify_pass_seconds: float = 0.0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


class Speculator:
    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine
        self.default_gamma = engine.config.spec_gamma
        self.drafter = make_drafter(engine)
        for k in COUNTER_KEYS:
            engine.counters.setdefault(k, 0)
        # Cumulative float timings (engine.counters holds ints only).
        self.totals: dict[str, float] = {"draft_seconds": 0.0, "verify_seconds": 0.0, "draft_passes": 0}
        self._log = _StepLog()
        self._wanted: dict[int, tuple[int, str]] = {}  # seq_id -> (gamma, why no drafts) from lookahead

    # ---- 1. before scheduling -----------------------------------------------------------------
    def gamma_for(self, seq: Sequence) -> int:
        """Drafts this sequence may take now: its gamma, capped so a round never emits past max_tokens."""
        g = self.default_gamma if seq.spec_gamma is None else seq.spec_gamma
        return max(0, min(g, seq.params.max_tokens - seq.output_len - 1))

    def lookahead(self, seq: Sequence) -> int:
        """Scheduler hook: extra slots to reserve beyond `seq.remaining` (0 = a plain step)."""
        if seq.remaining != 1 or seq.in_prefill:
            return 0
        want = self.gamma_for(seq)
        if want <= 0:
            return 0
        g = self.drafter.max_proposal(seq, want)
        why = "no_match" if g == 0 else ""
        # Drafts are optional work: never preempt another sequence to make room for them.
        while g > 0 and not self.engine.block_manager.can_append(seq.seq_id, 1 + g):
            g -= 1
        self._wanted[seq.seq_id] = (want, why or ("no_free_blocks" if g == 0 else ""))
        return g

    # ---- 2. after scheduling ------------------------------------------------------------------
    def draft(self, sched: "SchedulerOutput") -> dict[int, SpecRound]:
        """Propose drafts for every sequence scheduled with lookahead; trims unused slots."""
        self._log = _StepLog()
        wanted, self._wanted = self._wanted, {}
        for seq, n in sched.scheduled:  # asked for drafts, decoded plainly: say why
            if n == 1 and seq.seq_id in wanted:
                want, why = wanted[seq.seq_id]
                self._log.skipped.append({"request_id": seq.label, "seq_id": seq.seq_id, "gamma": want,
                                          "reason": why or "token_budget"})
        picks = [(i, seq, n - 1) for i, (seq, n) in enumerate(sched.scheduled)
                 if n > 1 and seq.remaining == 1 and not seq.in_prefill]
        if not picks:
            return {}
        t0 = time.perf_counter()
        proposals = self.drafter.propose_batch([(seq, g) for _, seq, g in picks])
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        seconds = time.perf_counter() - t0
        self._log.draft_seconds = seconds
        self.totals["draft_seconds"] += seconds
        if not self.drafter.deterministic:
            self.totals["draft_passes"] += max((len(p.tokens) for p in proposals), default=0)
        rounds: dict[int, SpecRound] = {}
        bm = self.engine.block_manager
        for (i, seq, g), prop in zip(picks, proposals):
            prop.tokens = prop.tokens[:g]
            k = len(prop.tokens)
            if prop.tree is not None and len(prop.tree) > k:
                prop.tree = prop.tree.truncated(k)
                prop.q_of_tokens = prop.q_of_tokens[:k]
            if k < g:  # give back the slots this round cannot use
                bm.truncate(seq.seq_id, seq.num_computed_tokens + 1 + k)
                sched.scheduled[i] = (seq, 1 + k)
            # Per-sequence drafters are timed per call; a batched drafter's rounds all waited for the batch.
            share = seconds / len(picks) if self.drafter.deterministic else seconds
            rounds[seq.seq_id] = SpecRound(seq, self.gamma_for(seq), prop, share)
        return rounds

    # ---- 3b. a draft model mirrors the target's pass --------------------------------------------
    def mirror(self, batch) -> None:  # noqa: ANN001 (ForwardBatch)
        if not self.drafter.mirrors_target:
            return
        t0 = time.perf_counter()
        self.drafter.on_forward(batch)
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        seconds = time.perf_counter() - t0
        self._log.draft_seconds += seconds
        self.totals["draft_seconds"] += seconds

    # ---- 4. after the target pass -------------------------------------------------------------
    def verify(self, seq: Sequence, rnd: SpecRound, logits: torch.Tensor, forward_seconds: float,
               emit: Callable[[int], None], hidden: torch.Tensor | None = None) -> None:
        """logits: [1 + g, V], the target's rows for this round. Call after the engine has added the
        round's 1 + g tokens to `seq.num_computed_tokens`. hidden: the same rows' features (tree
        drafters)."""
        if rnd.proposal.tree is not None:
            self._verify_tree(seq, rnd, logits, forward_seconds, emit, hidden)
            return
        t0 = time.perf_counter()
        drafts = rnd.tokens
        g = len(drafts)
        start = seq.num_computed_tokens - g - 1  # position of the last sampled (now computed) token
        if seq.params.greedy:
            verdict = verify_greedy(logits, drafts, rnd.proposal.q_of_tokens)
        else:
            p = filtered_probs(logits, seq.params).cpu()
            q = rnd.proposal.q_probs
            verdict = verify_sampled(p, drafts, q, seq.generator)
        keep = start + 1 + verdict.num_accepted
        self.engine.block_manager.truncate(seq.seq_id, keep)  # roll back the rejected drafts' KV
        accept_seconds = time.perf_counter() - t0
        emitted = self._emit_and_count(seq, verdict.tokens, keep, g, verdict.num_accepted,
                                       verdict.final_kind == "resampled", forward_seconds, accept_seconds, emit)
        self._log.rounds.append(self.round_dict(seq, rnd, verdict, start, emitted,
                                                forward_seconds + accept_seconds))

    def _emit_and_count(self, seq: Sequence, tokens: list[int], keep: int, drafted: int, accepted: int,
                        rejected: bool, forward_seconds: float, accept_seconds: float,
                        emit: Callable[[int], None]) -> list[int]:
        """Emit the round's tokens one by one through the engine's stop checks (a stop inside the round
        ends it there), leave `keep` tokens computed, and add the round to the counters and timings."""
        emitted: list[int] = []
        for tok in tokens:
            seq.num_computed_tokens = len(seq.token_ids)  # every token before this one has valid KV
            emit(tok)
            emitted.append(tok)
            if seq.finished:
                break
        if not seq.finished:
            seq.num_computed_tokens = keep
        c = self.engine.counters
        c["spec_rounds"] += 1
        c["spec_drafted_tokens"] += drafted
        c["spec_accepted_tokens"] += accepted
        c["spec_rejected_rounds"] += rejected
        c["spec_emitted_tokens"] += len(emitted)
        if not self._log.rounds:  # the first round verified by this step's pass counts the pass once
            self._log.verify_pass_seconds = forward_seconds
            self.totals["verify_seconds"] += forward_seconds
        self._log.accept_seconds += accept_seconds
        self.totals["verify_seconds"] += accept_seconds
        return emitted

    def _verify_tree(self, seq: Sequence, rnd: SpecRound, logits: torch.Tensor, forward_seconds: float,
                     emit: Callable[[int], None], hidden: torch.Tensor | None) -> None:
        t0 = time.perf_counter()
        tree = rnd.proposal.tree
        n = len(tree)
        start = seq.num_computed_tokens - n - 1  # the root's position
        if seq.params.greedy:
            verdict = verify_tree_greedy(logits, tree)
        else:
            verdict = verify_tree_sampled(filtered_probs(logits, seq.params).cpu(), tree, seq.generator)
        bm = self.engine.block_manager
        # Compact: the accepted path's KV moves to the slots right after the root, where a plain
        # decode would have put it (its keys were rotated at start + depth, i.e. those positions).
        moves = [(start + 1 + node, start + 1 + d) for d, node in enumerate(verdict.path) if node != d]
        self.engine.pool.copy_slots([bm.slot(seq.seq_id, a) for a, _ in moves],
                                    [bm.slot(seq.seq_id, b) for _, b in moves])
        keep = start + 1 + verdict.num_accepted
        bm.truncate(seq.seq_id, keep)  # roll back every other branch
        if hidden is not None:  # the root's and the accepted nodes' features are the target's truth
            rows = [0] + [1 + node for node in verdict.path]
            self.drafter.observe(seq, list(range(start, keep)), hidden[rows])
        accept_seconds = time.perf_counter() - t0
        emitted = self._emit_and_count(seq, verdict.tokens, keep, n, verdict.num_accepted,
                                       verdict.final_kind == "resampled", forward_seconds, accept_seconds, emit)
        self._log.rounds.append(self.tree_round_dict(seq, rnd, verdict, start, emitted, moves,
                                                     forward_seconds + accept_seconds))

    def tree_round_dict(self, seq: Sequence, rnd: SpecRound, v: TreeVerdict, start: int, emitted: list[int],
                        moves: list[tuple[int, int]], verify_seconds: float) -> dict[str, Any]:
        tok = self.engine.tokenizer.decode_token
        tree = rnd.proposal.tree
        on_path = set(v.path)
        tried = {node for node, *_ in v.trials} if v.trials else set()
        if not v.trials:  # greedy: a node was checked iff its parent was reached
            reached = {-1, *v.path}
            tried = {i for i, p in enumerate(tree.parents) if p in reached}
        return self._round_fields(seq, rnd, v, start, emitted, verify_seconds) | {
            "kind": "tree",
            "root_token_id": seq.token_ids[start],
            "root_text": tok(seq.token_ids[start]),
            "tree": {
                "token_ids": list(tree.tokens),
                "texts": [tok(t) for t in tree.tokens],
                "parents": list(tree.parents),
                "depths": tree.depths,
                "q": [float(x) for x in tree.probs],
                "path_prob": [float(x) for x in tree.scores],
                "status": ["accepted" if i in on_path else ("rejected" if i in tried else "unreached")
                           for i in range(len(tree))],
            },
            "accepted_path": list(v.path),
            "trials": [{"node": node, "u": u, "p": p, "accepted": ok} for node, u, p, ok in v.trials],
            "kv_moves": [list(m) for m in moves],
        }

    # ---- trace --------------------------------------------------------------------------------
    def round_dict(self, seq: Sequence, rnd: SpecRound, v, start: int, emitted: list[int],
                   verify_seconds: float) -> dict[str, Any]:
        tok = self.engine.tokenizer.decode_token
        return self._round_fields(seq, rnd, v, start, emitted, verify_seconds) | {
            "draft_token_ids": list(rnd.tokens),
            "draft_texts": [tok(t) for t in rnd.tokens],
            "p": [float(x) for x in v.p],
            "q": [float(x) for x in v.q],
            "uniforms": list(v.uniforms),
            "verdicts": list(v.verdicts),
            "residual_mass": v.residual_mass,
        }

    def _round_fields(self, seq: Sequence, rnd: SpecRound, v, start: int, emitted: list[int],  # noqa: ANN001
                      verify_seconds: float) -> dict[str, Any]:
        """The keys chain and tree rounds share (Verdict and TreeVerdict both carry them)."""
        tok = self.engine.tokenizer.decode_token
        return {
            "request_id": seq.label,
            "seq_id": seq.seq_id,
            "mode": "greedy" if seq.params.greedy else "sampled",
            "gamma": rnd.gamma,
            "num_drafted": len(rnd.tokens),
            "position": start + 1,
            "num_accepted": v.num_accepted,
            "final_token_id": v.tokens[-1],
            "final_text": tok(v.tokens[-1]),
            "final_kind": v.final_kind,
            "final_p": float(v.final_p),
            "target_argmax_ids": list(v.target_argmax),
            "target_argmax_texts": [tok(t) for t in v.target_argmax],
            "emitted_token_ids": emitted,
            "emitted_texts": [tok(t) for t in emitted],
            "draft_seconds": rnd.draft_seconds,
            "verify_seconds": verify_seconds,
            "drafter_detail": dict(rnd.proposal.detail),
        }

    def snapshot(self) -> dict[str, Any]:
        """The "spec" StepRecord extra for the step that just ran (format: engine/speculative/__init__)."""
        c = self.engine.counters
        log = self._log
        return {
            "drafter": self.drafter.name,
            "default_gamma": self.default_gamma,
            "draft_seconds": log.draft_seconds,
            "verify_seconds": (log.verify_pass_seconds + log.accept_seconds) if log.rounds else 0.0,
            "rounds": list(log.rounds),
            "skipped": list(log.skipped),
            "totals": {k.removeprefix("spec_"): c[k] for k in COUNTER_KEYS}
            | {"draft_seconds": self.totals["draft_seconds"], "verify_seconds": self.totals["verify_seconds"]},
        }
