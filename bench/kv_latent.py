"""A latent KV cache retrofitted onto the real model (engine/kv_latent): every latent rank, plain and activation-
aware SVD, and MQA by mean-pooling, scored against the full model, plus the default answer's cache bytes.

Per layout (engine.kv_latent.lab.run_latent_lab): each layer's K and V projections replaced by up · down at that
rank, scored on held-out chat answers the full model wrote and on prose (mean KL(full || retrofit) per token, top-1
agreement); the prompt answered by the latent decoder, whose cache tensors hold only the latent.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/kv_latent.py      # CPU, real model, ~40 s
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import write_results  # noqa: E402
from engine.kv_latent.lab import KIND_LABELS, RANKS, LatentSettings, run_latent_lab  # noqa: E402
from engine.weight_quant.lab import reference_texts  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    ap.add_argument("--weights", choices=["real", "random"], default="real")
    ap.add_argument("--out", default="bench/results/kv_latent_cpu.json")
    args = ap.parse_args()
    weights = load_weights(args.weights)
    t0 = time.perf_counter()
    reference_texts(weights)  # once per server on the page: not part of a run
    texts_s = time.perf_counter() - t0
    r = run_latent_lab(weights, LatentSettings(), ranks=tuple(args.ranks))
    print(f"reference texts {texts_s:.1f} s; the run {r.seconds:.1f} s")
    print(f"{'cache layout':<32}{'numbers':>8}{'share':>7}{'kept':>8}{'chat KL':>9}{'top-1':>7}{'prose KL':>10}"
          f"{'top-1':>7}")
    rows = []
    for p in sorted(r.points, key=lambda p: (-p.rank, p.kind)):
        c, s = p.scores["chat"], p.scores["prose"]
        kept = "" if math.isnan(p.kept_energy) else f"{p.kept_energy:.1%}"
        print(f"{KIND_LABELS[p.kind]:<32}{p.rank:>8}{p.rank / r.full_rank:>7.0%}{kept:>8}{c.kl:>9.3f}{c.top1:>7.1%}"
              f"{s.kl:>10.3f}{s.top1:>7.1%}")
        kept_value = None if math.isnan(p.kept_energy) else p.kept_energy
        rows.append({"kind": p.kind, "rank": p.rank, "kept_energy": kept_value,
                     **{f"{d}_{k}": getattr(v, k) for d, v in p.scores.items() for k in ("kl", "top1", "nll")}})
    for a in r.answers:
        print(f"{a.label}: {a.run.cache_bytes:,} cache bytes, {a.run.rebuild_flops / 1e9:.2f} GFLOP rebuilding K, "
              f"differs at {a.differs_at}: {a.text[:70]!r}")
    write_results(args.out, {
        "weights": weights.source, "settings": dataclasses.asdict(r.settings), "full_rank": r.full_rank,
        "seconds": r.seconds, "reference_texts_seconds": texts_s, "points": rows,
        "answers": [{"label": a.label, "tokens": list(a.run.tokens), "text": a.text, "differs_at": a.differs_at,
                     "cache_bytes": a.run.cache_bytes, "rebuild_flops": a.run.rebuild_flops} for a in r.answers]})


if __name__ == "__main__":
    main()
