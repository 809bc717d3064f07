"""Split count x tile height x warps for the fused low-bit decode kernel at B = 64 (CUDA only; a probe, run once):
    python3 bench/kv_quant_decode_splits_probe.py   (writes $OUT/kv_quant_decode_splits_h200.json)
"""
import sys, itertools, json, os
sys.path.insert(0, ".")
import torch
from kernels.paged_decode_quant_triton import paged_decode_quant_triton
from kernels.quant_decode_timing import D, _format_sets, graph_time_us
gen = torch.Generator(device="cuda").manual_seed(0)
out = []
for (B, L), fmt in itertools.product([(64, 2048), (64, 8192)], ["bf16", "fp8", "int4"]):
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    sets = _format_sets(fmt, B, L, gen)
    res = {}
    for sp, bn, w in itertools.product((1, 2, 3, 4, 6, 8), (128, 256), (4, 8)):
        try:
            res[(sp, bn, w)] = graph_time_us([lambda s=s: paged_decode_quant_triton(s["q"], s["pool"], s["tables"], lens, L, D ** -0.5, splits=sp, block_n=bn, num_warps=w) for s in sets], reps=50)
        except Exception:  # a launch that does not fit (shared memory) is a result too
            res[(sp, bn, w)] = float("nan")
    best = sorted((v, k) for k, v in res.items() if v == v)[:5]
    print(B, L, fmt, [(round(v, 1), k) for v, k in best], flush=True)
    out.append({"B": B, "L": L, "fmt": fmt, "runs": [dict(splits=k[0], block_n=k[1], warps=k[2], us=v) for k, v in res.items()]})
    del sets
json.dump(out, open(os.environ["OUT"] + "/kv_quant_decode_splits_h200.json", "w"), indent=1)
