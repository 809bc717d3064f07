"""Our paged decode beside PyTorch's own Triton decode kernel (FlexAttention) and SDPA (CUDA only).

    python bench/paged_decode_flex.py [--lengths 1024,2048,4096,8192,16384,32768] [--out FILE]

Why: `bench/kernels.py` compares the engine's paged decode with SDPA on a contiguous cache, whose
B = 64 decode runs cuDNN's hand-written kernel (NOTES v12). This script adds a second reference
written in Triton by someone else: FlexAttention (`torch.nn.attention.flex_attention`, compiled,
which picks its flex-decoding kernel for one query row), on
  - the same contiguous cache as SDPA (`flex_contiguous`), and
  - a paged cache through PyTorch's `PagedAttention` helper (`flex_paged_P`, pages of P tokens,
    shuffled as in the engine's long-running pool; Flex needs its KV block size to be the page size).
Same shapes and timing as `bench/kernels.py`: B = 64, 9 query heads over 3 KV heads, head dim 64,
bf16, rotating input sets bigger than L2, each call replayed from a CUDA graph (falling back to
plain launches, marked in the JSON, where a compiled call cannot be captured). Every variant's
output is checked against the torch reference before it is timed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels.paged_attention_triton as pa  # noqa: E402
from bench.kernels import (D, DT, HKV, HQ, SCALE, bench, bench_graph, clocks_up, contiguous_sets,  # noqa: E402
                           decode_kv_bytes, make_decode_set, rel, rotating_sets, sdpa_variants)
from bench.results_io import write_results_and_out  # noqa: E402
from kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

B = 64


def timed(fns) -> tuple[float, str]:
    """Median ms per call, graph-replayed when the calls can be captured, else launched plainly."""
    try:
        return bench_graph(fns), "graph"
    except Exception:  # noqa: BLE001 - a compiled call that refuses capture is timed eagerly
        torch.cuda.synchronize()
        return bench(lambda: [f() for f in fns]) / len(fns), "eager"


def flex_paged_sets(L: int, page: int, n_sets: int, gen):
    """n_sets paged caches for PyTorch's PagedAttention: [1, HKV, pages x page, D] K and V, each
    sequence's pages shuffled over the pool, and the converted (physical) block mask."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask

    n_pages = B * L // page
    logical = create_block_mask(lambda b, h, q, kv: kv >= 0, B, None, 1, L, device="cuda",
                                BLOCK_SIZE=(128, page))
    sets = []
    for _ in range(n_sets):
        paged = PagedAttention(n_pages, page, B, device="cuda")
        paged.empty_pages = torch.randperm(n_pages, generator=gen, device="cuda").tolist()
        for b in range(B):
            paged.reserve(torch.tensor([b], device="cuda"), torch.tensor([L], device="cuda"))
        k = torch.randn(1, HKV, n_pages * page, D, device="cuda", dtype=DT, generator=gen)
        v = torch.randn(1, HKV, n_pages * page, D, device="cuda", dtype=DT, generator=gen)
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=DT, generator=gen)
        mask = paged.convert_logical_block_mask(logical)
        sets.append({"q": q, "k": k, "v": v, "mask": mask, "table": paged.page_table[:, : L // page]})
    return sets


def flex_paged_error(s, L: int, page: int, flex) -> float:
    """Relative error of the paged Flex call against SDPA on the same K/V gathered in order."""
    idx = (s["table"][:, :, None] * page + torch.arange(page, device="cuda")).reshape(B, L)
    k = s["k"][0][:, idx].permute(1, 0, 2, 3)  # [B, HKV, L, D]
    v = s["v"][0][:, idx].permute(1, 0, 2, 3)
    ref = F.scaled_dot_product_attention(s["q"].float(), k.float(), v.float(), scale=SCALE, enable_gqa=True)
    out = flex(s["q"], s["k"].expand(B, -1, -1, -1), s["v"].expand(B, -1, -1, -1), block_mask=s["mask"],
               scale=SCALE, enable_gqa=True)
    return rel(out, ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--pages", default="16,128", help="page sizes of the Flex paged caches")
    ap.add_argument("--paged-max-len", type=int, default=8192,
                    help="longest context for the Flex paged caches (PyTorch's block-mask conversion "
                         "allocates tens of GiB beyond 8k at B = 64)")
    ap.add_argument("--autotune", action="store_true",
                    help="also time Flex on the contiguous cache compiled with mode='max-autotune-no-cudagraphs'")
    ap.add_argument("--out", default=str(ROOT / "bench/results/paged_decode_flex_h200.json"))
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    # One compiled callable per length: dynamo's cache is reset between lengths, so eight shapes do
    # not hit its recompile limit and fall back to the unfused (score-materialising) path.
    flex = torch.compile(flex_attention, dynamic=False)
    flex_tuned = torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
    gen = torch.Generator(device="cuda").manual_seed(0)
    clocks_up()
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    rows = []
    for L in [int(x) for x in args.lengths.split(",")]:
        n_sets = rotating_sets(decode_kv_bytes(B, L))
        row: dict = {"B": B, "L": L, "rotating_sets": n_sets}
        torch._dynamo.reset()
        sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
        sets = [make_decode_set(B, L, gen) for _ in range(n_sets)]
        s0 = sets[0]
        if L <= 8192:
            ref = paged_attention_ref(s0["q"].float(), s0["kc"].float(), s0["vc"].float(), s0["tables"], sl, qsl,
                                      1, L, SCALE)
            row["ours_rel_err"] = rel(pa.paged_attention_triton(s0["q"], s0["kc"], s0["vc"], s0["tables"], sl, qsl,
                                                                1, L, SCALE), ref)
        ours = [lambda s=s: pa.paged_attention_triton(s["q"], s["kc"], s["vc"], s["tables"], sl, qsl, 1, L, SCALE)
                for s in sets]
        # Timed twice, around SDPA, so a drift of the machine between columns shows.
        row["ours_ms"], _ = timed(ours)
        del s0
        torch.cuda.empty_cache()

        csets = contiguous_sets(B, L, n_sets, gen)
        sdpa = sdpa_variants(B, expand=False)
        row["sdpa_ms"] = min(timed([lambda c=c, fn=fn: fn(c) for c in csets])[0] for fn in sdpa.values())
        row["ours_again_ms"], _ = timed(ours)
        del ours, sets
        compiled = {"flex_contiguous": flex, **({"flex_tuned": flex_tuned} if args.autotune else {})}
        for key, fn in compiled.items():
            try:
                c = csets[0]
                row[f"{key}_rel_err"] = rel(fn(c[0], c[1], c[2], scale=SCALE, enable_gqa=True),
                                            sdpa["gqa"]((c[0].float(), c[1].float(), c[2].float())))
                row[f"{key}_ms"], row[f"{key}_timing"] = timed(
                    [lambda c=c, fn=fn: fn(c[0], c[1], c[2], scale=SCALE, enable_gqa=True) for c in csets])
            except Exception as exc:  # noqa: BLE001 - record why, keep the other columns
                row[f"{key}_error"] = repr(exc)[:400]
        del csets
        torch.cuda.empty_cache()

        for page in [int(p) for p in args.pages.split(",")] if L <= args.paged_max_len else []:
            key = f"flex_paged_{page}"
            try:
                psets = flex_paged_sets(L, page, n_sets, gen)
                row[f"{key}_rel_err"] = flex_paged_error(psets[0], L, page, flex)
                row[f"{key}_ms"], row[f"{key}_timing"] = timed(
                    [lambda s=s: flex(s["q"], s["k"].expand(B, -1, -1, -1), s["v"].expand(B, -1, -1, -1),
                                      block_mask=s["mask"], scale=SCALE, enable_gqa=True) for s in psets])
                del psets
            except Exception as exc:  # noqa: BLE001
                row[f"{key}_error"] = repr(exc)[:400]
            torch.cuda.empty_cache()
        rows.append(row)
        # Written after every length, so a run cut short by the device's time limit keeps its rows.
        data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
        write_results_and_out(args.out, data)
        cols = [k for k in row if k.endswith("_ms")]
        print(f"L={L:>6} " + "  ".join(f"{k[:-3]} {row[k] * 1e3:7.1f} us ({row['sdpa_ms'] / row[k]:.2f}x SDPA)"
                                       for k in cols), flush=True)

    print("\n| L | SDPA (us) | ours, 16-token pages | ours, again | Flex, contiguous | Flex, contiguous, max-autotune | " +
          " | ".join(f"Flex, {p}-token pages" for p in args.pages.split(",")) + " |")
    for row in rows:
        cells = [f"{row['sdpa_ms'] * 1e3:.1f}"]
        for k in ["ours_ms", "ours_again_ms", "flex_contiguous_ms", "flex_tuned_ms"] + [f"flex_paged_{p}_ms" for p in args.pages.split(",")]:
            cells.append(f"{row[k] * 1e3:.1f} ({row['sdpa_ms'] / row[k]:.2f}x)" if k in row else "-")
        print(f"| {row['L']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
