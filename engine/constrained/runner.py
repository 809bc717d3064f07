"""`ConstrainedEngine`: an LLMEngine whose requests must produce text a grammar accepts.

Before every sampled token the request's grammar masks the logits (tokens that cannot lead to a string
of the language get -inf), so whatever the sampler picks keeps the output valid. With jump-forward on,
text the grammar allows in one way only (`{"name":"` after `{`) is written into the sequence without
sampling, and the next step computes it as a small chunk, like budget forcing's forced text.

Engine-shaped like TestTimeEngine (add_request / step / has_work and every attribute of the inner
engine), so a page's EngineSession drives it; `step()` adds one extra, "constrained": every request's
tokens so far, each with what the grammar allowed and what the model wanted.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig
from engine.constrained.constraint import Constraint, as_sentence
from engine.constrained.guide import Mask, SequenceGuide, accepts, problem_with
from engine.engine import LLMEngine, Prompt
from engine.sampling_params import SamplingParams
from engine.sequence import ForcedTokens, Sequence
from engine.wrapped_engine import EngineWrapper
from engine.weights import LoadedWeights

TOP = 5  # candidates kept per sampled token (what the model wanted, allowed or not)


@functools.cache
def _mask_worker() -> ThreadPoolExecutor:
    """One thread for every engine's early masks: llguidance drops the GIL while it computes one, so it runs
    beside the forward pass (torch drops the GIL in its kernels, and on a GPU the host only waits)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
