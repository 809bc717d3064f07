"""Serving under load on the live engine (engine/serving_load): which serving configuration keeps the most
requests within a latency SLO as the request rate rises, and the highest rate it sustains (goodput).

Per workload (chat: short prompts, longer answers; rag: long prompts, short answers; mixed: the two
interleaved), the same requests arrive as a Poisson process at each rate (common random numbers: only the
gaps shrink), and each configuration serves them with a fresh LLMEngine on engine time (real forward
passes, idle gaps skipped). Per request: TTFT (arrival to first token, queueing included) and TPOT (mean gap
between later tokens); a request meets the SLO when both are within their targets. Per run: SLO met %, the
shares meeting each target alone, TTFT and TPOT p50/p90, output tokens/s over the run's span, and busy %
(the share of the span spent computing). Goodput per configuration: the highest tested rate whose
attainment, and every lower rate's, reaches the goal (DistServe's definition; "below X" when the lowest
rate already misses).

Configurations (CONFIGS below) turn one knob each from "batch cap 8" (8 sequences a step, 256-token budget,
chunked prefill): the batch cap (2, 16), the token budget (64), chunking off (budget 1024, room for the
longest prompt and its answer), and an output cap of 16 tokens (answers cut short: less work, so not the
same service). run_sweep takes at most MAX_CONFIGS configurations at a time, so a larger selection runs as
several sweeps, each led by "batch cap 8" again (as "batch cap 8 (repeat)" after the first): every group
has the reference measured alongside it, and the repeat says how much two runs of one setting differ.

    PYTHONPATH=. python bench/slo_goodput.py                                  # CPU, real model, ~15-20 min
    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/slo_goodput.py                # CPU shared with other work
    PYTHONPATH=. python bench/slo_goodput.py --workload chat --requests 6 --rates 1,4 \\
        --configs "batch cap 2,batch cap 8" --out /tmp/slo_try.json          # a quick check, ~30 s
    python bench/slo_goodput.py --device cuda                                 # GPU: bf16, CUDA graphs

Every number is engine time, so a CPU busy with other work slows every step and every SLO reading with it:
the JSON keeps the load average before and after, and the share of a CPU per torch thread the run got
(process CPU time / wall time / threads; ~1 when it had its cores to itself). On a machine shared with
other work use OMP_NUM_THREADS=1: with two threads a step waits at every barrier for a descheduled
partner (seen here: a 50 ms decode step took 2 s while another process kept both cores busy).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_io import engine_results_path, write_results  # noqa: E402
from engine.serving_load import SLO, WORKLOADS, LoadConfig, LoadRun, SweepResult, run_sweep  # noqa: E402
from engine.serving_load.sweep import MAX_CONFIGS  # noqa: E402
from engine.weights import load_weights  # noqa: E402

REFERENCE = "batch cap 8"
CONFIGS: tuple[LoadConfig, ...] = (
    LoadConfig("batch cap 2", max_num_seqs=2, max_num_batched_tokens=256),
    LoadConfig(REFERENCE, max_num_seqs=8, max_num_batched_tokens=256),
    LoadConfig("batch cap 16", max_num_seqs=16, max_num_batched_tokens=256),
    LoadConfig("budget 64", max_num_seqs=8, max_num_batched_tokens=64),
    # Without chunking a whole prompt and its answer must fit one step: the longest (mixed) is 512 + 40.
    LoadConfig("no chunking", max_num_seqs=8, max_num_batched_tokens=1024, chunked_prefill=False),
    LoadConfig("output cap 16", max_num_seqs=8, max_num_batched_tokens=256, output_cap=16),
)
WORKLOAD_KEYS = {spec.name: key for key, spec in WORKLOADS.items()}  # "chat" -> the WORKLOADS key

# Defaults per device: a CPU decode step of the 135M model costs ~45-70 ms, an H200 one ~1-2 ms.
DEFAULTS = {
    "cpu": dict(weights="real", requests=12, rates="0.5,1,2,4", ttft=1.0, tpot=80.0, dtype="float32"),
    "cuda": dict(weights="random", requests=64, rates="10,25,50,100,200", ttft=0.1, tpot=5.0, dtype="bfloat16"),
}


def pick_configs(text: str | None) -> list[LoadConfig]:
    if not text:
        return list(CONFIGS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {c.label: c for c in CONFIGS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; choose from {list(known)}")
    return [c for c in CONFIGS if c.label in names]  # the script's order, whatever order they were given in


def groups(configs: list[LoadConfig]) -> list[list[LoadConfig]]:
    """The selection as sweeps of at most MAX_CONFIGS, each led by the reference (a renamed repeat after the
    first), so every configuration is compared with one measured in the same sweep, under the same drift."""
    if len(configs) <= MAX_CONFIGS:
        return [configs]
    ref = next((c for c in configs if c.label == REFERENCE), configs[0])
    rest = [c for c in configs if c is not ref]
    size = MAX_CONFIGS - 1
    chunks = [rest[i:i + size] for i in range(0, len(rest), size)]
    repeat = dataclasses.replace(ref, label=f"{ref.label} (repeat)")
    return [[ref if i == 0 else repeat, *chunk] for i, chunk in enumerate(chunks)]


def progress_printer(workload: str) -> Callable[[float, str], None]:
    """Progress to stderr, flushed, so a background run's log shows how far it got."""
    def progress(share: float, what: str) -> None:
        print(f"  [{workload}] {100 * share:3.0f}%  {what}", file=sys.stderr, flush=True)
    return progress


