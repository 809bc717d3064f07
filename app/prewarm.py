"""Compute the labs' default runs ahead of a class: `python3 -m app.prewarm`.

The weight- and activation-quantization pages run their lab when first opened (1-2 minutes on a 2-core CPU), the
LoRA merge and KV compression pages theirs (about 20 s each), and the latent KV cache's button about half a
minute. Their results are kept on disk (engine/result_store.py), so once this has run, every visitor of a server
on this machine, restarted or not, sees them at once with when they were computed. Only CPU results are kept (a
GPU run is fast, and hashing its weights would copy them back first), so on a GPU server this says so and stops.
Same weights, device and dtype as the app (INFERSCOPE_WEIGHTS, INFERSCOPE_DEVICE).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.act_quant.lab import ActLabSettings
from engine.kv_latent.lab import LatentSettings
from engine.lora.merge_lab import default_settings as merge_defaults
from engine.result_store import StoredResult
from engine.weight_quant.lab import LabSettings
from engine.weights import LoadedWeights, load_weights

from app.runtime import device, dtype_name, weights_mode
from app.sections import act_quant, kv_compression, kv_latent, lora_merge, weight_quant


@dataclass(frozen=True, slots=True)
class Lab:
    """One lab's default run, through the same function the page calls (so the disk keys are the page's)."""

    name: str
    run: Callable[[LoadedWeights, Callable[[str, float], None]], StoredResult[Any]]


LABS: tuple[Lab, ...] = (
    Lab("weight quantization (page 15)", lambda w, p: weight_quant.lab_run(w, LabSettings(), p)),
    Lab("activation quantization (page 18)", lambda w, p: act_quant.lab_run(w, ActLabSettings(), p)),
    Lab("latent KV cache (KV cache page)", lambda w, p: kv_latent.lab_run(w, LatentSettings(), p)),
    Lab("LoRA merge or serve (page 16)", lambda w, p: lora_merge.lab_run(w, merge_defaults(), p)),
    Lab("KV cache quantization and eviction (page 13)",
        lambda w, p: kv_compression.lab_run(w, kv_compression.default_settings(),
                                            lambda done, total: p("every cache generating", done / max(1, total)))),
)


def prewarm(weights: LoadedWeights, labs: Sequence[Lab] = LABS,
            log: Callable[[str], None] = print) -> list[StoredResult[Any]]:
    """Each lab's default run, computed and stored, or read back when it is on disk already."""
    out = []
    for lab in labs:
        t0 = time.perf_counter()
        last = [""]

        def progress(what: str, share: float) -> None:
            if what != last[0]:  # one line per stage, not per tick
                last[0] = what
                log(f"  {share:4.0%} {what}")

        log(f"{lab.name}: running…")
        result = lab.run(weights, progress)
        state = ("already on disk (computed " + time.strftime("%Y-%m-%d %H:%M", time.localtime(result.computed_at))
                 + ")" if result.from_disk else f"computed in {time.perf_counter() - t0:.0f} s and stored")
        log(f"{lab.name}: {state}")
        out.append(result)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    if device() != "cpu":
        print(f"The app runs on {device()}: lab results are kept on disk for CPU runs only, so there is nothing "
              "to prepare.")
        return 0
    weights = load_weights(weights_mode(), device=device(), dtype=getattr(torch, dtype_name()))
    prewarm(weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
