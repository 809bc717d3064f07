"""Multi-LoRA kernels (`kernels/lora_triton.py`) vs the base linear at SmolLM2-135M's real shapes (CUDA, bf16).

    python3 bench/lora_kernels.py [--out PATH] [--quick] [--pdl] [--dry-run] [--sweep]

For each fused projection group of one layer (qkv 576->960, o 576->576, gate_up 576->3072,
down 1536->576), T in {1, 8, 64, 256, 2048} rows, per-adapter rank r in {8, 16, 64} (stacked rank
R = r * targets in the group: qkv 3r, gate_up 2r, o and down r) and {1, 4, 16} distinct adapters in
the batch (rows assigned round-robin, so every adapter's rows interleave with the others'):
  - base: F.linear(x, W) (cuBLAS), per (group, T);
  - lora: lora_apply_triton(y, x, A, B, slots) (the path its shape rule picks: one launch at decode
    batches, shrink + expand otherwise), with `--pdl` also with PDL; at T <= 64 both paths forced
    (`fused_us`, `two_kernel_us`), which is how the rule's threshold was picked;
  - achieved bandwidth from `kernels.lora_ref.lora_cost` (each used adapter's A and B once, the
    rows' x read and y read + written; the fp32 scratch V is not counted).
Timing: each measurement is a CUDA graph of LAYERS calls, each with its own weights (as the 30
layers of a decode step: L2 holds what it would hold there), replayed; the number is the mean per
call. Before timing, every group is checked against the torch reference (max error relative to
|ref| + |update|, share of bit-identical elements).
Prints a table and writes JSON to --out (default bench/results/lora_kernels_<device>.json, and to
$OUT/ when $OUT is set). `--dry-run` lists the cases and exits (works without CUDA). `--sweep`
instead times a few representative cases with each field of `lora_config`'s choice varied alone
(writes lora_kernels_sweep_<device>.json): how the tile heuristics were picked.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
from kernels.lora_ref import lora_apply_ref, lora_cost  # noqa: E402

# (K, N, targets stacked in R)
GROUPS = {"qkv": (576, 960, 3), "o": (576, 576, 1), "gate_up": (576, 3072, 2), "down": (1536, 576, 1)}
TS = (1, 8, 64, 256, 2048)
RANKS = (8, 16, 64)
ADAPTERS = (1, 4, 16)
LAYERS = 30
DT = torch.bfloat16
TARGET_MS = 25.0  # timed replays per measurement: about this much GPU time


def build_cases(quick: bool = False) -> list[dict]:
    ts, ranks, adapters = ((1, 64, 2048), (16,), (1, 16)) if quick else (TS, RANKS, ADAPTERS)
    return [{"group": g, "K": GROUPS[g][0], "N": GROUPS[g][1], "r": r, "R": r * GROUPS[g][2], "T": t, "adapters": a}
            for g, r, t, a in itertools.product(GROUPS, ranks, ts, adapters)]


def round_robin_slots(t: int, adapters: int) -> torch.Tensor:
    return (torch.arange(t, device="cuda") % adapters).to(torch.int32)


def graph_time_us(fn) -> float:
    """Mean GPU time of one replay of a CUDA graph of `fn` (warmed up outside and inside the graph)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        g.replay()
    a.record()
    for _ in range(3):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    reps = max(5, min(500, int(TARGET_MS / max(a.elapsed_time(b) / 3, 1e-3))))
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    del g
    return a.elapsed_time(b) * 1000 / reps


def lora_weights(c: dict, gen, copies: int):
    s, r, k, n = c["adapters"], c["R"], c["K"], c["N"]
    return [(torch.randn(s, r, k, device="cuda", generator=gen).mul_(k ** -0.5).to(DT),
             torch.randn(s, n, r, device="cuda", generator=gen).mul_(0.1 * r ** -0.5).to(DT)) for _ in range(copies)]


