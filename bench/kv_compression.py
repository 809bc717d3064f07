"""KV cache compression on the real model (engine/kv_compression): what each storage format and each eviction
policy costs in quality for the bytes it saves.

Three prompts, greedy: a retrieval question over a ~300-token note (the answer, the code "4718", sits in
its first sentence), a summary of a ~200-token paragraph, and a short open-ended story. Per prompt the lab
(engine.kv_compression.KVLab) runs, against the full-precision reference (fp32 on the CPU, bf16 on a GPU):
(a) every format in FORMATS except the reference's, nothing evicted;
(b) eviction (sliding window, StreamingLLM sinks, H2O) at budgets 32, 64 and 128 tokens, in the
    reference's format (so only the eviction costs anything).
The lab takes at most 6 variants per run, so each prompt takes a few runs; every run recomputes the
reference, and the script checks that its greedy tokens are the same each time.

Per variant: bytes per held token (the cache's real tensors, scales and KIVI's fp16 residual included),
x smaller = a full bf16 cache of the same sequence / the variant's cache at the end (eviction counts),
top-1 agreement and mean KL(reference || variant) over positions 1.. (teacher-forced on the reference's
tokens), perplexity of the reference's tokens, the first position where its own greedy text differs,
attention ms per decode step (torch path: dequantize then attend, all 30 layers; the bytes are a fused
kernel's, the time is not), and for the retrieval prompt whether its own text contains "4718".

    OMP_NUM_THREADS=2 python3 bench/kv_compression.py              # CPU, real model, ~2 min
    python3 bench/kv_compression.py --device cuda                  # GPU: bf16 reference
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import engine_results_path, write_results  # noqa: E402
from engine.kv_compression import FORMATS, EvictionPolicy, KVLab, LabResult, Variant  # noqa: E402
from engine.kv_compression.lab import MAX_VARIANTS  # noqa: E402
from engine.kv_compression.prompts import RETRIEVAL_ANSWER, RETRIEVAL_NOTE  # noqa: E402
from engine.weights import load_weights  # noqa: E402

SUMMARY_PARAGRAPH = (
    "Summarize the following paragraph in two sentences.\n\n"
    "The old stone bridge over the river was built in 1743 by the town's guild of masons, who paid for it with a "
    "toll on every cart that crossed. For almost two centuries it was the only way across the water for thirty "
    "miles, and the market on its eastern end grew into the busiest in the county. In 1911 a flood washed away "
    "two of its five arches, and for three years the town relied on a ferry that could carry only six carts at a "
    "time. Merchants moved their stalls to the western bank, and the eastern market never fully recovered. When "
    "the bridge was rebuilt, the engineers widened it for motor cars and added iron railings, but they kept the "
    "original stones of the three surviving arches. Today the bridge carries a footpath and a cycle lane, the "
    "toll house is a small museum, and every summer the town holds a fair on the bridge to remember the masons "
    "who built it.")

STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."

PROMPTS = {"retrieval": RETRIEVAL_NOTE, "summary": SUMMARY_PARAGRAPH, "story": STORY}
POLICIES = ("window", "sinks", "h2o")


def _chunks(items: list, size: int) -> list[list]:
    """`items` in as few runs of at most `size` as possible, the runs as even as possible."""
    runs = max(1, math.ceil(len(items) / size))
    per = math.ceil(len(items) / runs)
    return [items[i:i + per] for i in range(0, len(items), per)]


def variant_row(prompt: str, result: LabResult, r, cfg, decode) -> dict:  # noqa: ANN001 (VariantResult, tokenizer)
    ref = result.reference_tokens
    full_tokens = int(result.variants[0].cached_tokens[-1])  # what a full cache holds at the end
    held = int(r.cached_tokens[-1])
    text = decode(list(r.free_tokens))
    policy = r.variant.policy
    return {
        "prompt": prompt, "variant": r.variant.label, "reference": r.is_reference, "format": r.variant.format,
        "policy": policy.kind, "budget": policy.budget if policy.kind != "none" else None,
        "sinks": policy.sinks if policy.kind == "sinks" else None,
        "bytes_per_token": round(r.bytes_per_token, 2),
        "formula_bytes_per_token": r.variant.kv_format.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim),
        "tokens_held": held, "full_tokens": full_tokens, "evicted": bool(np.any(r.cached_tokens < np.arange(
            result.prompt_len, result.prompt_len + len(r.cached_tokens)))),
        "cache_bytes": int(r.cache_bytes[-1]),
        "x_smaller_than_bf16": round(result.times_smaller(r), 3),
        "top1_agreement": round(r.top1_agreement, 4), "mean_kl": round(r.mean_kl, 5),
        "perplexity": round(r.perplexity, 4), "first_divergence": r.first_divergence(ref),
        "attention_ms_per_step": round(1e3 * r.attention_seconds, 3),
        "answer_found": (RETRIEVAL_ANSWER in text) if prompt == "retrieval" else None,
        "free_text": text,
    }


def print_table(rows: list[dict]) -> None:
    print(f"  {'variant':<58}{'B/token':>9}{'held':>6}{'x<bf16':>8}{'top-1':>7}{'KL':>9}{'ppl':>8}{'1st div':>8}"
          f"{'attn ms':>8}{'4718?':>7}")
    for r in rows:
        div = "-" if r["first_divergence"] is None else str(r["first_divergence"])
        ans = "" if r["answer_found"] is None else ("yes" if r["answer_found"] else "no")
        name = ("ref: " if r["reference"] else "") + r["variant"]
        print(f"  {name[:57]:<58}{r['bytes_per_token']:>9.0f}{r['tokens_held']:>6}{r['x_smaller_than_bf16']:>8.2f}"
              f"{r['top1_agreement']:>7.3f}{r['mean_kl']:>9.4f}{r['perplexity']:>8.3f}{div:>8}"
              f"{r['attention_ms_per_step']:>8.2f}{ans:>7}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--weights", default="real", choices=["real", "random"])
    ap.add_argument("--tokens", type=int, default=48, help="tokens to generate per prompt (greedy)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128], help="eviction budgets (tokens per head)")
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    gpu = args.device == "cuda"
    torch.manual_seed(0)
    weights = load_weights(args.weights, device="cpu")
    cfg, tok = weights.config, weights.tokenizer
    lab = KVLab(weights, device=args.device, dtype=torch.bfloat16 if gpu else torch.float32)
    ref_format = lab.reference.format
    formats = [Variant(name) for name in FORMATS if name != ref_format]
    evictions = [Variant(ref_format, EvictionPolicy(kind, budget)) for budget in args.budgets for kind in POLICIES]
    runs = [*_chunks(formats, MAX_VARIANTS), *_chunks(evictions, MAX_VARIANTS)]

    t_all = time.perf_counter()
    lab.run(tok.apply_chat_template([{"role": "user", "content": STORY}]), [Variant("int8")], 4)  # warm-up, untimed
    rows, prompts = [], []
    for name in args.prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[name]}])
        reference, wall = None, 0.0
        prompt_rows = []
        for run_variants in runs:
            t0 = time.perf_counter()
            result = lab.run(ids, run_variants, args.tokens)
            wall += time.perf_counter() - t0
            if reference is None:
                reference = result.reference_tokens
                prompt_rows.append(variant_row(name, result, result.variants[0], cfg, tok.decode))
            elif result.reference_tokens != reference:
                raise SystemExit(f"{name}: the reference's greedy tokens changed between runs")
            prompt_rows += [variant_row(name, result, r, cfg, tok.decode) for r in result.variants[1:]]
        ref_text = tok.decode(list(reference))
        prompts.append({"name": name, "prompt_tokens": len(ids), "generated_tokens": len(reference),
                        "lab_runs": len(runs), "wall_seconds": round(wall, 2), "reference_text": ref_text,
                        "text": PROMPTS[name]})
        print(f"\n{name}: {len(ids)} prompt tokens, {len(reference)} generated, {len(runs)} lab runs, {wall:.1f} s")
        print(f"  reference: {ref_text[:160]!r}")
        print_table(prompt_rows)
        rows += prompt_rows

    # Over the prompts: mean of each measure per variant (the reference's row included).
    summary = {}
    for label in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == label]
        answers = [r["answer_found"] for r in rs if r["answer_found"] is not None]
        summary[label] = {
            "bytes_per_token": round(float(np.mean([r["bytes_per_token"] for r in rs])), 1),
            "x_smaller_than_bf16": round(float(np.mean([r["x_smaller_than_bf16"] for r in rs])), 3),
            "top1_agreement": round(float(np.mean([r["top1_agreement"] for r in rs])), 4),
            "mean_kl": round(float(np.mean([r["mean_kl"] for r in rs])), 5),
            "perplexity": round(float(np.exp(np.mean([np.log(r["perplexity"]) for r in rs]))), 4),
            "never_diverged": sum(r["first_divergence"] is None for r in rs),
            "attention_ms_per_step": round(float(np.mean([r["attention_ms_per_step"] for r in rs])), 3),
            "answer_found": answers[0] if answers else None,
        }
    print(f"\nmean over {len(args.prompts)} prompts ({', '.join(args.prompts)}); perplexity: geometric mean; "
          "same = prompts whose own text never left the reference's")
    print(f"  {'variant':<58}{'B/token':>9}{'x<bf16':>8}{'top-1':>7}{'KL':>9}{'ppl':>8}{'same':>6}{'attn ms':>8}"
          f"{'4718?':>7}")
    for label, s in summary.items():
        ans = "" if s["answer_found"] is None else ("yes" if s["answer_found"] else "no")
        print(f"  {label[:57]:<58}{s['bytes_per_token']:>9.0f}{s['x_smaller_than_bf16']:>8.2f}{s['top1_agreement']:>7.3f}"
              f"{s['mean_kl']:>9.4f}{s['perplexity']:>8.3f}{s['never_diverged']:>6}{s['attention_ms_per_step']:>8.2f}"
              f"{ans:>7}")
    total = time.perf_counter() - t_all
    print(f"\ntotal {total:.1f} s")

    device = torch.cuda.get_device_name() if gpu else "cpu"
    write_results(args.out or engine_results_path("kv_compression", gpu), {
        "device": device, "threads": torch.get_num_threads(), "weights": args.weights, "args": vars(args),
        "reference_format": ref_format, "model": cfg.name,
        "prompts": prompts, "rows": rows, "summary": summary, "total_seconds": round(total, 1),
        "note": ("KVLab: the prompt prefilled once at full precision, its KV then stored in each variant's format and "
                 "evicted to its budget; every generated token reads only the variant's own cache. top1/KL/perplexity: "
                 "teacher-forced on the reference's greedy tokens, positions 1.. (0 is the shared prefill's token); "
                 "first_divergence/free_text/answer_found: the variant's own greedy text. bytes_per_token: the "
                 "cache's real tensors at the end over the tokens it holds (scales; KIVI's fp16 residual keys as "
                 "they are); x_smaller_than_bf16: a full bf16 cache of the final length over the variant's cache. "
                 "attention_ms_per_step: torch dequantize-then-attend, all layers, mean per decode step of the "
                 "teacher-forced row (rows share each forward pass). Budgets at or above a prompt's full length "
                 "evict nothing (evicted: false)."),
    })


if __name__ == "__main__":
    main()
