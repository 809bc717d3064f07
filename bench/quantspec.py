"""Self-speculation with a quantized KV cache (QuantSpec) on the real model: every draft-cache format at several
draft lengths γ, the text checked against the target alone, acceptance and tokens per target pass measured, and
the modeled speed-up at 4k / 32k / 128k tokens of context (bytes a step reads; app/analysis/quantspec.py).

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/quantspec.py      # CPU, real model, ~2 min
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.analysis.quantspec import modeled_speedup  # noqa: E402
from bench.results_io import write_results  # noqa: E402
from engine.kv_compression.lab import KVLab  # noqa: E402
from engine.speculative.quantspec import SELF_SPEC_FORMATS, run_self_spec_lab  # noqa: E402
from engine.weights import load_weights  # noqa: E402

PROMPTS = ("Explain in two sentences why the sky is blue.", "Give me three facts about honey bees.",
           "Write a short poem about the sea.")
CONTEXTS = (4096, 32768, 131072)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--weights", choices=["real", "random"], default="real")
    ap.add_argument("--out", default="bench/results/quantspec_cpu.json")
    args = ap.parse_args()
    weights = load_weights(args.weights)
    lab, cfg = KVLab(weights), weights.config
    rows = []
    print(f"{'format':<7}{'γ':>3}{'accept':>8}{'tok/pass':>9}{'same':>6}" +
          "".join(f"{f'x@{c // 1024}k':>9}{f'x@{c // 1024}k w4':>11}" for c in CONTEXTS))
    for gamma in args.gammas:
        results = [run_self_spec_lab(lab, weights.tokenizer.chat_prompt_ids(p), gamma, args.tokens) for p in PROMPTS]
        for fmt in SELF_SPEC_FORMATS:
            runs = [r.run(fmt) for r in results]
            drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
            committed = sum(len(x.committed) for r in runs for x in r.rounds)
            passes = sum(len(r.rounds) for r in runs)
            same = all(r.run(fmt).tokens == r.plain for r in results)
            sp = {f"{c}_w{bits}": sum(modeled_speedup(cfg, c, r, bits) for r in runs) / len(runs)
                  for c in CONTEXTS for bits in (16, 4)}
            print(f"{fmt:<7}{gamma:>3}{accepted / drafted:>8.0%}{committed / passes:>9.2f}{'yes' if same else 'NO':>6}" +
                  "".join(f"{sp[f'{c}_w16']:>9.2f}{sp[f'{c}_w4']:>11.2f}" for c in CONTEXTS))
            rows.append({"format": fmt, "gamma": gamma, "drafted": drafted, "accepted": accepted,
                         "acceptance": accepted / drafted, "tokens_per_pass": committed / passes, "same_text": same,
                         "draft_bytes_per_token": runs[0].draft_bytes_per_token, "modeled_speedup": sp})
    write_results(args.out, {"weights": weights.source, "prompts": PROMPTS, "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