def _num(x: float, digits: int) -> float | None:
    """Rounded, and None for nan (a run with no multi-token answer has no TPOT): JSON has no NaN."""
    return None if math.isnan(x) else round(x, digits)


def run_summary(run: LoadRun, slo: SLO) -> dict:
    n = len(run.timings)
    return {
        "configuration": run.config.label, "rate": run.rate, "requests": n,
        "slo_met": round(run.attainment(slo), 4),
        "ttft_met": round(sum(t.meets_ttft(slo) for t in run.timings) / n, 4),
        "tpot_met": round(sum(t.meets_tpot(slo) for t in run.timings) / n, 4),
        "ttft_p50_s": _num(run.ttft_percentile(50), 4), "ttft_p90_s": _num(run.ttft_percentile(90), 4),
        "tpot_p50_ms": _num(1e3 * run.tpot_percentile(50), 2), "tpot_p90_ms": _num(1e3 * run.tpot_percentile(90), 2),
        "queue_mean_s": round(sum(t.queue_s for t in run.timings) / n, 4),
        "output_tokens": run.output_tokens, "output_tok_s": round(run.throughput_tok_s, 2),
        "good_req_s": round(run.goodput_req_s(slo), 4), "busy": round(run.busy_share, 4),
        "makespan_s": round(run.makespan_s, 3), "steps": len(run.steps),
        # A step far slower than its work explains is the machine, not the configuration (another process
        # took a core): one such step can sink a run's attainment, so it is kept to be seen.
        "slowest_step_s": round(max((s.seconds for s in run.steps), default=0.0), 3),
        "capture_s": round(run.capture_s, 4),  # CUDA graph capture inside its steps (the warm-up should take it all)
        "mean_batch": round(sum(s.num_seqs for s in run.steps) / max(len(run.steps), 1), 2),
    }


def goodput_text(rate: float | None, rates: tuple[float, ...]) -> str:
    if rate is None:
        return f"below {min(rates):g} req/s"
    return f"{rate:g} req/s" + (" (or more: the highest tested)" if rate == max(rates) else "")


