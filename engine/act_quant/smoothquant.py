"""SmoothQuant: move the activations' outliers into the weights, one scale per input channel.

A few input channels of a layer's activations are hundreds of times larger than the rest, the same channels on
every token. With one scale per tensor (or per token) those channels set the scale and every other channel is
left a handful of quantization levels. Weights have no such channels. SmoothQuant divides input channel j of X
by s_j and multiplies column j of W by it, which leaves the product unchanged:

    X Wᵀ = (X diag(s)⁻¹)(diag(s) Wᵀ),    s_j = max|X_j|^α / max|W_j|^(1-α)

α = 0.5 splits the difficulty evenly; larger α moves more of it into the weights. Deployed, 1/s folds into the
preceding norm's weight (or the previous linear), so it costs nothing at run time.
"""
from __future__ import annotations

import torch

MIN_SCALE = 1e-5  # a dead channel (max |x| = 0) keeps a usable scale


def smooth_scales(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [in] from each input channel's largest |x| on calibration data (`act_max` [in]) and the weights that
    read that input (`weight` [out, in]; linears sharing the input concatenated along out)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be from 0 to 1, not {alpha}")
    w_max = weight.abs().amax(dim=0).clamp(min=MIN_SCALE)
    s = act_max.float().clamp(min=MIN_SCALE).pow(alpha) / w_max.pow(1.0 - alpha)
    return s.clamp(min=MIN_SCALE)


def smooth(x: torch.Tensor, weight: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X diag(s)⁻¹, W diag(s)): the same product, the outliers moved from X into W."""
    return x / s, weight * s
