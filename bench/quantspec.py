"""Self-speculation with a quantized KV cache (QuantSpec) on the real model: every draft-cache format at several
draft lengths γ, with the model's weights and with INT4 draft weights, the text checked against the target alone,
acceptance and tokens per target pass measured, and the modeled speed-up at 4k / 32k / 128k tokens of context (the
bytes a step reads; app/analysis/quantspec.py).

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/quantspec.py      # CPU, real model, ~4 min
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.analysis.quantspec import modeled_speedup  # noqa: E402
from bench.results_io import write_results  # noqa: E402
from engine.kv_compression.lab import KVLab  # noqa: E402
from engine.speculative.quantspec import SELF_SPEC_FORMATS, int4_weights, run_self_spec_lab  # noqa: E402
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
    draft_lab = KVLab(int4_weights(weights))
    rows = []
    print(f"{'format':<7}{'weights':>8}{'γ':>3}{'accept':>8}{'tok/pass':>9}{'same':>6}" +
          "".join(f"{f'x@{c // 1024}k':>9}" for c in CONTEXTS))
    for gamma in args.gammas:
        results = [run_self_spec_lab(lab, weights.tokenizer.chat_prompt_ids(p), gamma, args.tokens,
                                     draft_lab=draft_lab) for p in PROMPTS]
        for bits in (16, 4):
            for fmt in SELF_SPEC_FORMATS:
                runs = [r.run(fmt, bits) for r in results]
                drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
                committed = sum(len(x.committed) for r in runs for x in r.rounds)
                passes = sum(len(r.rounds) for r in runs)
                same = all(r.run(fmt, bits).tokens == r.plain for r in results)
                sp = {c: sum(modeled_speedup(cfg, c, r) for r in runs) / len(runs) for c in CONTEXTS}
                print(f"{fmt:<7}{bits:>8}{gamma:>3}{accepted / drafted:>8.0%}{committed / passes:>9.2f}"
                      f"{'yes' if same else 'NO':>6}" + "".join(f"{sp[c]:>9.2f}" for c in CONTEXTS))
                rows.append({"format": fmt, "draft_weight_bits": bits, "gamma": gamma, "drafted": drafted,
                             "accepted": accepted, "acceptance": accepted / drafted,
                             "tokens_per_pass": committed / passes, "same_text": same,
                             "draft_bytes_per_token": runs[0].draft_bytes_per_token,
                             "modeled_speedup": {str(c): v for c, v in sp.items()}})
    write_results(args.out, {"weights": weights.source, "prompts": PROMPTS, "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
