"""Self-speculative decoding with a quantized KV cache (QuantSpec, arXiv 2502.10424), greedy.

The drafter is the model itself, reading a low-bit copy of its own KV cache; the verifier is the same model
reading the full-precision cache. No second model, no trained heads: the draft differs from the target only in
what its attention reads. At long contexts a decode step's bytes are mostly KV cache, so a draft step that reads
a 4-bit copy costs a fraction of a target step, and because the draft *is* the model its guesses are usually
right.

Each round: the draft proposes up to γ tokens one at a time; the target runs the last committed token and the γ
drafts in one pass and keeps the longest prefix its own greedy choices agree with, plus its next token. Both
caches then roll back to the committed tokens, and the draft's copy of those tokens is the target's exact K and V
stored in the low-bit format (QuantSpec keeps one hierarchical INT8 cache whose upper 4 bits are the draft's;
storing the target's KV once per format is the same numbers). The output is the target's greedy text, token for
token: the draft decides only how many target passes it takes.

A plain loop on the model's prepared weights through the KV compression lab's cache stores (`KVLab`), one
sequence, not the paged engine.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv_compression.formats import FORMATS
from engine.kv_compression.lab import KVLab, Variant, _Row, _RowCache
from engine.weight_quant.dense import LINEAR_INPUTS, weight_key
from engine.weight_quant.grid import Grid, round_to_nearest
from engine.weight_quant.lab import fp32_state
from engine.weights import LoadedWeights

SELF_SPEC_FORMATS = ("fp8", "int8", "int4", "int2")  # per-token formats: a rollback drops single tokens
MAX_GAMMA = 8
DRAFT_WEIGHT_BITS = 4
DRAFT_WEIGHT_GROUP = 32


@dataclass(frozen=True, slots=True)
class SelfSpecRound:
    drafted: tuple[int, ...]  # the draft's proposals
    accepted: int  # how many of them the target kept
    committed: tuple[int, ...]  # what the round added: the accepted drafts and the target's own next token


@dataclass(frozen=True, slots=True)
class SelfSpecRun:
    kv_format: str
    gamma: int
    prompt_tokens: int
    tokens: tuple[int, ...]  # generated (end-of-turn dropped): the target's greedy text
    rounds: tuple[SelfSpecRound, ...]
    draft_bytes_per_token: float  # the low-bit cache's stored bytes (codes, scales, zero points) per token
    target_bytes_per_token: float
    seconds: float
    draft_weight_bits: int = 16  # 4: the draft ran the decoder's linears rounded to INT4 (`int4_weights`)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens the target kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens each verification pass of the target produced (1.0 is plain decoding)."""
        return sum(len(r.committed) for r in self.rounds) / len(self.rounds) if self.rounds else 0.0


def int4_weights(weights: LoadedWeights, group: int = DRAFT_WEIGHT_GROUP) -> LoadedWeights:
    """The same model with every decoder linear rounded to INT4 (round-to-nearest, a scale and zero point per
    `group` input channels; embedding, head and norms kept): QuantSpec's draft weights, without its calibration."""
    sd, cfg = fp32_state(weights), weights.config
    q = dict(sd)
    grid = Grid(DRAFT_WEIGHT_BITS, group)
    for i in range(cfg.num_layers):
        for names in LINEAR_INPUTS.values():
            for name in names:
                q[weight_key(i, name)] = round_to_nearest(sd[weight_key(i, name)], grid)
    return dataclasses.replace(weights, state_dict=q, source=f"{weights.source}, decoder linears INT4 g{group}")


def check_gamma(gamma: int) -> None:
    if not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(f"the draft length γ must be 1 to {MAX_GAMMA}")


def check_self_spec(kv_format: str, gamma: int) -> None:
    if kv_format not in SELF_SPEC_FORMATS:
        raise ValueError(f"the draft's cache format must be one of {', '.join(SELF_SPEC_FORMATS)}, got {kv_format!r}")
    check_gamma(gamma)


def _copy_kv(target: _RowCache, draft: _RowCache, start: int, stop: int) -> None:
    """The target's exact K and V of tokens [start, stop) into the draft's store (which quantizes them)."""
    for i in range(len(target.k)):
        draft.append(i, target.k[i].read()[:, start:stop], target.v[i].read()[:, start:stop],
                     target.positions[i][0, start:stop])