def print_table(name: str, sweeps: list[SweepResult], rows: list[dict], slo: SLO) -> None:
    rates = sweeps[0].rates
    print(f"\n{name}: {sweeps[0].workload.num_requests} requests, prompts {sweeps[0].workload.prompt_tokens[0]}-"
          f"{sweeps[0].workload.prompt_tokens[1]}, answers {sweeps[0].workload.output_tokens[0]}-"
          f"{sweeps[0].workload.output_tokens[1]} tokens; {sum(s.seconds for s in sweeps):.0f} s")
    print(f"  {'configuration':<22}{'rate':>6}{'met %':>7}{'ttft%':>7}{'tpot%':>7}{'TTFT p50':>9}{'p90':>7}"
          f"{'TPOT p50':>9}{'p90':>7}{'tok/s':>7}{'busy %':>7}{'batch':>6}{'max s':>7}")
    for r in sorted(rows, key=lambda r: (r["order"], r["rate"])):
        tpot50 = "-" if r["tpot_p50_ms"] is None else f"{r['tpot_p50_ms']:.0f}"
        tpot90 = "-" if r["tpot_p90_ms"] is None else f"{r['tpot_p90_ms']:.0f}"
        print(f"  {r['configuration'][:21]:<22}{r['rate']:>6g}{100 * r['slo_met']:>7.0f}{100 * r['ttft_met']:>7.0f}"
              f"{100 * r['tpot_met']:>7.0f}{r['ttft_p50_s']:>9.2f}{r['ttft_p90_s']:>7.2f}{tpot50:>9}{tpot90:>7}"
              f"{r['output_tok_s']:>7.1f}{100 * r['busy']:>7.0f}{r['mean_batch']:>6.1f}{r['slowest_step_s']:>7.2f}")
    captured = sum(r["capture_s"] for r in rows)
    if captured > 0:  # capture time is step time: it lands on the TTFT/TPOT of whoever was in that step
        print(f"  note: {captured:.3f} s of CUDA graph capture fell inside measured runs (capture_s in the JSON)")
    print(f"  goodput (SLO: TTFT <= {slo.ttft_s:g} s, TPOT <= {1e3 * slo.tpot_s:g} ms, for {100 * slo.goal:g}% "
          "of requests):")
    for s in sweeps:
        for c in s.configs:
            print(f"    {c.label:<24}{goodput_text(s.goodput(c.label, slo), rates)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--weights", default=None, choices=["real", "random"], help="default: real on cpu, random on cuda")
    ap.add_argument("--workload", default=None, choices=list(WORKLOAD_KEYS), help="default: all three")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default: 12 cpu, 64 cuda)")
    ap.add_argument("--rates", default=None, help="comma list of requests/s (default: 0.5,1,2,4 cpu; "
                                                  "10,25,50,100,200 cuda)")
    ap.add_argument("--ttft", type=float, default=None, help="TTFT target, s (default: 1.0 cpu, 0.1 cuda)")
    ap.add_argument("--tpot", type=float, default=None, help="TPOT target, ms (default: 80 cpu, 5 cuda)")
    ap.add_argument("--goal", type=float, default=0.9, help="share of requests that must meet both targets")
    ap.add_argument("--configs", default=None, help=f"comma list of names, a subset of {[c.label for c in CONFIGS]}")
    ap.add_argument("--seed", type=int, default=0, help="workload seed (lengths and arrival gaps)")
    ap.add_argument("--tag", default=None, help="suffix of the default output name, e.g. run1")
    ap.add_argument("--out", default=None, help="default: bench/results/slo_goodput_{cpu|cuda_<card>}[_{tag}].json")
    args = ap.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    d = DEFAULTS[args.device]
    weights_mode = args.weights or d["weights"]
    num_requests = args.requests or d["requests"]
    rates = [float(r) for r in (args.rates or d["rates"]).split(",") if r.strip()]
    slo = SLO(ttft_s=args.ttft if args.ttft is not None else d["ttft"],
              tpot_s=(args.tpot if args.tpot is not None else d["tpot"]) / 1e3, goal=args.goal)
    configs = pick_configs(args.configs)
    workloads = [args.workload] if args.workload else list(WORKLOAD_KEYS)
    server = {"device": args.device, "dtype": d["dtype"], "weights": weights_mode}

    torch.manual_seed(0)
    weights = load_weights(weights_mode, device="cpu")
    order = {c.label: i for i, g in enumerate(groups(configs)) for c in g}  # table rows follow the sweeps
    load_before = os.getloadavg()
    t_all, cpu_all = time.perf_counter(), time.process_time()
    results: dict[str, dict] = {}
    for short in workloads:
        spec = WORKLOADS[WORKLOAD_KEYS[short]].with_requests(num_requests, args.seed)
        sweeps: list[SweepResult] = []
        for group in groups(configs):
            sweeps.append(run_sweep(weights, server, group, spec, rates, progress=progress_printer(short)))
        rows = [{**run_summary(run, slo), "order": order[run.config.label]} for s in sweeps for run in s.runs]
        print_table(short, sweeps, rows, slo)
        sys.stdout.flush()
        for r in rows:
            del r["order"]
        results[short] = {
            "workload": dataclasses.asdict(spec), "backend": sweeps[0].backend,
            "sweep_seconds": round(sum(s.seconds for s in sweeps), 1),
            "goodput_req_s": {c.label: s.goodput(c.label, slo) for s in sweeps for c in s.configs},
            "runs": rows,
        }
    total = time.perf_counter() - t_all
    cpu_share = (time.process_time() - cpu_all) / total / torch.get_num_threads()

    labels = list(order)
    print(f"\ngoodput (req/s; '<x': below the lowest rate; tested {','.join(f'{r:g}' for r in sorted(set(rates)))})")
    print(f"  {'configuration':<24}" + "".join(f"{w:>10}" for w in workloads))
    for label in labels:
        cells = [results[w]["goodput_req_s"][label] for w in workloads]
        print(f"  {label:<24}" + "".join(f"{'<' + format(min(rates), 'g') if g is None else format(g, 'g'):>10}"
                                         for g in cells))
    print(f"\ntotal {total:.1f} s; {torch.get_num_threads()} torch thread(s), {100 * cpu_share:.0f}% of a CPU each; "
          f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    write_results(args.out or engine_results_path("slo_goodput", args.device == "cuda", args.tag or ""), {
        "device": device, "threads": torch.get_num_threads(), "weights": weights_mode, "args": vars(args),
        "server": server, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "goal": slo.goal},
        "rates": sorted(set(rates)), "num_requests": num_requests,
        "configs": {c.label: dataclasses.asdict(c) for g in groups(configs) for c in g},
        "workloads": results, "total_seconds": round(total, 1), "cpu_share_per_thread": round(cpu_share, 3),
        "loadavg_1min": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "note": ("Engine time: the sum of measured step wall times, idle gaps to the next arrival skipped. TTFT from "
                 "arrival (queueing included) to the end of the step that sampled the first token; TPOT = (last - "
                 "first) / (tokens - 1), percentiles over answers of 2+ tokens. slo_met/ttft_met/tpot_met: shares "
                 "of requests; goodput_req_s: the highest tested rate whose attainment, and every lower rate's, "
                 "reaches the goal (null: the lowest rate misses). output_tok_s over the span from the first "
                 "arrival to the last token; busy: step time over that span; mean_batch: sequences per step; "
                 "slowest_step_s: the longest step (a stall far above its work is the machine). "
                 "'batch cap 8 (repeat)': the same setting, re-run as the reference of a later sweep "
                 f"(run_sweep takes at most {MAX_CONFIGS} configurations). 'output cap 16' serves shorter answers."),
    })


if __name__ == "__main__":
    main()
