"""Activation quantization of the real model (engine/act_quant): every format the page offers, with and without
SmoothQuant, scored against the full model, plus SmoothQuant's alpha sweep for one format.

Per variant (engine.act_quant.lab.run_lab): the decoder linears' weights and inputs fake-quantized (rounded to
the format, fp32 matmuls: no FP8/FP4 GEMM here), scored on held-out chat answers the full model wrote and on
prose: mean KL(full || quantized) per token and top-1 agreement. Also times the page's default run.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/act_quant.py      # CPU, real model, ~2-3 min
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402
from engine.act_quant.lab import VARIANTS, ActLabSettings, run_lab  # noqa: E402
from engine.weight_quant.lab import reference_texts  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--alpha", type=float, default=ActLabSettings().alpha)
    ap.add_argument("--sweep", default=ActLabSettings().sweep)
    ap.add_argument("--tokens", type=int, default=ActLabSettings().calibration_tokens)
    ap.add_argument("--weights", choices=["real", "random"], default="real")
    ap.add_argument("--out", default="bench/results/act_quant_cpu.json")
    args = ap.parse_args()
    weights = load_weights(args.weights)
    t0 = time.perf_counter()
    reference_texts(weights)  # once per server on the page: not part of a run
    texts_s = time.perf_counter() - t0
    default = run_lab(weights, ActLabSettings())
    print(f"reference texts {texts_s:.1f} s; the page's default run {default.seconds:.1f} s", flush=True)
    r = default if (tuple(args.variants), args.alpha, args.sweep, args.tokens) == (
        default.settings.variants, default.settings.alpha, default.settings.sweep, default.settings.calibration_tokens) \
        else run_lab(weights, ActLabSettings(tuple(args.variants), args.alpha, args.sweep or None, args.tokens))
    rows = []
    for v in r.outcomes:
        chat, prose = v.scores["chat"], v.scores["prose"]
        rows.append(dict(key=v.key, label=v.label, bits_per_weight=v.bits_per_weight,
                         bits_per_activation=v.bits_per_activation, chat_kl=chat.kl, chat_top1=chat.top1,
                         prose_kl=prose.kl, prose_top1=prose.top1, prose_ppl=prose.perplexity,
                         first_difference=v.first_difference, seconds=v.seconds, answer=v.answer_text))
    head = f"{'format':<36} {'W':>5} {'A':>5} {'chat KL':>8} {'top-1':>6} {'prose KL':>8} {'top-1':>6} {'diff':>5}"
    print(head)
    print("-" * len(head))
    for x in rows:
        diff = "-" if x["first_difference"] is None else str(x["first_difference"])
        print(f"{x['label']:<36} {x['bits_per_weight']:>5.2f} {x['bits_per_activation']:>5.2f} {x['chat_kl']:>8.4f} "
              f"{x['chat_top1']:>6.1%} {x['prose_kl']:>8.4f} {x['prose_top1']:>6.1%} {diff:>5}")
    sweep = [dict(alpha=p.alpha, chat_kl=p.chat_kl, chat_top1=p.chat_top1) for p in r.sweep]
    if r.sweep:
        best = r.best_alpha
        print(f"\nα sweep on {VARIANTS[r.settings.sweep].label} (chat KL; without smoothing "
              f"{r.sweep_baseline.chat_kl:.4f}): " + " ".join(f"{p.alpha:g}:{p.chat_kl:.4f}" for p in r.sweep)
              + f"\nlowest at α = {best.alpha:g}: {best.chat_kl:.4f}")
    write_results(args.out, dict(weights=args.weights, alpha=r.settings.alpha, calibration_tokens=r.calibration_tokens,
                                 sweep_format=r.settings.sweep, rows=rows, alpha_sweep=sweep,
                                 sweep_baseline_chat_kl=r.sweep_baseline.chat_kl if r.sweep_baseline else None,
                                 default_run_s=default.seconds, reference_texts_s=texts_s,
                                 seconds=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