@torch.inference_mode()
def self_speculate(lab: KVLab, prompt_ids: list[int], kv_format: str, gamma: int, max_new_tokens: int,
                   draft_lab: KVLab | None = None) -> SelfSpecRun:
    """The prompt's greedy answer by self-speculation with the draft reading a `kv_format` copy of the cache.
    `draft_lab`: the model the draft runs (the same weights in 4 bits, `int4_weights`); default `lab`'s own."""
    drafter = draft_lab or lab
    check_self_spec(kv_format, gamma)
    lab.check(prompt_ids, [Variant(kv_format)], max_new_tokens)
    t0 = time.perf_counter()
    dev, layers, eos = lab.device, lab.cfg.num_layers, set(lab.cfg.eos_token_ids)
    target = _Row(0, "reference", _RowCache(lab.reference, layers, lab.dtype, dev), [])
    draft = _Row(1, "forced", _RowCache(Variant(kv_format), layers, lab.dtype, dev), [])
    n = len(prompt_ids)
    logits, _ = lab._forward([target], torch.tensor([prompt_ids], device=dev), torch.arange(n, device=dev))
    _copy_kv(target.cache, draft.cache, 0, n)
    pending = int(torch.argmax(logits[0]))  # sampled, not yet in either cache
    out, rounds = [pending], []
    while len(out) < max_new_tokens and out[-1] not in eos:
        proposals: list[int] = []
        tok = pending
        for i in range(min(gamma, max_new_tokens - len(out))):
            step, _ = drafter._forward([draft], torch.tensor([[tok]], device=dev), torch.tensor([n + i], device=dev))
            tok = int(torch.argmax(step[0]))
            proposals.append(tok)
            if tok in eos:
                break
        ids = [pending, *proposals]
        verify, _ = lab._forward([target], torch.tensor([ids], device=dev),
                                 torch.arange(n, n + len(ids), device=dev), all_positions=True)
        greedy = verify[0].argmax(-1).tolist()
        j = 0
        while j < len(proposals) and proposals[j] == greedy[j]:
            j += 1
        committed = (*proposals[:j], greedy[j])
        # What the round adds to the answer: not past the token budget (the bonus token of a last round whose
        # drafts were all accepted) nor past an end of turn, so tokens per pass counts only what was written.
        committed = committed[:max_new_tokens - len(out)]
        ends = [i for i, t in enumerate(committed) if t in eos]
        committed = committed[:ends[0] + 1] if ends else committed
        # Both caches keep the committed tokens only: pending and the accepted drafts (the target computed them).
        target.cache.truncate(n + j + 1)
        draft.cache.truncate(n)
        _copy_kv(target.cache, draft.cache, n, n + j + 1)
        n += j + 1
        pending = greedy[j]
        rounds.append(SelfSpecRound(tuple(proposals), j, committed))
        out.extend(committed)
    tokens = out[:max_new_tokens]
    if any(t in eos for t in tokens):
        tokens = tokens[:next(i for i, t in enumerate(tokens) if t in eos)]
    cached = target.cache.tokens
    return SelfSpecRun(kv_format, gamma, len(prompt_ids), tuple(tokens), tuple(rounds),
                       draft.cache.nbytes / cached, target.cache.nbytes / cached, time.perf_counter() - t0,
                       16 if draft_lab is None else DRAFT_WEIGHT_BITS)


@torch.inference_mode()
def plain_greedy(lab: KVLab, prompt_ids: list[int], max_new_tokens: int) -> tuple[tuple[int, ...], float]:
    """The target alone, one token a pass, on the same path: what self-speculation must reproduce. (tokens, s)"""
    t0 = time.perf_counter()
    dev, eos = lab.device, set(lab.cfg.eos_token_ids)
    row = _Row(0, "reference", _RowCache(lab.reference, lab.cfg.num_layers, lab.dtype, dev), [])
    n = len(prompt_ids)
    logits, _ = lab._forward([row], torch.tensor([prompt_ids], device=dev), torch.arange(n, device=dev))
    out: list[int] = []
    while True:
        tok = int(torch.argmax(logits[0]))
        if tok in eos:
            break
        out.append(tok)
        if len(out) == max_new_tokens:
            break
        logits, _ = lab._forward([row], torch.tensor([[tok]], device=dev), torch.tensor([n], device=dev))
        n += 1
    return tuple(out), time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class SelfSpecLabResult:
    prompt_tokens: int
    gamma: int
    plain: tuple[int, ...]  # the target alone
    plain_seconds: float
    runs: tuple[SelfSpecRun, ...]  # per format (SELF_SPEC_FORMATS order) with 16-bit draft weights, then 4-bit

    def run(self, kv_format: str, weight_bits: int = 16) -> SelfSpecRun:
        return next(r for r in self.runs if r.kv_format == kv_format and r.draft_weight_bits == weight_bits)

    @property
    def weight_bits(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(r.draft_weight_bits for r in self.runs))


def run_self_spec_lab(lab: KVLab, prompt_ids: list[int], gamma: int, max_new_tokens: int,
                      formats: tuple[str, ...] = SELF_SPEC_FORMATS, draft_lab: KVLab | None = None,
                      progress: Callable[[str, float], None] | None = None) -> SelfSpecLabResult:
    """The target alone, then self-speculation with the draft's cache in each format; again with `draft_lab`'s
    weights (INT4, `int4_weights`) for the draft when given."""
    for f in formats:
        check_self_spec(f, gamma)
    say = progress or (lambda _m, _f: None)
    say("The target alone, one token a pass", 0.0)
    plain, plain_s = plain_greedy(lab, prompt_ids, max_new_tokens)
    jobs = [(f, None) for f in formats] + ([(f, draft_lab) for f in formats] if draft_lab is not None else [])
    runs = []
    for i, (f, d) in enumerate(jobs):
        weights = "" if d is None else " and INT4 weights"
        say(f"Self-speculating with a {FORMATS[f].label} draft cache{weights}", (i + 1) / (len(jobs) + 1))
        runs.append(self_speculate(lab, prompt_ids, f, gamma, max_new_tokens, d))
    say("Done", 1.0)
    return SelfSpecLabResult(len(prompt_ids), gamma, plain, plain_s, tuple(runs))
