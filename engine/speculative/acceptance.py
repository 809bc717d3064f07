"""The acceptance rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Drafted tokens d_1..d_g came from the drafter's distributions q_1..q_g; one target pass gave the
target's distributions p_1..p_{g+1} at the same positions (p_i is conditioned on d_1..d_{i-1}).
Walk the drafts in order: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first
rejection draw the replacement from the normalised residual max(0, p_i - q_i) and stop; if every
draft survives, draw a bonus token from p_{g+1}. Each emitted token is then distributed exactly as
if it had been sampled from the target alone:

    P(emit x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) * max(0, p(x) - q(x)) / Z
              = min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x),   with Z = 1 - sum_y min(p(y), q(y)).

Deterministic drafters (prompt lookup) have a one-hot q: the draft is accepted with probability
p(d), and the residual is p with d removed, renormalised.

Greedy requests need no randomness: accept while the draft equals the target's argmax; the final
token is the target's argmax after the last accepted draft. Both functions are pure (no engine
state), so tests can drive them with synthetic distributions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

Residual = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one verification round decided. Per-draft tuples have one entry per drafted token."""

    tokens: tuple[int, ...]  # what the round emits: the accepted drafts, then the final token
    num_accepted: int
    final_kind: str  # "bonus" (every draft accepted) or "resampled" (replaces the first rejected draft)
    p: tuple[float, ...]  # target probability of each drafted token
    q: tuple[float, ...]  # drafter probability of each drafted token (1.0 for a one-hot draft)
    uniforms: tuple[float | None, ...]  # the draw that decided each draft (None: greedy or never evaluated)
    verdicts: tuple[str, ...]  # "accepted" | "rejected" | "unverified" (after the first rejection)
    final_p: float  # target probability of the final token at its position
    residual_mass: float | None  # Z = sum max(0, p - q) at the rejection (None unless resampled)
    target_argmax: tuple[int, ...]  # the target's most likely token at every verified row (g + 1)


def exact_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The correct replacement distribution (unnormalised): max(0, p - q)."""
    return torch.clamp(p - q, min=0.0)


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def verify_sampled(p: torch.Tensor, draft_tokens: Sequence[int], q: torch.Tensor | None,
                   generator: torch.Generator | None, residual: Residual = exact_residual) -> Verdict:
    """Speculative sampling for one sequence.

    p: [g + 1, V] target probabilities (already temperature / top-k / top-p filtered, on the CPU).
    q: [g, V] drafter probabilities the drafts were sampled from, or None for a deterministic
       drafter (one-hot q). `generator` (the request's) makes the round reproducible.
    `residual` exists so tests can swap in a deliberately wrong rule; the engine never passes it.
    """
    g = len(draft_tokens)
    if p.shape[0] != g + 1:
        raise ValueError(f"need g + 1 = {g + 1} target rows, got {p.shape[0]}")
    if q is not None and q.shape[0] < g:
        raise ValueError(f"need {g} draft rows, got {q.shape[0]}")
    argmax = tuple(int(t) for t in p.argmax(-1).tolist())
    ps, qs, us, verdicts, out = [], [], [], [], []
    for i, d in enumerate(draft_tokens):
        pi = float(p[i, d])
        qi = 1.0 if q is None else float(q[i, d])
        ps.append(pi)
        qs.append(qi)
        u = float(torch.rand((), generator=generator))
        us.append(u)
        if u * qi < pi:  # u < p/q without dividing; q(d) > 0 because d was drawn from q
            verdicts.append("accepted")
            out.append(int(d))
            continue
        verdicts.append("rejected")
        q_row = _one_hot(int(d), p[i]) if q is None else q[i]
        r = residual(p[i], q_row)
        z = float(r.sum())
        # z == 0 only when p == q up to rounding, where a rejection has probability ~0: fall back to p.
        dist = r / z if z > 0 else p[i]
        final = int(torch.multinomial(dist, 1, generator=generator))
        rest = g - i - 1
        ps += [float(p[j, draft_tokens[j]]) for j in range(i + 1, g)]
        qs += [1.0 if q is None else float(q[j, draft_tokens[j]]) for j in range(i + 1, g)]
        return Verdict(tuple(out + [final]), i, "resampled", tuple(ps), tuple(qs),
                       tuple(us + [None] * rest), tuple(verdicts + ["unverified"] * rest),
                       float(p[i, final]), z, argmax)
    final = int(torch.multinomial(p[g], 1, generator=generator))
    return Verdict(tuple(out + [final]), g, "bonus", tuple(ps), tuple(qs), tuple(us), tuple(verdicts),
                   float(p[g, final]), None, argmax)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: Sequence[int],
                  draft_q: Sequence[float] | None = None) -> Verdict:
    """Greedy verification: accept while draft == target argmax; the final token is the argmax after
    the last accepted draft. p (and q, when given) are temperature-1 softmax values, for display only."""
    g = len(draft_tokens)
    if target_logits.shape[0] != g + 1:
        raise ValueError(f"need g + 1 = {g + 1} target rows, got {target_logits.shape[0]}")
    argmax = [int(t) for t in target_logits.argmax(-1).tolist()]
    probs = torch.softmax(target_logits.float(), dim=-1)
    ps = tuple(float(probs[i, d]) for i, d in enumerate(draft_tokens))
    qs = tuple(float(x) for x in draft_q) if draft_q is not None else (1.0,) * g
    n = 0
    while n < g and int(draft_tokens[n]) == argmax[n]:
        n += 1
    verdicts = ("accepted",) * n + (("rejected",) if n < g else ()) + ("unverified",) * max(g - n - 1, 0)
    final = argmax[n]
    return Verdict(tuple(int(t) for t in draft_tokens[:n]) + (final,), n, "resampled" if n < g else "bonus",
                   ps, qs, (None,) * g, verdicts, float(probs[n, final]), None, tuple(argmax))
