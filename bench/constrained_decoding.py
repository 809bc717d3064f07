"""Constrained decoding on the real engine: every preset of engine/constrained/presets.py, greedy, in four
modes, then sampled, free vs masked.

Greedy modes: "free" (no grammar; the answer is judged by the grammar afterwards), "masked" (the grammar
masks the logits before every token), "jump-forward" (masked, and the text the grammar allows in one way
only is written without sampling) and, for JSON schemas, "compact + jump-forward" (no whitespace between
JSON tokens, so more of it is forced). Per run: whether the text is in the language
(engine.constrained.accepts, JSON whitespace allowed, for every mode), whether it parses as JSON, tokens,
engine steps, forward passes, wall time, the mask's cost per masked token and its share of the steps' wall
time, and how each output token came (free / steered / only / forced; runner.py's TokenEvent).

Sampled: every preset once more with n samples at a temperature (one request, n = 8), free vs masked;
the share of samples whose text the grammar accepts.

    OMP_NUM_THREADS=1 python3 bench/constrained_decoding.py                         # CPU, real model, ~1 min
    python3 bench/constrained_decoding.py --device cuda --weights random            # GPU: CUDA graphs, bf16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import engine_results_path, write_results  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.constrained import ConstrainedEngine, Constraint, accepts  # noqa: E402
from engine.constrained.constraint import parses_as_json  # noqa: E402
from engine.constrained.presets import PRESETS, Preset  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402

EVENT_KINDS = ("free", "steered", "only", "forced")  # "unconstrained": every token of a run without a grammar


def _modes(preset: Preset) -> list[tuple[str, Constraint | None, bool | str]]:
    """(mode, constraint, engine key: jump_forward, or "late" for jump-forward with masks computed after the
    forward pass instead of during it) for every greedy run of a preset."""
    c = preset.constraint
    modes = [("free", None, False), ("masked", c, False), ("jump-forward", c, True),
             ("jump-forward, late masks", c, "late")]
    if c.kind == "json_schema":
        modes.append(("compact + jump-forward", dataclasses.replace(c, json_layout="compact"), True))
    return modes



def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def serve(engine: ConstrainedEngine, preset: Preset, constraint: Constraint | None,
          params: SamplingParams) -> dict:
    """One request on `engine` (idle, reused: its CUDA graphs are captured once), stepped until done; its
    samples and the run's costs. The engine traces light (no per-step copy of every request's events, which
    grows with the history) and the request's tokens and events are read once at the end."""
    device = engine.config.device
    passes = engine.counters["forward_passes"]
    _sync(device)
    t0 = time.perf_counter()
    rid = engine.add_request([{"role": "user", "content": preset.prompt}], params, constraint=constraint)
    steps, step_wall = 0, 0.0
    while engine.has_work():
        step_wall += engine.step().wall_seconds
        steps += 1
    _sync(device)
    wall = time.perf_counter() - t0
    request = engine.snapshot()["requests"][rid]
    return {"samples": request["samples"], "compile_seconds": request["compile_seconds"], "steps": steps,
            "forward_passes": engine.counters["forward_passes"] - passes, "wall_seconds": wall,
            "step_wall_seconds": step_wall}


