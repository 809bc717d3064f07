"""Weight-only quantization of the real model (engine/weight_quant): round-to-nearest, AWQ and GPTQ at several
bit widths and with several calibration sets (and GPTQ with act-order), each checkpoint scored against the full
model.

Per run (engine.weight_quant.lab.run_lab): every linear of every layer on an INT-b grid with an FP16 scale and
zero point per group of 64 input channels, quantized layer by layer on `--tokens` calibration tokens; scored on
held-out text the calibration never saw: chat answers the full model wrote itself (the fine-tune's behaviour)
and prose. Columns: checkpoint MB (linears on the grid, embedding and norms in 16 bits), bits per linear
weight, mean KL(full || quantized) per token and top-1 agreement on each kind of text, perplexity of the prose,
the first answer token that differs from the full model's, and the seconds quantization took.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/weight_quant.py      # CPU, real model, ~6 min
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402
from engine.weight_quant.lab import METHODS, LabSettings, run_lab  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 4, 3])
    ap.add_argument("--calibration", nargs="+", default=["chat", "prose"])
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=LabSettings().calibration_tokens)
    ap.add_argument("--weights", choices=["real", "random"], default="real")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="bench/results/weight_quant_cpu.json")
    args = ap.parse_args()
    weights = load_weights(args.weights)
    runs, rows = [], []
    t0 = time.perf_counter()
    for bits in args.bits:
        for calibration in args.calibration:
            s = LabSettings(methods=tuple(args.methods), bits=bits, group=args.group, calibration=calibration,
                            calibration_tokens=args.tokens)
            r = run_lab(weights, s)
            for v in r.variants:
                chat, prose = v.scores["chat"], v.scores["prose"]
                rows.append(dict(bits=bits, calibration=calibration, method=v.method, label=v.label,
                                 mb=v.weight_bytes / 1e6, bits_per_weight=v.bits_per_weight, chat_kl=chat.kl,
                                 chat_top1=chat.top1, prose_kl=prose.kl, prose_top1=prose.top1,
                                 prose_ppl=prose.perplexity, first_difference=v.first_difference,
                                 quantize_s=v.seconds, answer=v.answer_text))
            ref = r.reference
            runs.append(dict(bits=bits, calibration=calibration, reference_mb=ref.weight_bytes / 1e6,
                             reference_prose_ppl=ref.scores["prose"].perplexity, reference_answer=ref.answer_text))
            print(f"bits {bits} calibration {calibration}: done at {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\nfull model: {runs[0]['reference_mb']:.1f} MB, prose ppl {runs[0]['reference_prose_ppl']:.2f}")
    head = f"{'bits':>4} {'calib':>6} {'method':>8} {'MB':>6} {'b/w':>5} {'chat KL':>8} {'top-1':>6} " \
           f"{'prose KL':>8} {'top-1':>6} {'ppl':>6} {'diff':>5} {'q s':>5}"
    print(head)
    print("-" * len(head))
    for x in rows:
        diff = "-" if x["first_difference"] is None else str(x["first_difference"])
        print(f"{x['bits']:>4} {x['calibration']:>6} {x['method']:>8} {x['mb']:>6.1f} {x['bits_per_weight']:>5.2f} "
              f"{x['chat_kl']:>8.4f} {x['chat_top1']:>6.1%} {x['prose_kl']:>8.4f} {x['prose_top1']:>6.1%} "
              f"{x['prose_ppl']:>6.2f} {diff:>5} {x['quantize_s']:>5.1f}")
    write_results(args.out, dict(weights=args.weights, group=args.group, calibration_tokens=args.tokens,
                                 runs=runs, rows=rows, seconds=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