_KEEP_DEFAULT: Any = object()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token of a constrained sequence.

    kind: "free" (the model's own first choice was allowed), "steered" (the grammar forbade the model's
    first choice), "only" (the grammar allowed this one token: a whole forward pass for a token with no
    choice), "forced" (written by jump-forward, no forward pass sampled it), "unconstrained" (a request
    without a grammar)."""

    step: int
    token: int
    kind: str
    allowed: int | None = None  # tokens the mask allowed (None: forced)
    chosen_prob: float | None = None  # the model's unconstrained probability of this token
    masked_mass: float | None = None  # the model's probability on tokens the grammar forbade
    top: tuple[tuple[int, float, bool], ...] = ()  # (token, unconstrained probability, allowed) of the top TOP
    mask_seconds: float = 0.0  # llguidance's bitmask and its unpacking
    mask_wait_seconds: float = 0.0  # how long sampling waited for that mask (all of it unless computed early)
    hook_seconds: float = 0.0  # everything the engine's logits hook did for this token (mask + statistics)


@dataclass
class _Pending:
    """What the logits hook saw for the token about to be sampled (the force hook completes it)."""

    step: int
    allowed: int | None
    probs_top: tuple[tuple[int, float, bool], ...]
    masked_mass: float | None
    mask_seconds: float
    probs: torch.Tensor  # unconstrained softmax of the row
    hook_seconds: float  # the whole hook: mask, softmax, top tokens, masked probability
    mask_wait_seconds: float


class ConstrainedEngine(EngineWrapper):
    EXTRA = "constrained"

    def __init__(self, config: EngineConfig = EngineConfig(), weights: LoadedWeights | None = None,
                 constraint: Constraint | None = None, jump_forward: bool = True, early_masks: bool = True) -> None:
        """`constraint`: the grammar of requests added without their own (None: unconstrained).
        `jump_forward`: write the text a grammar allows in one way only without sampling it.
        `early_masks`: compute a sequence's next mask as soon as its last token is known, on a worker thread,
        so it is ready when the next forward pass ends (what vLLM and SGLang do); off, the sampler computes it
        after the forward pass and waits for it every token."""
        if config.spec_drafter != "none" or config.overlap_decode:
            raise ValueError("constrained decoding needs an engine without speculative decoding or overlapped "
                             "decode (the grammar masks each token before it is sampled)")
        super().__init__(LLMEngine(config, weights))
        self.constraint = constraint
        self.jump_forward = jump_forward
        self.early_masks = early_masks
        self._next_masks: dict[int, Future[Mask]] = {}  # seq id -> its next mask, being computed
        self.constraints: dict[str, Constraint | None] = {}  # request id -> its grammar
        self.guides: dict[int, SequenceGuide] = {}  # seq id -> its matcher
        self.events: dict[int, list[TokenEvent]] = {}  # seq id -> its output tokens, as they came
        self.compile_seconds: dict[str, float] = {}  # request id -> building its first matcher
        self._pending: dict[int, _Pending] = {}
        self._valid: dict[int, bool] = {}  # seq id -> whether its finished text is in the language
        self._event_dicts: dict[int, list[dict[str, Any]]] = {}  # seq id -> its events as snapshot dicts
        self._texts: dict[int, tuple[int, str]] = {}  # seq id -> (tokens decoded, text)
        self.engine.process_logits = self._process_logits
        self.engine.force_tokens = self._after_token
        if constraint is not None:
            self._check(constraint)

    def add_request(self, prompt: Prompt, params: SamplingParams = SamplingParams(), arrival_step: int | None = None,
                    request_id: str | None = None, constraint: Constraint | None = _KEEP_DEFAULT) -> str:
        """Like LLMEngine.add_request, under `constraint` (default: the engine's)."""
        constraint = self.constraint if constraint is _KEEP_DEFAULT else constraint
        if constraint is not None:
            self._check(constraint)
            if params.ignore_eos:
                raise ValueError("ignore_eos cannot be used with a grammar: the grammar decides where the output "
                                 "ends (after it, only the end of the turn is allowed)")
        rid = self.engine.add_request(prompt, params, arrival_step=arrival_step, request_id=request_id)
        self.constraints[rid] = constraint
        if constraint is not None:
            for seq in self.sequences(rid):  # the first masks are computed while the prompt is
                self._compute_next_mask(seq, self._guide(seq))
        return rid

    def _check(self, constraint: Constraint) -> None:
        """ValueError (one sentence) unless the constraint is usable (problem_with caches the answer)."""
        problem = problem_with(constraint, self.engine.tokenizer)
        if problem is not None:
            raise ValueError(as_sentence(problem))

    # ---- the two hooks ----------------------------------------------------------------------------
    def _guide(self, seq: Sequence) -> SequenceGuide | None:
        constraint = self.constraints.get(seq.request_id)
        if constraint is None:
            return None
        guide = self.guides.get(seq.seq_id)
        if guide is None:
            guide = self.guides[seq.seq_id] = SequenceGuide(constraint, self.engine.tokenizer)
            self.compile_seconds.setdefault(seq.request_id, guide.build_seconds)
        return guide

    def _compute_next_mask(self, seq: Sequence, guide: SequenceGuide) -> None:
        """Start the sequence's next mask now (its tokens so far are all consumed): it is computed while the
        next forward pass runs. The guide is not touched again until the sampler has collected it."""
        if self.early_masks:
            self._next_masks[seq.seq_id] = _mask_worker().submit(guide.mask)

    def _mask(self, seq: Sequence, guide: SequenceGuide) -> tuple[Mask, float]:
        """(the mask for the sequence's next token, how long sampling waited for it)."""
        early = self._next_masks.pop(seq.seq_id, None)
        if early is None:
            mask = guide.mask()
            return mask, mask.seconds
        t0 = time.perf_counter()
        mask = early.result()
        return mask, time.perf_counter() - t0

    def _process_logits(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """Mask the row (a new tensor: the row is shared with the request's other samples) and note what the
        model wanted: its top TOP tokens, and the probability it put on forbidden ones."""
        t0 = time.perf_counter()
        guide = self._guide(seq)
        mask, wait = self._mask(seq, guide) if guide is not None else (None, 0.0)
        probs = torch.softmax(logits.float(), dim=-1)
        top_p, top_i = torch.topk(probs, TOP)
        allowed = None if mask is None else mask.allowed.to(logits.device, non_blocking=True)
        kept = probs.sum() if allowed is None else torch.dot(probs, allowed.to(probs.dtype))
        values = torch.cat([top_p, top_i.to(probs.dtype), kept.view(1)]).tolist()  # one device-to-host copy
        ids = [int(i) for i in values[TOP:2 * TOP]]
        flags = [True] * TOP if mask is None else mask.allowed[ids].tolist()
        top = tuple(zip(ids, values[:TOP], flags))
        out = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
        self._pending[seq.seq_id] = _Pending(
            self.engine.step_index, None if mask is None else mask.count, top,
            None if mask is None else max(0.0, 1.0 - values[-1]), 0.0 if mask is None else mask.seconds, probs,
            time.perf_counter() - t0, wait)
        return out

    def _add(self, seq_id: int, event: TokenEvent) -> None:
        self.events.setdefault(seq_id, []).append(event)
        self._event_dicts.setdefault(seq_id, []).append(dataclasses.asdict(event))  # converted once, shared by records

    def _after_token(self, seq: Sequence, token: int) -> ForcedTokens | None:
        pending = self._pending.pop(seq.seq_id, None)
        if pending is None:
            # Every sampled token passes _process_logits first; without it the grammar would fall out of step.
            raise RuntimeError(f"{seq.label}: token {token} was sampled without going through the grammar's mask")
        guide = self._guide(seq)
        if guide is None:
            kind = "unconstrained"
        elif pending.allowed == 1:
            kind = "only"
        else:
            kind = "free" if pending.probs_top[0][2] else "steered"
        self._add(seq.seq_id, TokenEvent(pending.step, token, kind, pending.allowed, float(pending.probs[token]),
                                         pending.masked_mass, pending.probs_top, pending.mask_seconds,
                                         pending.mask_wait_seconds, pending.hook_seconds))
        if guide is None:
            return None
        guide.advance(token)
        eos = self.engine.model_config.eos_token_ids
        if token in eos:
            return None
        # Within max_tokens: the sampled token is not appended yet, so it takes one of the remaining places.
        room = seq.params.max_tokens - seq.output_len - 1
        forced = guide.forced(room) if self.jump_forward else []
        if room > len(forced) and not (forced and forced[-1] in eos):  # the sequence goes on: next mask now
            self._compute_next_mask(seq, guide)
        if not forced:
            return None
        for t in forced:
            self._add(seq.seq_id, TokenEvent(self.engine.step_index, t, "forced"))
        return ForcedTokens(tuple(forced), replace=False, label="grammar")

    # ---- views ------------------------------------------------------------------------------------
    def _judge(self, seq: Sequence, constraint: Constraint | None, text: str) -> bool | None:
        """Whether a finished sample's text is in the language (judged once; None while it runs)."""
        if constraint is None or not seq.finished:
            return None
        if seq.seq_id not in self._valid:
            self._valid[seq.seq_id] = accepts(constraint, text, self.engine.tokenizer)
        return self._valid[seq.seq_id]

    def _text(self, seq: Sequence) -> str:
        """The output so far, decoded again only when it has grown (the snapshot asks every step)."""
        cached = self._texts.get(seq.seq_id)
        if cached is None or cached[0] != seq.num_tokens:
            cached = self._texts[seq.seq_id] = (seq.num_tokens, self.engine.tokenizer.decode(
                seq.output_ids, skip_special_tokens=True))
        return cached[1]

    def snapshot(self) -> dict[str, Any]:
        """Per request: its grammar, and per sample the tokens so far with their events (JSON-able). Events are
        dicts converted once; each snapshot holds a new list of the same dicts, so a step's record costs one
        reference per token, not a copy of every event."""
        requests = {}
        for rid, constraint in self.constraints.items():
            samples = []
            for seq in self.sequences(rid):
                guide = self.guides.get(seq.seq_id)
                text = self._text(seq)
                samples.append({
                    "label": seq.label, "status": seq.status.value, "finish_reason": seq.finish_reason,
                    "text": text, "events": list(self._event_dicts.get(seq.seq_id, ())),
                    "accepting": guide.accepting if guide is not None else None,
                    "error": guide.error if guide is not None else "",
                    "valid": self._judge(seq, constraint, text),
                })
            requests[rid] = {"constraint": dataclasses.asdict(constraint) if constraint else None,
                             "jump_forward": self.jump_forward, "early_masks": self.early_masks,
                             "compile_seconds": self.compile_seconds.get(rid),
                             "samples": samples}
        return {"requests": requests}