def mask_stats(run: dict) -> dict:
    """The mask's cost over every masked token of a run (kinds free / steered / only; forced tokens and
    unconstrained runs have none): per token, and as a share of the run's StepRecord wall seconds."""
    masked = [e["mask_seconds"] for s in run["samples"] for e in s["events"] if e["allowed"] is not None]
    # The logits hook's whole work per masked token: the mask, plus the statistics the page draws (softmax,
    # top 5, forbidden probability), which a server without the page would not compute.
    hooks = [e["hook_seconds"] for s in run["samples"] for e in s["events"] if e["allowed"] is not None]
    # What sampling waited for the masks after the forward pass: all of each mask when it is computed then
    # (late), what was left of it when it was started early, during the pass.
    waits = [e["mask_wait_seconds"] for s in run["samples"] for e in s["events"] if e["allowed"] is not None]
    return {"masked_tokens": len(masked), "mask_seconds": round(sum(masked), 6),
            "wait_us_mean": round(sum(waits) / len(waits) * 1e6, 1) if waits else None,
            "wait_share_of_step_wall": round(sum(waits) / max(run["step_wall_seconds"], 1e-12), 4),
            "hook_us_mean": round(sum(hooks) / len(hooks) * 1e6, 1) if hooks else None,
            "hook_share_of_step_wall": round(sum(hooks) / max(run["step_wall_seconds"], 1e-12), 4),
            "mask_us_mean": round(sum(masked) / len(masked) * 1e6, 1) if masked else None,
            "mask_us_max": round(max(masked) * 1e6, 1) if masked else None,
            "mask_share_of_step_wall": round(sum(masked) / max(run["step_wall_seconds"], 1e-12), 4)}


def greedy_row(preset: Preset, mode: str, run: dict, tokenizer) -> dict:
    sample = run["samples"][0]
    text, events = sample["text"], sample["events"]
    counts = {k: sum(e["kind"] == k for e in events) for k in (*EVENT_KINDS, "unconstrained")}
    is_json = preset.constraint.kind == "json_schema"
    return {
        "preset": preset.name, "mode": mode, "valid": accepts(preset.constraint, text, tokenizer),
        "parses_as_json": parses_as_json(text) if is_json else None, "output_tokens": len(events),
        "steps": run["steps"], "forward_passes": run["forward_passes"], "wall_seconds": round(run["wall_seconds"], 4),
        "step_wall_seconds": round(run["step_wall_seconds"], 4),
        "compile_ms": round(run["compile_seconds"] * 1e3, 2) if run["compile_seconds"] is not None else None,
        **mask_stats(run), "events": counts, "finish_reason": sample["finish_reason"], "text": text,
    }