def correctness(gen) -> list[dict]:
    from kernels.lora_triton import lora_apply_triton

    rows = []
    for g, (k, n, targets) in GROUPS.items():
        for t in (1, 256, 2048):
            c = {"K": k, "N": n, "R": 64 * targets, "adapters": 16}
            (A, B), = lora_weights(c, gen, 1)
            x = torch.randn(t, k, device="cuda", generator=gen).to(DT)
            y0 = torch.randn(t, n, device="cuda", generator=gen).to(DT)
            slots = round_robin_slots(t, 16)
            slots[1::5] = -1
            out = lora_apply_triton(y0.clone(), x, A, B, slots)
            ref = lora_apply_ref(y0.clone(), x, A, B, slots)
            o, rf, y = out.double(), ref.double(), y0.double()
            err = float(((o - rf).abs() / (rf.abs() + (rf - y).abs() + 1e-30)).max())
            skip = slots < 0
            rows.append({"group": g, "T": t, "R": c["R"], "max_rel_err": err,
                         "identical_frac": float((out.view(torch.int16) == ref.view(torch.int16)).float().mean()),
                         "skipped_rows_untouched": bool(torch.equal(out[skip], y0[skip]))})
            print(f"check {g:8s} T={t:5d} R={c['R']:3d}: max rel err {err:.2e}, "
                  f"{100 * rows[-1]['identical_frac']:.2f} % bit-identical, "
                  f"skipped rows untouched: {rows[-1]['skipped_rows_untouched']}", flush=True)
    return rows


def base_times(ts, gen) -> dict[tuple[str, int], float]:
    out = {}
    for g, (k, n, _) in GROUPS.items():
        ws = [torch.randn(n, k, device="cuda", generator=gen).mul_(k ** -0.5).to(DT) for _ in range(LAYERS)]
        for t in ts:
            x = torch.randn(t, k, device="cuda", generator=gen).to(DT)
            out[(g, t)] = graph_time_us(lambda: [F.linear(x, w) for w in ws]) / LAYERS
    return out


def lora_times(cases, gen, pdl_too: bool) -> list[dict]:
    from kernels.lora_triton import FUSED_MAX_R, lora_apply_triton, lora_config, use_fused

    rows = []
    key = None
    for c in cases:
        if (c["group"], c["r"], c["adapters"]) != key:  # new weights per (group, rank, adapters)
            key = (c["group"], c["r"], c["adapters"])
            weights = lora_weights(c, gen, LAYERS)
        t, k, n = c["T"], c["K"], c["N"]
        x = torch.randn(t, k, device="cuda", generator=gen).to(DT)
        y = torch.randn(t, n, device="cuda", generator=gen).to(DT)
        slots = round_robin_slots(t, c["adapters"])
        row = dict(c)
        for pdl in (False, True) if pdl_too else (False,):
            us = graph_time_us(lambda: [lora_apply_triton(y, x, A, B, slots, pdl=pdl) for A, B in weights]) / LAYERS
            row["lora_pdl_us" if pdl else "lora_us"] = us
        row["path"] = "one launch" if use_fused(t, c["R"]) else "two launches"
        if t <= 64 and c["R"] <= FUSED_MAX_R:  # both paths where both may run: where the shape rule should switch
            for fused in (False, True):
                row["fused_us" if fused else "two_kernel_us"] = graph_time_us(
                    lambda: [lora_apply_triton(y, x, A, B, slots, fused=fused) for A, B in weights]) / LAYERS
        flops, nbytes = lora_cost(t, c["R"], k, n, min(t, c["adapters"]), DT.itemsize)
        row.update(bytes=nbytes, flops=flops, GBps=nbytes / (row["lora_us"] * 1e-6) / 1e9,
                   TFLOPs=flops / (row["lora_us"] * 1e-6) / 1e12, config=vars(lora_config(t, c["R"], k, n)))
        rows.append(row)
    return rows


SWEEP_CASES = [("qkv", 64, 1, 1), ("down", 64, 1, 1), ("qkv", 16, 8, 16), ("gate_up", 64, 64, 16),
               ("qkv", 64, 256, 1), ("qkv", 64, 256, 16), ("o", 16, 256, 4), ("gate_up", 16, 2048, 16),
               ("qkv", 64, 2048, 1)]
SWEEP_FIELDS = {"chunk": (16, 64, 256), "shrink_block_m": (16, 32, 64), "shrink_block_r": (16, 32, 64),
                "shrink_block_k": (64, 128), "k_splits": (1, 2, 4), "expand_block_m": (16, 32, 64),
                "expand_block_n": (32, 64, 128), "expand_block_r": (16, 32, 64), "expand_splits": (1, 4, 16, 64),
                "num_warps": (2, 4, 8)}


