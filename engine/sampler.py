"""Turn the last position's logits into a token: greedy, temperature, top-k, top-p.

Each sequence owns a `torch.Generator` seeded from its request's seed, so a run is reproducible no
matter which other requests share the batch.
"""
from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [vocab] float. Returns the chosen token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = filtered_probs(logits, params)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request actually draws from (also what speculation must match)."""
    logits = logits.float() / max(params.temperature, 1e-6)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