def measure(engines: dict[bool, ConstrainedEngine], args: argparse.Namespace, tokenizer,
            quiet: bool = False) -> tuple[list[dict], list[dict]]:
    """Every greedy run and every sampled run once: (greedy rows, sampled rows); printed unless quiet."""
    def out(*a) -> None:
        if not quiet:
            print(*a)

    rows = []
    out(f"{'preset':<36}{'mode':<24}{'valid':>6}{'json':>6}{'tokens':>7}{'steps':>6}{'fwd':>5}{'wall s':>8}"
        f"{'mask us':>9}{'max us':>8}{'mask %':>7}  {'free/steer/only/forced':<23}{'finish':<7}")
    for preset in PRESETS:
        for mode, constraint, jf in _modes(preset):
            run = serve(engines[jf], preset, constraint, SamplingParams(max_tokens=preset.max_tokens))
            r = greedy_row(preset, mode, run, tokenizer)
            rows.append(r)
            ev = r["events"]
            js = "" if r["parses_as_json"] is None else ("yes" if r["parses_as_json"] else "no")
            mean = f"{r['mask_us_mean']:.0f}" if r["mask_us_mean"] is not None else "-"
            mx = f"{r['mask_us_max']:.0f}" if r["mask_us_max"] is not None else "-"
            out(f"{preset.name[:35]:<36}{mode:<24}{'yes' if r['valid'] else 'no':>6}{js:>6}{r['output_tokens']:>7}"
                f"{r['steps']:>6}{r['forward_passes']:>5}{r['wall_seconds']:>8.2f}{mean:>9}{mx:>8}"
                f"{100 * r['mask_share_of_step_wall']:>6.1f}%  "
                f"{'/'.join(str(ev[k]) for k in EVENT_KINDS) if constraint else '-':<23}{r['finish_reason']:<7}")
    out("\ntexts:")
    for r in rows:
        out(f"  {r['preset'][:28]:<29}{r['mode']:<24}{json.dumps(r['text'])[:100]}")

    sampled = []
    out(f"\nsampled: {args.samples} samples per preset at temperature {args.temperature}, seed {args.seed}")
    out(f"{'preset':<36}{'free valid':>12}{'masked valid':>14}{'free s':>8}{'masked s':>10}{'mask us':>9}{'max us':>8}"
        f"{'mask %':>8}")
    for preset in PRESETS:
        params = SamplingParams(max_tokens=preset.max_tokens, temperature=args.temperature, seed=args.seed,
                                n=args.samples)
        row = {"preset": preset.name}
        for mode, constraint in (("free", None), ("masked", preset.constraint)):
            run = serve(engines[False], preset, constraint, params)
            texts = [s["text"] for s in run["samples"]]
            valid = [accepts(preset.constraint, t, tokenizer) for t in texts]
            row[mode] = {"valid_fraction": round(sum(valid) / len(valid), 4),
                         "wall_seconds": round(run["wall_seconds"], 3), "steps": run["steps"],
                         "output_tokens": sum(len(s["events"]) for s in run["samples"]), **mask_stats(run),
                         "texts": texts}
        sampled.append(row)
        f, m = row["free"], row["masked"]
        out(f"{preset.name[:35]:<36}{100 * f['valid_fraction']:>11.1f}%{100 * m['valid_fraction']:>13.1f}%"
            f"{f['wall_seconds']:>8.2f}{m['wall_seconds']:>10.2f}{m['mask_us_mean']:>9.0f}{m['mask_us_max']:>8.0f}"
            f"{100 * m['mask_share_of_step_wall']:>7.1f}%")
    return rows, sampled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--weights", default="real", choices=["real", "random"])
    ap.add_argument("--samples", type=int, default=8, help="samples per preset in the sampled part (one request, n)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    gpu = args.device == "cuda"
    torch.manual_seed(args.seed)
    weights = load_weights(args.weights, device="cpu")
    cfg = EngineConfig(device=args.device, dtype="bfloat16" if gpu else "float32", weights=args.weights,
                       cuda_graphs=gpu, num_blocks=128, max_num_seqs=max(16, args.samples),
                       max_model_len=512, profile_kernels=False, trace_detail="light")
    # One engine per jump-forward setting, every request with its own constraint (None: free). Warm-up,
    # untimed: the first forward passes and llguidance's view of the vocabulary (~0.3 s, cached per
    # tokenizer); on the GPU every run once (Triton compiles, CUDA graphs captured for the same shapes).
    engines = {jf: ConstrainedEngine(cfg, weights, jump_forward=jf) for jf in (False, True)}
    engines["late"] = ConstrainedEngine(cfg, weights, jump_forward=True, early_masks=False)
    tokenizer = engines[False].tokenizer
    if gpu:
        measure(engines, args, tokenizer, quiet=True)
    else:
        for p in PRESETS:
            serve(engines[True], p, p.constraint, SamplingParams(max_tokens=4))
            serve(engines["late"], p, p.constraint, SamplingParams(max_tokens=4))
            serve(engines[False], p, None, SamplingParams(max_tokens=4))
    rows, sampled = measure(engines, args, tokenizer)

    def by(mode: str) -> dict[str, dict]:
        return {r["preset"]: r for r in rows if r["mode"] == mode}

    free, masked, jf, compact = by("free"), by("masked"), by("jump-forward"), by("compact + jump-forward")
    late = by("jump-forward, late masks")
    constrained = [r for r in rows if r["mode"] != "free"]
    masked_tokens = sum(r["masked_tokens"] for r in constrained)
    summary = {
        "greedy_valid_free": sum(r["valid"] for r in free.values()) / len(free),
        "greedy_valid_masked": sum(r["valid"] for r in masked.values()) / len(masked),
        "greedy_valid_jump_forward": sum(r["valid"] for r in jf.values()) / len(jf),
        "sampled_valid_free": sum(s["free"]["valid_fraction"] for s in sampled) / len(sampled),
        "sampled_valid_masked": sum(s["masked"]["valid_fraction"] for s in sampled) / len(sampled),
        # Jump-forward vs masked on the same preset: engine steps (and forward passes) it did not need.
        # Only comparable where both wrote the same text; the columns say whether they did.
        "jump_forward_steps_saved": {
            p: {"masked_steps": masked[p]["steps"], "jump_forward_steps": jf[p]["steps"],
                "steps_saved": masked[p]["steps"] - jf[p]["steps"],
                "same_text": masked[p]["text"] == jf[p]["text"],
                **({"compact_steps": compact[p]["steps"],
                    "compact_same_text": compact[p]["text"] == masked[p]["text"]} if p in compact else {})}
            for p in masked},
        "mask_us_mean_all": round(sum(r["mask_seconds"] for r in constrained) / max(masked_tokens, 1) * 1e6, 1),
        "mask_share_of_step_wall_masked_runs": round(
            sum(r["mask_share_of_step_wall"] for r in constrained) / len(constrained), 4),
        # Early masks: the share of step time sampling waited for masks, jump-forward runs, early vs late.
        "wait_share_of_step_wall_early": round(sum(r["wait_share_of_step_wall"] for r in jf.values()) / len(jf), 4),
        "wait_share_of_step_wall_late": round(sum(r["wait_share_of_step_wall"] for r in late.values()) / len(late), 4),
        "hook_share_of_step_wall_masked_runs": round(
            sum(r["hook_share_of_step_wall"] for r in constrained) / len(constrained), 4),
    }
    print(f"\ngreedy: valid free {100 * summary['greedy_valid_free']:.0f}%, masked "
          f"{100 * summary['greedy_valid_masked']:.0f}%, jump-forward {100 * summary['greedy_valid_jump_forward']:.0f}% "
          f"of {len(free)} presets; sampled: valid free {100 * summary['sampled_valid_free']:.1f}%, masked "
          f"{100 * summary['sampled_valid_masked']:.1f}% (mean over presets)")
    print("jump-forward, steps (masked -> jump-forward [-> compact]):")
    for p, s in summary["jump_forward_steps_saved"].items():
        extra = f" -> {s['compact_steps']}" if "compact_steps" in s else ""
        print(f"  {p[:35]:<36}{s['masked_steps']:>4} -> {s['jump_forward_steps']}{extra}  "
              f"(saved {s['steps_saved']}, same text as masked: {'yes' if s['same_text'] else 'no'})")
    print(f"mask: {summary['mask_us_mean_all']} us per masked token on average, "
          f"{100 * summary['mask_share_of_step_wall_masked_runs']:.1f}% of the steps' wall time "
          f"(the whole logits hook with the page's statistics: "
          f"{100 * summary['hook_share_of_step_wall_masked_runs']:.1f}%) "
          "(mean over the constrained greedy runs)")
    print(f"sampling waited for masks: {100 * summary['wait_share_of_step_wall_early']:.2f}% of step time with early "
          f"masks, {100 * summary['wait_share_of_step_wall_late']:.2f}% with masks computed after the forward pass "
          "(jump-forward runs)")

    device = torch.cuda.get_device_name() if gpu else "cpu"
    write_results(args.out or engine_results_path("constrained_decoding", gpu), {
        "device": device, "threads": torch.get_num_threads(), "weights": args.weights, "args": vars(args),
        "greedy": rows, "sampled": sampled, "summary": summary,
        "note": ("greedy rows: one request per preset and mode, on one engine per jump-forward setting "
                 "(untimed warm-up first); wall_seconds = add_request to the last step, step_wall_seconds = the "
                 "sum of its StepRecords' wall seconds; valid = engine.constrained.accepts on the text (JSON whitespace "
                 "allowed), for every mode; mask us = the llguidance bitmask plus its unpacking per masked token "
                 "(kinds free/steered/only); mask share = their sum over the run's StepRecord wall seconds. "
                 "Sampled: one request with n samples, seed, temperature; valid_fraction of its samples."),
    })


if __name__ == "__main__":
    main()
