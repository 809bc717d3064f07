"""Where should a decode step's projections leave our Triton GEMV for cuBLAS? (GPU)

The GEMV (kernels/gemv_triton.py) holds a program's weight slab in registers and multiplies every row
against it; cuBLAS tiles M. This times the non-attention part of 30 decoder layers (bench/pdl_chain.py's
`decoder_chain`: RMSNorm + residual, QKV, O, RMSNorm + residual, gate_up, SiLU-mul, down) replayed from a
CUDA graph as the engine's decode step is, at M = 1 to 32 rows, with cuBLAS projections and with the GEMV
(PDL on, as in the engine's graphs). The GEMV is timed past the engine's MAX_M too, to show where the two
cross.

`python3 bench/small_m_chain.py --out bench/results/small_m_chain_<gpu>.json`
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.pdl_chain import LAYERS, decoder_chain, graph_time_us, random_layers  # noqa: E402
from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
import kernels.gemv_triton as gemv_module  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen) * 0.05

    layers = random_layers(rand)
    name = torch.cuda.get_device_name()
    print(f"{name}: 30 layers' norms and projections, one CUDA graph, us per replay")
    engine_max_m = gemv_module.MAX_M
    gemv_module.MAX_M = max(ROWS)  # time the GEMV beyond what the engine gives it
    print(f"{'rows':>5} {'cuBLAS':>9} {'GEMV+PDL':>9} {'GEMV/cuBLAS':>12}")
    rows = []
    for m in ROWS:
        h0, r0 = rand(m, 576), rand(m, 576)
        row = {"rows": m, "cublas_us": graph_time_us(lambda: decoder_chain(layers, h0, r0, "cublas"))}
        row["gemv_pdl_us"] = g = graph_time_us(lambda: decoder_chain(layers, h0, r0, "gemv+pdl"))
        ref = decoder_chain(layers, h0, r0, "cublas").float()
        row["rel_err"] = float((decoder_chain(layers, h0, r0, "gemv+pdl").float() - ref).abs().max() / ref.abs().max())
        print(f"{m:>5} {row['cublas_us']:>9.1f} {g:>9.1f} {g / row['cublas_us']:>11.2f}x", flush=True)
        rows.append(row)
    out = args.out or default_results_path("small_m_chain", name)
    write_results_and_out(out, {"device": name, "dtype": "bfloat16", "layers": LAYERS, "rows": rows,
                                "engine_max_m": engine_max_m,
                                "command": "python3 " + " ".join(sys.argv)})


if __name__ == "__main__":
    main()
