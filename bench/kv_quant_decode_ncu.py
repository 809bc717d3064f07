"""One launch of each decode kernel at B = 64, L = 8k, for Nsight Compute (CUDA only; no timing):

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section InstructionStats \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \\
        -k regex:"quant_decode_partial|paged_attn_partial" -c 5 python3 bench/kv_quant_decode_ncu.py

The engine's BF16 kernel first, then the fused kernel on BF16, FP8, INT8 and INT4 pools: five launches, the
five ncu profiles (results/kv_quant_decode_ncu_h200.txt). Each kernel compiles on its first call, outside what
ncu measures.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kernels.paged_attention_triton as pa  # noqa: E402
from kernels.paged_decode_quant_triton import paged_decode_quant_triton  # noqa: E402
from kernels.quant_decode_timing import D, _decode_set  # noqa: E402
from kernels.quant_kv_pool import KERNEL_FORMATS, quantize_pool  # noqa: E402

B, L = 64, 8192


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    s = _decode_set(B, L, gen)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    starts = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], lens, starts, 1, L, D ** -0.5)
    for fmt in KERNEL_FORMATS:
        pool = quantize_pool(s["kc"], s["vc"], fmt)
        paged_decode_quant_triton(s["q"], pool, s["tables"], lens, L, D ** -0.5)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