def sweep(gen) -> list[dict]:
    """Each sweep case at the default config, then with one field of it changed at a time."""
    import kernels.lora_triton as lt

    default = lt.lora_config
    rows = []
    try:
        for g, r, t, ad in SWEEP_CASES:
            c = {"group": g, "K": GROUPS[g][0], "N": GROUPS[g][1], "r": r, "R": r * GROUPS[g][2], "T": t, "adapters": ad}
            base_cfg = default(t, c["R"], c["K"], c["N"])
            variants = [("default", None)] + [(f"{f}={v}", {f: v}) for f, vals in SWEEP_FIELDS.items()
                                              for v in vals if v != getattr(base_cfg, f)]
            results = []
            for name, over in variants:
                cfg = dataclasses.replace(base_cfg, **(over or {}))
                if cfg.chunk % max(cfg.shrink_block_m, cfg.expand_block_m) or cfg.chunk < min(t, 16):
                    continue
                lt.lora_config = lambda *_a, _cfg=cfg: _cfg
                results.append({"variant": name, "us": lora_times([c], gen, False)[0]["lora_us"]})
                lt.lora_config = default
            d = results[0]["us"]
            best = min(results, key=lambda x: x["us"])
            print(f"{g:8s} r={r:3d} T={t:5d} ad={ad:3d}: default {d:7.2f} us, best {best['us']:7.2f} ({best['variant']}); "
                  + ", ".join(f"{x['variant']} {x['us']:.2f}" for x in results[1:] if x["us"] < 0.95 * d), flush=True)
            rows.append({**c, "default": vars(base_cfg), "results": results})
    finally:
        lt.lora_config = default
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/lora_kernels_<card>.json)")
    ap.add_argument("--quick", action="store_true", help="a few cases only (smoke run)")
    ap.add_argument("--pdl", action="store_true", help="also time the kernels launched with PDL")
    ap.add_argument("--dry-run", action="store_true", help="list the cases and exit (no CUDA needed)")
    ap.add_argument("--sweep", action="store_true", help="only vary lora_config's choices on a few cases")
    args = ap.parse_args()
    cases = build_cases(args.quick)
    if args.dry_run:
        print(f"{len(cases)} LoRA cases x {'2' if args.pdl else '1'} variant(s), "
              f"{len(GROUPS) * len({c['T'] for c in cases})} base-linear cases, {LAYERS} weight sets each")
        for c in cases[:5]:
            print("  ", c)
        return
    if not torch.cuda.is_available():
        sys.exit("bench/lora_kernels.py needs CUDA (run with --dry-run to check the case list on a CPU machine)")

    import triton

    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=DT)  # clocks up from idle
    for _ in range(100):
        a @ a
    torch.cuda.synchronize()
    del a
    if args.sweep:
        rows = sweep(gen)
        write_results_and_out(args.out or default_results_path("lora_kernels_sweep"),
                              {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows})
        return
    checks = correctness(gen)
    ts = sorted({c["T"] for c in cases})
    base = base_times(ts, gen)
    rows = lora_times(cases, gen, args.pdl)
    for row in rows:
        row["base_us"] = base[(row["group"], row["T"])]
        row["lora_over_base"] = row["lora_us"] / row["base_us"]

    print(f"\n{'group':8s} {'r':>3s} {'R':>4s} {'T':>5s} {'ad':>3s} {'base us':>8s} {'lora us':>8s} "
          f"{'ratio':>6s} {'GB/s':>7s} {'TFLOP/s':>8s}" + (f" {'+pdl us':>8s}" if args.pdl else "")
          + f" {'1 launch':>9s} {'2 launches':>10s}")
    for row in rows:
        print(f"{row['group']:8s} {row['r']:3d} {row['R']:4d} {row['T']:5d} {row['adapters']:3d} "
              f"{row['base_us']:8.2f} {row['lora_us']:8.2f} {row['lora_over_base']:6.2f} {row['GBps']:7.0f} "
              f"{row['TFLOPs']:8.2f}" + (f" {row['lora_pdl_us']:8.2f}" if args.pdl else "")
              + (f" {row['fused_us']:9.2f} {row['two_kernel_us']:10.2f}" if "fused_us" in row else ""))
    elapsed = time.time() - t0
    print(f"\n{len(rows)} cases in {elapsed:.0f} s")

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "dtype": "bfloat16", "layers": LAYERS, "timing": "CUDA graph of LAYERS calls, mean per call",
              "elapsed_s": elapsed, "checks": checks, "rows": rows}
    write_results_and_out(args.out or default_results_path("lora_kernels"), result)


if __name__ == "__main__":
    main()
