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
import time
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig
from engine.constrained.constraint import Constraint
from engine.constrained.guide import SequenceGuide, accepts, problem_with
from engine.engine import LLMEngine, Prompt
from engine.sampling_params import SamplingParams
from engine.sequence import ForcedTokens, Sequence
from engine.trace import StepRecord
from engine.weights import LoadedWeights

TOP = 5  # candidates kept per sampled token (what the model wanted, allowed or not)
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
    mask_seconds: float = 0.0


@dataclass
class _Pending:
    """What the logits hook saw for the token about to be sampled (the force hook completes it)."""

    step: int
    allowed: int | None
    probs_top: tuple[tuple[int, float, bool], ...]
    masked_mass: float | None
    mask_seconds: float
    probs: torch.Tensor  # unconstrained softmax of the row


class ConstrainedEngine:
    def __init__(self, config: EngineConfig = EngineConfig(), weights: LoadedWeights | None = None,
                 constraint: Constraint | None = None, jump_forward: bool = True) -> None:
        """`constraint`: the grammar of requests added without their own (None: unconstrained).
        `jump_forward`: write the text a grammar allows in one way only without sampling it."""
        if config.spec_drafter != "none" or config.overlap_decode:
            raise ValueError("constrained decoding needs an engine without speculative decoding or overlapped "
                             "decode (the grammar masks each token before it is sampled)")
        self.engine = LLMEngine(config, weights)
        self.constraint = constraint
        self.jump_forward = jump_forward
        self.constraints: dict[str, Constraint | None] = {}  # request id -> its grammar
        self.guides: dict[int, SequenceGuide] = {}  # seq id -> its matcher
        self.events: dict[int, list[TokenEvent]] = {}  # seq id -> its output tokens, as they came
        self.compile_seconds: dict[str, float] = {}  # request id -> building its first matcher
        self._pending: dict[int, _Pending] = {}
        self._valid: dict[int, bool] = {}  # seq id -> whether its finished text is in the language
        self._checked: set[Constraint] = set()
        self.engine.process_logits = self._process_logits
        self.engine.force_tokens = self._after_token
        if constraint is not None:
            self._check(constraint)

    def __getattr__(self, name: str) -> Any:  # config, model_config, tokenizer, step_index, counters, ...
        return getattr(self.__dict__["engine"], name)

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
        return rid

    def _check(self, constraint: Constraint) -> None:
        """ValueError (one sentence) unless the constraint is usable; each distinct one is checked once."""
        if constraint in self._checked:
            return
        problem = problem_with(constraint, self.engine.tokenizer)
        if problem is not None:
            raise ValueError(problem[0].upper() + problem[1:] + ".")
        self._checked.add(constraint)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> StepRecord:
        record = self.engine.step()
        if self.engine.config.trace_detail == "light":
            return record
        return dataclasses.replace(record, extras=record.extras + (("constrained", self.snapshot()),))

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

    def _process_logits(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float(), dim=-1)
        guide = self._guide(seq)
        top_p, top_i = torch.topk(probs, TOP)
        if guide is None:
            top = tuple((int(i), float(p), True) for p, i in zip(top_p, top_i))
            self._pending[seq.seq_id] = _Pending(self.engine.step_index, None, top, None, 0.0, probs)
            return logits
        mask = guide.mask()
        allowed = mask.allowed.to(logits.device)
        top = tuple((int(i), float(p), bool(allowed[i])) for p, i in zip(top_p, top_i))
        masked_mass = float(probs[~allowed].sum())
        self._pending[seq.seq_id] = _Pending(self.engine.step_index, mask.count, top, masked_mass, mask.seconds, probs)
        return logits.masked_fill(~allowed, float("-inf"))

    def _after_token(self, seq: Sequence, token: int) -> ForcedTokens | None:
        pending = self._pending.pop(seq.seq_id, None)
        guide = self._guide(seq)
        events = self.events.setdefault(seq.seq_id, [])
        step = self.engine.step_index
        if pending is None:  # never happens for a sampled token; kept so a bug shows as a plain event
            events.append(TokenEvent(step, token, "unconstrained" if guide is None else "free"))
            return None
        if guide is None:
            kind = "unconstrained"
        elif pending.allowed == 1:
            kind = "only"
        else:
            kind = "free" if pending.probs_top[0][2] else "steered"
        events.append(TokenEvent(pending.step, token, kind, pending.allowed, float(pending.probs[token]),
                                 pending.masked_mass, pending.probs_top, pending.mask_seconds))
        if guide is None:
            return None
        guide.advance(token)
        if not self.jump_forward or token in self.engine.model_config.eos_token_ids:
            return None
        # Within max_tokens: the sampled token is not appended yet, so it takes one of the remaining places.
        forced = guide.forced(seq.params.max_tokens - seq.output_len - 1)
        if not forced:
            return None
        events.extend(TokenEvent(step, t, "forced") for t in forced)
        return ForcedTokens(tuple(forced), replace=False, label="grammar")

    # ---- views ------------------------------------------------------------------------------------
    def _judge(self, seq: Sequence, constraint: Constraint | None, text: str) -> bool | None:
        """Whether a finished sample's text is in the language (judged once; None while it runs)."""
        if constraint is None or not seq.finished:
            return None
        if seq.seq_id not in self._valid:
            self._valid[seq.seq_id] = accepts(constraint, text, self.engine.tokenizer)
        return self._valid[seq.seq_id]

    def sequences(self, request_id: str) -> list[Sequence]:
        return sorted((s for s in self.engine.sequences if s.request_id == request_id), key=lambda s: s.index)

    def snapshot(self) -> dict[str, Any]:
        """Per request: its grammar, and per sample the tokens so far with their events (JSON-able)."""
        tok = self.engine.tokenizer
        requests = {}
        for rid, constraint in self.constraints.items():
            samples = []
            for seq in self.sequences(rid):
                guide = self.guides.get(seq.seq_id)
                events = self.events.get(seq.seq_id, [])
                text = tok.decode(seq.output_ids, skip_special_tokens=True)
                samples.append({
                    "label": seq.label, "status": seq.status.value, "finish_reason": seq.finish_reason,
                    "text": text, "events": [dataclasses.asdict(e) for e in events],
                    "accepting": guide.accepting if guide is not None else None,
                    "error": guide.error if guide is not None else "",
                    "valid": self._judge(seq, constraint, text),
                })
            requests[rid] = {"constraint": dataclasses.asdict(constraint) if constraint else None,
                             "jump_forward": self.jump_forward, "compile_seconds": self.compile_seconds.get(rid),
                             "samples": samples}
        return {"requests": requests}
