"""Registers per thread (Triton's maxnreg) x stages x splits for the fused low-bit decode kernel at B = 64, L = 8k
(CUDA only; a probe): Nsight Compute found it issue-bound at 3 programs per SM, limited by its 145 registers.

    python3 bench/kv_quant_decode_regs_probe.py   (writes $OUT/kv_quant_decode_regs_h200.json)
"""
import itertools
import json
import os
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402

from kernels.paged_decode_quant_triton import paged_decode_quant_triton  # noqa: E402
from kernels.quant_decode_timing import D, _format_sets, graph_time_us  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(0)
out = []
for (B, L), fmt in itertools.product([(64, 8192), (64, 2048)], ["fp8", "int8", "int4"]):
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    sets = _format_sets(fmt, B, L, gen)
    res = {}
    for regs, stages, sp, warps in itertools.product((None, 128, 96, 80), (2, 3), (2, 4), (4, 8)):
        try:
            res[(regs, stages, sp, warps)] = graph_time_us([lambda s=s: paged_decode_quant_triton(
                s["q"], s["pool"], s["tables"], lens, L, D ** -0.5, splits=sp, num_stages=stages, maxnreg=regs,
                num_warps=warps) for s in sets], reps=50)
        except Exception:  # a launch that does not fit is a result too
            res[(regs, stages, sp, warps)] = float("nan")
    best = sorted((v, k) for k, v in res.items() if v == v)[:5]
    base = res[(None, 3, 2, 4)]
    print(B, L, fmt, f"default {base:.1f}", [(round(v, 1), k) for v, k in best], flush=True)
    out.append({"B": B, "L": L, "fmt": fmt, "runs": [dict(maxnreg=k[0], stages=k[1], splits=k[2], warps=k[3], us=v)
                                                     for k, v in res.items()]})
    del sets
json.dump(out, open(os.environ["OUT"] + "/kv_quant_decode_regs_h200.json", "w"), indent=1)
