"""What an adapter is made of, counted from the real tensors: its footprint (parameters, bytes, FLOPs per
token against the base model) and its anatomy (||dW||_F / ||W||_F for every adapted linear, dW = (alpha/r) B A,
and one linear's singular values: at most r nonzero, next to W's own). The merge page draws both."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.config import ModelConfig
from engine.lora.adapter import TARGETS, LoraAdapter, hf_weight_name, target_shape
from engine.lora.slots import GROUPS
from engine.weights import LoadedWeights

CHECKPOINT_BYTES_PER_PARAM = 2  # a served checkpoint or adapter in bf16


# ----------------------------------------------------------------------------------------- footprint

def base_params(cfg: ModelConfig) -> int:
    """Parameters of a Llama of this shape (embedding, layers, final norm, an LM head if untied)."""
    per_layer = sum(o * i for o, i in (target_shape(cfg, t) for t in TARGETS)) + 2 * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    return cfg.vocab_size * cfg.hidden_size + cfg.num_layers * per_layer + cfg.hidden_size + head


def adapter_params(cfg: ModelConfig, rank: int, targets: tuple[str, ...]) -> int:
    """r (d_in + d_out) per adapted linear per layer."""
    return cfg.num_layers * sum(rank * sum(target_shape(cfg, t)) for t in targets)


@dataclass(frozen=True, slots=True)
class Footprint:
    """Sizes and per-token arithmetic of the base model and one adapter, from the real tensors."""

    base_params: int
    checkpoint_bytes: int  # the base model (or one merged copy) in bf16
    adapter_params: int
    adapter_bytes: int  # the adapter in bf16
    base_linear_flops: float  # per token: 2 d_in d_out over every linear of every layer
    lm_head_flops: float  # per token: 2 hidden vocab
    adapter_flops: float  # per token: 2 r (d_in + d_out) over the adapted linears
    served_flops: float  # per token, what the engine's LoRA kernels multiply: every fused group, padded

    @property
    def extra_flops_share(self) -> float:
        """The adapter's arithmetic as a share of the base model's linears (LM head included)."""
        return self.adapter_flops / (self.base_linear_flops + self.lm_head_flops)

    @property
    def adapter_share(self) -> float:
        return self.adapter_bytes / self.checkpoint_bytes


def footprint(weights: LoadedWeights, adapter: LoraAdapter, max_rank: int | None = None) -> Footprint:
    cfg = weights.config
    params = sum(t.numel() for t in weights.state_dict.values())
    linear = cfg.num_layers * sum(2.0 * o * i for o, i in (target_shape(cfg, t) for t in TARGETS))
    own = sum(2.0 * a.shape[0] * (a.shape[1] + b.shape[0]) for a, b in adapter.weights.values())
    r = max_rank or adapter.rank
    served = 0.0  # the slots hold every target of every group at max_rank (engine/lora/slots.py)
    for _, targets in GROUPS:
        d_in = target_shape(cfg, targets[0])[1]
        d_out = sum(target_shape(cfg, t)[0] for t in targets)
        served += 2.0 * len(targets) * r * (d_in + d_out)
    return Footprint(params, params * CHECKPOINT_BYTES_PER_PARAM, adapter.num_params,
                     adapter.nbytes(CHECKPOINT_BYTES_PER_PARAM), linear, 2.0 * cfg.hidden_size * cfg.vocab_size, own,
                     cfg.num_layers * served)


# ----------------------------------------------------------------------------------------- anatomy

@dataclass(frozen=True, slots=True, eq=False)
class Anatomy:
    """rel_norm[layer, j] = ||dW||_F / ||W||_F of TARGETS[j] (NaN: that linear is not adapted)."""

    rel_norm: np.ndarray
    targets: tuple[str, ...] = TARGETS

    def largest(self) -> tuple[int, str]:
        """The adapted linear the adapter changes most, relative to its weight."""
        layer, j = np.unravel_index(int(np.nanargmax(self.rel_norm)), self.rel_norm.shape)
        return int(layer), self.targets[int(j)]


def _weight(weights: LoadedWeights, layer: int, target: str) -> torch.Tensor:
    return weights.state_dict[hf_weight_name(layer, target)].detach().float().cpu()


@torch.inference_mode()
def anatomy(weights: LoadedWeights, adapter: LoraAdapter) -> Anatomy:
    """||s B A||_F = s sqrt(sum((B^T B) * (A A^T))): from r x r products, without forming dW."""
    rel = np.full((weights.config.num_layers, len(TARGETS)), np.nan)
    for (layer, target), (a, b) in adapter.weights.items():
        a, b = a.float(), b.float()
        delta = adapter.scale * float(((b.T @ b) * (a @ a.T)).sum().clamp(min=0).sqrt())
        rel[layer, TARGETS.index(target)] = delta / max(float(_weight(weights, layer, target).norm()), 1e-30)
    return Anatomy(rel)


@dataclass(frozen=True, slots=True, eq=False)
class Spectrum:
    """Singular values (descending) of one linear's W and of the adapter's dW = (alpha/r) B A."""

    layer: int
    target: str
    rank: int
    weight: np.ndarray
    delta: np.ndarray

    @property
    def tail_ratio(self) -> float:
        """The largest singular value of dW beyond the rank, relative to its largest: ~1e-7 in fp32."""
        if len(self.delta) <= self.rank or self.delta[0] <= 0:
            return 0.0
        return float(self.delta[self.rank:].max() / self.delta[0])

    @property
    def numerical_rank(self) -> int:
        """Singular values of dW above 1e-4 of its largest."""
        return int((self.delta > 1e-4 * self.delta[0]).sum()) if len(self.delta) and self.delta[0] > 0 else 0


@torch.inference_mode()
def spectrum(weights: LoadedWeights, adapter: LoraAdapter, layer: int, target: str) -> Spectrum:
    """Full SVDs in fp64 on the CPU (the largest linear is 1,536 x 576: well under a second)."""
    delta = adapter.delta(layer, target)
    if delta is None:
        raise ValueError(f"the adapter does not change layer {layer}'s {target} projection")
    w = _weight(weights, layer, target)
    return Spectrum(layer, target, adapter.rank, torch.linalg.svdvals(w.double()).numpy(),
                    torch.linalg.svdvals(delta.double()).numpy())
