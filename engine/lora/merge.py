"""Merging an adapter: W' = W + (alpha / r) B A for every adapted linear, a plain checkpoint again.

A merged model runs at exactly the base model's cost (no extra kernels), but it is one full copy of
the weights per fine-tune, and a batch can only serve the fine-tune it was merged with.
"""
from __future__ import annotations

import dataclasses

import torch

from engine.lora.adapter import LoraAdapter, hf_weight_name
from engine.state_memo import StateDictMemo
from engine.weights import LoadedWeights

_MERGED: StateDictMemo[dict[str, LoadedWeights]] = StateDictMemo()


def merged_state_dict(state_dict: dict[str, torch.Tensor], adapter: LoraAdapter) -> dict[str, torch.Tensor]:
    """A new state dict with the adapter merged in (the sum in fp32, stored in each weight's dtype); every
    weight the adapter leaves alone is the same tensor as in `state_dict` (no copy)."""
    out = dict(state_dict)
    for layer, target in adapter.weights:
        key = hf_weight_name(layer, target)
        w = state_dict[key]
        out[key] = (w.float() + adapter.delta(layer, target).to(w.device)).to(w.dtype)
    return out


def merged_weights(weights: LoadedWeights, adapter: LoraAdapter) -> LoadedWeights:
    """`weights` with the adapter merged, built once per (weights, adapter name) in a process: the
    merged copy is a whole checkpoint (~540 MB in fp32), which is the point the merge page makes."""
    cache = _MERGED.get(weights.state_dict, dict)
    hit = cache.get(adapter.name)
    if hit is None:
        hit = dataclasses.replace(weights, state_dict=merged_state_dict(weights.state_dict, adapter),
                                  source=f"{weights.source} + LoRA '{adapter.name}' merged")
        cache[adapter.name] = hit
    return hit
