"""Expert parallelism in arithmetic: SmolLM2 has no experts, so this part is computed from published MoE shapes.

An MoE layer replaces the MLP with E experts of which a router picks k per token. Expert parallelism puts E/ep
experts on each GPU; every token is sent to the GPUs holding its k experts (dispatch) and the results come back
(combine): two all-to-alls per MoE layer. Tensor parallelism of the same layer instead splits every expert's
matrices and all-reduces the hidden state. The router's picks are uneven, so the busiest GPU sets the pace;
`routing_imbalance` draws routings and measures that.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.parallel.collectives import ring_all_reduce_bytes


@dataclass(frozen=True, slots=True)
class MoeShape:
    name: str
    layers: int  # decoder layers
    moe_layers: int  # of them, MoE layers
    hidden: int
    experts: int  # routed experts per MoE layer
    top_k: int
    expert_ffn: int  # one expert's intermediate size (SwiGLU: 3 matrices)
    total_params_b: float  # published, billions
    active_params_b: float
    source: str

    @property
    def expert_params(self) -> int:
        """All routed experts' weights, all MoE layers."""
        return self.moe_layers * self.experts * 3 * self.hidden * self.expert_ffn

    @property
    def other_params(self) -> float:
        """Attention, embeddings, shared experts, dense layers: the published total minus the routed experts."""
        return self.total_params_b * 1e9 - self.expert_params


# From the models' published configuration files (config.json) and papers.
MOE_MODELS: tuple[MoeShape, ...] = (
    MoeShape("Mixtral 8x7B", 32, 32, 4096, 8, 2, 14336, 46.7, 12.9, "mistralai/Mixtral-8x7B-v0.1 config.json"),
    MoeShape("Qwen3-235B-A22B", 94, 94, 4096, 128, 8, 1536, 235.1, 22.2, "Qwen/Qwen3-235B-A22B config.json"),
    MoeShape("DeepSeek-V3", 61, 58, 7168, 256, 8, 2048, 671.0, 37.0, "DeepSeek-V3 technical report (2412.19437)"),
)


@dataclass(frozen=True, slots=True)
class EpCost:
    model: str
    gpus: int
    weight_gb_per_gpu_ep: float  # experts split, the rest replicated
    weight_gb_per_gpu_tp: float  # everything split
    a2a_bytes_per_token: float  # dispatch + combine, per MoE layer, leaving a token's GPU
    tp_bytes_per_token: float  # all-reduce per MoE layer, sent per rank, for the same layer under TP


def ep_cost(m: MoeShape, gpus: int, bytes_per_param: float = 1.0, act_bytes: int = 2) -> EpCost:
    """Per-GPU weights (fp8 by default, as these models ship) and per-token traffic of one MoE layer.
    Dispatch sends a token's hidden state to each of its k experts not on its own GPU, (ep - 1) / ep of them
    on average under uniform routing; combine brings as many back."""
    remote = (gpus - 1) / gpus
    return EpCost(m.name, gpus,
                  (m.other_params + m.expert_params / gpus) * bytes_per_param / 1e9,
                  m.total_params_b * 1e9 / gpus * bytes_per_param / 1e9,
                  2 * m.top_k * remote * m.hidden * act_bytes,
                  ring_all_reduce_bytes(m.hidden * act_bytes, gpus))


@dataclass(frozen=True, slots=True)
class Imbalance:
    tokens: int
    gpus: int
    mean_per_gpu: float  # expert slots (token x pick) per GPU
    max_per_gpu_mean: float  # the busiest GPU's load, averaged over draws
    ratio: float  # max / mean: how much longer the MoE layer takes than with perfect balance


def routing_imbalance(tokens: int, experts: int, top_k: int, gpus: int, skew: float = 0.0, draws: int = 200,
                      seed: int = 0) -> Imbalance:
    """Draw routings of `tokens` tokens (each picks top_k distinct experts) and measure the busiest GPU.
    `skew` 0: every expert equally likely; larger: a Zipf-like popularity (expert i weighted (i + 1) ** -skew),
    what routers drift to without a balancing loss."""
    rng = np.random.default_rng(seed)
    p = (np.arange(experts) + 1.0) ** -skew
    p /= p.sum()
    per_gpu = experts // gpus
    maxes = []
    for _ in range(draws):
        # top-k distinct experts per token with popularity p: Gumbel-top-k
        g = np.log(p)[None, :] - np.log(-np.log(rng.random((tokens, experts))))
        picks = np.argpartition(-g, top_k - 1, axis=1)[:, :top_k]
        load = np.bincount(picks.ravel() // per_gpu, minlength=gpus)
        maxes.append(load.max())
    mean = tokens * top_k / gpus
    mx = float(np.mean(maxes))
    return Imbalance(tokens, gpus, mean, mx, mx / mean)
