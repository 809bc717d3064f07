"""AWQ (Lin et al., arXiv 2306.00978): activation-aware scaling before round-to-nearest.

A few input channels carry activations far larger than the rest; the weights that multiply them matter
most. AWQ multiplies each input channel's weights by s_j = mean|x_j|^alpha before quantizing (so those
weights land on a finer relative grid) and divides the activations by s_j (a real checkpoint folds 1/s into
the previous RMSNorm or linear; here it is folded into the dequantized weight, which computes the same
thing). alpha is searched per layer input on the calibration activations, minimising the output error.
Not here: AWQ's second search, clipping each group's range.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.weight_quant.grid import Grid, round_to_nearest

ALPHAS = tuple(i / 10 for i in range(10))  # 0.0 is plain round-to-nearest


@dataclass(frozen=True, slots=True)
class AwqChoice:
    alpha: float
    error: float  # mean squared output error at that alpha
    rtn_error: float  # ... and at alpha = 0 (round-to-nearest)
    scales: torch.Tensor  # [in] the per-channel scales used


def awq_quantize(w: torch.Tensor, x: torch.Tensor, grid: Grid,
                 alphas: tuple[float, ...] = ALPHAS) -> tuple[torch.Tensor, AwqChoice]:
    """w [out, in] (the weights that read one input, concatenated), x [tokens, in] calibration inputs.
    Returns the dequantized weights with 1/s folded in and the search's outcome."""
    w = w.float()
    x = x.float()
    ref = x @ w.T
    mean_abs = x.abs().mean(dim=0).clamp(min=1e-8)
    best: tuple[float, float, torch.Tensor, torch.Tensor] | None = None
    rtn_error = float("nan")
    for alpha in alphas:
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # keep the scales centred on 1 (as the reference code does)
        w_hat = round_to_nearest(w * s, grid) / s
        err = float((x @ w_hat.T - ref).pow(2).mean())
        if alpha == 0.0:
            rtn_error = err
        if best is None or err < best[1]:
            best = (alpha, err, w_hat, s)
    assert best is not None
    alpha, err, w_hat, s = best
    return w_hat, AwqChoice(alpha, err, rtn_error, s)
