"""GPTQ (Frantar et al., arXiv 2210.17323): quantize one input column at a time and push each column's
rounding error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's
squared output error, H = 2 X^T X over the calibration inputs X.

The error of column j is spread so that the layer's output on the calibration set changes as little as
possible (Optimal Brain Surgeon with a fixed column order). Lazy batches of 128 columns and a Cholesky
factor of H^-1 as in the paper's Algorithm 1; 1 % dampening on the diagonal; groups take their scale and
zero point when the quantizer reaches their first column (the error already pushed into them included).

Act-order (`act_order=True`, GPTQ's "desc_act"): the columns are taken in order of decreasing Hessian
diagonal, the inputs with the most energy first, while many columns remain to absorb their error. Groups
are then runs of that order: a kernel reads each input channel's group from an index (vLLM's g_idx, 4 bytes
per input channel of each linear, about 1 % of a 4-bit checkpoint here; the page's byte counts leave it out).
"""
from __future__ import annotations

import torch

from engine.weight_quant.grid import Grid, group_params

BLOCK = 128
DAMP = 0.01


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 X^T X / n for calibration inputs x [tokens, in], returned in fp64 for the Cholesky that follows.
    The product runs in x's own precision (fp32: half the time of fp64 on a CPU); its rounding, about 1e-6 of
    an entry, is far below the 1 % dampening added to the diagonal before the factorisation."""
    return (2.0 / x.shape[0]) * (x.T @ x).double()


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, grid: Grid, block: int = BLOCK,
                  damp: float = DAMP, act_order: bool = False) -> torch.Tensor:
    """w [out, in], h [in, in] from `hessian`. Returns the dequantized weights (fp32)."""
    if act_order:
        perm = torch.argsort(torch.diag(h), descending=True, stable=True)
        q = gptq_quantize(w[:, perm], h[perm][:, perm], grid, block, damp)
        return q[:, torch.argsort(perm)].contiguous()
    W = w.float().clone()
    out_f, in_f = W.shape
    g = grid.group_size(in_f)
    H = h.double().clone()
    dead = torch.diag(H) == 0  # an input that is always zero: its weights cannot matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(in_f, dtype=H.dtype)
    # The factorisation in fp64 (H of a few hundred tokens is nearly singular); the column loop in fp32.
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    # The loop walks columns: keep them as contiguous rows (W transposed), and update in place.
    Wt = W.T.contiguous()  # [in, out]
    Qt = torch.empty_like(Wt)
    levels = float(grid.levels)
    scale = zero = None
    for i1 in range(0, in_f, block):
        i2 = min(i1 + block, in_f)
        W1 = Wt[i1:i2].clone()
        Err = torch.empty_like(W1)
        Hb = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % g == 0:  # a new group: its range as it stands now, earlier errors included
                span = W1[i:i + g] if i + g <= i2 - i1 else torch.cat([W1[i:], Wt[i2:col + g]])
                scale, zero = group_params(span.T, grid)
            w = W1[i]
            q = torch.div(w, scale).round_().add_(zero).clamp_(0, levels).sub_(zero).mul_(scale)
            Qt[col] = q
            err = torch.sub(w, q).div_(Hb[i, i])
            W1[i:].addr_(Hb[i, i:], err, alpha=-1)
            Err[i] = err
        Wt[i2:] -= Hinv[i1:i2, i2:].T @ Err
    return Qt.T.contiguous()
