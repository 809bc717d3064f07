"""Merged checkpoint vs unmerged LoRA adapter: decode step time at several batch sizes and ranks, timed as the
merge page (pages/16_lora_merge.py) times it.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/lora_merge.py                      # CPU: real weights, fp32
    python3 bench/lora_merge.py --device cuda --weights random                     # GPU: bf16, Triton, CUDA graphs

For each rank r (8, 16, 64): a random adapter on all seven linears of every layer (the page's "random rank-r"
adapter), merged into a copy of the weights; the page's two engines (`engine.lora.merge_lab`): the merged
checkpoint on a plain engine, and the base weights with the adapter in a LoRA slot (max_lora_rank = r). Both
first answer the page's default prompt (greedy, 16 tokens: the same tokens?), then for each batch size B
(1, 8, 32, 128) decode B copies of the prompt together, one step of each engine in turn so both see the same
load; `--warmup` steps, then the median of `--timed` full-batch decode steps. On the CPU (and on a GPU with
`--no-graphs`) the engine's kernel timer also gives the LoRA kernels' share of the step; with CUDA graphs a
decode step is one replay and only its wall time is known.

Prints a table and writes JSON to --out (default bench/results/lora_merge_<device>.json, and to $OUT/ when $OUT
is set).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.results_io import write_results_and_out  # noqa: E402
from engine.kv_compression.lab import first_difference  # noqa: E402
from engine.lora.merge import merged_state_dict  # noqa: E402
from engine.lora.anatomy import footprint  # noqa: E402
from engine.lora.merge_lab import (DEFAULT_PROMPT, RANDOM, answer,  # noqa: E402
                                   merged_and_lora_engines, resolve_adapter, time_decode)
from engine.model import release_prepared  # noqa: E402
from engine.weights import LoadedWeights, load_weights  # noqa: E402

RANKS = (8, 16, 64)
BATCHES = (1, 8, 32, 128)
ANSWER_TOKENS = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--weights", default=None, choices=("real", "random"),
                    help="default: real on the CPU, random on a GPU (no GGUF there)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: OMP_NUM_THREADS)")
    ap.add_argument("--no-graphs", action="store_true", help="on a GPU: eager steps, kernels profiled")
    ap.add_argument("--lora-launches", default="two", choices=("two", "one", "one-no-pdl"),
                    help="two: shrink and expand, what the engine runs; one: the one-launch LoRA kernel "
                         "(kernels/lora_triton.py) at decode batches up to 16 rows; one-no-pdl: that kernel outside "
                         "PDL chains; for A/Bs of those paths")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.lora_launches != "two":
        import kernels.lora_triton as lora_triton
        lora_triton.FUSED_MAX_T = 16  # `use_fused` reads it at every call; 16 rows: the batches the A/B ran it at
        lora_triton.FUSED_PDL = args.lora_launches == "one"
    cuda = args.device == "cuda"
    mode = args.weights or ("random" if cuda else "real")
    dtype = "bfloat16" if cuda else "float32"
    graphs = cuda and not args.no_graphs
    ranks = tuple(int(r) for r in args.ranks.split(","))
    batches = tuple(int(b) for b in args.batches.split(","))
    weights = load_weights(mode, device=args.device, dtype=getattr(torch, dtype))
    prompt_ids = weights.tokenizer.chat_prompt_ids(DEFAULT_PROMPT)
    max_len = len(prompt_ids) + max(ANSWER_TOKENS, args.warmup + 2 * args.timed + 2)
    device_name = torch.cuda.get_device_name(0) if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(f"{device_name}, {mode} weights, {dtype}, CUDA graphs {'on' if graphs else 'off'}; prompt "
          f"{len(prompt_ids)} tokens; {args.warmup} warm-up + {args.timed} timed steps", flush=True)
    rows, t_start = [], time.perf_counter()
    for r in ranks:
        adapter = resolve_adapter(weights.config, RANDOM, r)  # the page's random rank-r adapter
        merged = LoadedWeights(weights.config, merged_state_dict(weights.state_dict, adapter),
                               f"{weights.source} + {adapter.name}", weights.tokenizer)
        m_engine, u_engine = merged_and_lora_engines(weights, merged, adapter, args.device, dtype, max(batches),
                                                     max_len, cuda_graphs=graphs)
        _, m_ans, u_ans = answer(m_engine, u_engine, adapter.name, prompt_ids, ANSWER_TOKENS)
        diff = first_difference(u_ans.token_ids, m_ans.token_ids)
        fp = footprint(weights, adapter)
        for b in batches:
            m, u = time_decode(m_engine, u_engine, adapter.name, prompt_ids, b, args.warmup, args.timed)
            lora = u.seconds_of("lora.") if u.kernels else None
            linear_flops = sum(f for n, (_, f, _) in u.kernels.items() if n.startswith("linear.") or n == "lm_head")
            row = {"rank": r, "batch": b, "merged_ms": m.median * 1e3, "unmerged_ms": u.median * 1e3,
                   "extra": u.median / m.median - 1, "lora_ms": None if lora is None else lora * 1e3,
                   "lora_share": None if lora is None else lora / u.median,
                   "lora_flops_vs_linears": (u.flops_of("lora.") / linear_flops) if linear_flops else None,
                   "merged_steps_ms": [s * 1e3 for s in m.step_seconds],
                   "unmerged_steps_ms": [s * 1e3 for s in u.step_seconds],
                   "same_tokens": diff is None, "first_difference": diff,
                   "adapter_mb": fp.adapter_bytes / 1e6, "extra_flops_share": fp.extra_flops_share}
            rows.append(row)
            print(f"r={r:3d} B={b:4d}: merged {row['merged_ms']:8.2f} ms  unmerged {row['unmerged_ms']:8.2f} ms  "
                  f"{row['extra']:+7.1%}" + ("" if lora is None else f"  lora {row['lora_ms']:7.2f} ms "
                                             f"({row['lora_share']:.0%} of the step)")
                  + f"  ({time.perf_counter() - t_start:.0f} s)", flush=True)
        del m_engine, u_engine
        release_prepared(merged.state_dict)
        del merged
    print()
    print("| rank | batch | merged ms | unmerged ms | extra | LoRA kernels ms | LoRA share | LoRA FLOPs / linears "
          "| same tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        lora = "—" if row["lora_ms"] is None else f"{row['lora_ms']:.2f}"
        share = "—" if row["lora_share"] is None else f"{row['lora_share']:.0%}"
        fl = "—" if row["lora_flops_vs_linears"] is None else f"{row['lora_flops_vs_linears']:.1%}"
        same = "yes" if row["same_tokens"] else f"no (token {row['first_difference'] + 1})"
        print(f"| {row['rank']} | {row['batch']} | {row['merged_ms']:.2f} | {row['unmerged_ms']:.2f} | "
              f"{row['extra']:+.1%} | {lora} | {share} | {fl} | {same} |")
    data = {"device": args.device, "device_name": device_name, "weights": mode, "dtype": dtype, "cuda_graphs": graphs,
            "threads": torch.get_num_threads(), "prompt": DEFAULT_PROMPT, "prompt_tokens": len(prompt_ids),
            "warmup": args.warmup, "timed": args.timed, "answer_tokens": ANSWER_TOKENS, "lora_launches": args.lora_launches,
            "seconds": time.perf_counter() - t_start, "rows": rows}
    out = args.out or str(ROOT / "bench" / "results" / f"lora_merge_{args.device}.json")
    write_results_and_out(out, data)


if __name__ == "__main__":
    main()
