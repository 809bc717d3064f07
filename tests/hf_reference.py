"""Greedy reference tokens from Hugging Face transformers (same weights, fp32, CPU), memoised
per session so several tests can compare against the same runs."""
from __future__ import annotations

import functools

import torch

from engine.weights import LoadedWeights, hf_reference_model


@functools.cache
def _model(weights_id: int, weights: LoadedWeights):
    return hf_reference_model(weights).eval()


def hf_greedy(weights: LoadedWeights, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Batch-1 greedy decode (no padding, so nothing but the model decides the tokens); stops at EOS."""
    return list(_hf_greedy(id(weights), weights, tuple(prompt_ids), max_new_tokens))


@functools.cache
def _hf_greedy(weights_id: int, weights: LoadedWeights, prompt_ids: tuple[int, ...], max_new_tokens: int):
    model = _model(weights_id, weights)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=list(weights.config.eos_token_ids), pad_token_id=0)
    return tuple(out[0, len(prompt_ids):].tolist())
