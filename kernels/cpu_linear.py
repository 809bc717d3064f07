"""x @ w.T on the CPU through oneDNN, with the weights packed once in oneDNN's blocked layout.

torch's `F.linear` goes to MKL's sgemm, which is slow at this model's decode shapes on a small CPU.
On the 2-core CI machine, 16 rows through the fused gate/up weight [3072, 576] took 0.92 ms with
`F.linear`, 0.63 ms through oneDNN's inner product on the plain weight and 0.42 ms on the packed
weight; the LM head [49152, 576] took 20.2, 9.6 and 6.3 ms. Packed is the fastest of the three at
every shape and row count measured, 1 to 512 (`bench/cpu_linear.py`, weights streamed from memory
as in a forward pass). The op is the one torch's own compiler emits for CPU linears
(`mkldnn::_linear_pointwise`), and the packed weight is what its weight-freezing pass builds.

The sums run in a different order than MKL's, so results differ from `F.linear` in the last bits
(about 1e-6 relative); greedy tokens still match Hugging Face's (tests/test_engine_exactness.py).
Where torch was built without oneDNN, weights stay dense and `F.linear` is used.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows the packed layout is tuned for: a decode batch. Measured at 1 to 512 rows, packing for 16 or
# for 64 made no difference beyond noise; both beat the plain weight at every row count.
_PACK_ROWS = 16
_DTYPES = (torch.float32, torch.bfloat16)


def _onednn_linear_works() -> bool:
    try:
        x, w = torch.ones(2, 4), torch.ones(3, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS)
        return bool(torch.equal(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), F.linear(x, w)))
    except (AttributeError, RuntimeError):
        return False


ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and _onednn_linear_works()


def pack_linear_weight(w: torch.Tensor) -> torch.Tensor:
    """A copy of w [N, K] in oneDNN's blocked layout for `cpu_linear` (an opaque mkldnn tensor with
    w's shape), or w itself where oneDNN is unavailable or w is not a CPU fp32/bf16 matrix."""
    if not ONEDNN_LINEAR or w.device.type != "cpu" or w.dtype not in _DTYPES or w.dim() != 2:
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), _PACK_ROWS)


def cpu_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K].T -> [M, N] for CPU tensors; w plain or from `pack_linear_weight`."""
    if w.is_mkldnn or (ONEDNN_LINEAR and x.dtype == w.dtype and x.dtype in _DTYPES):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, None, "none", [], "")
    return F.linear(x, w)
