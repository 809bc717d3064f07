"""Plain data for the parallelism page: which degrees the model allows, how one layer splits over the ranks,
memory and collectives per rank, the measured compute per forward pass, the H200 bench and the projection
of its wire time, the pipeline's stages and token latency, expert-parallel arithmetic, and the run as JSON.
No Streamlit here, so every table and series is testable on its own."""
from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from app.formatting import GIB, MIB, NO_VALUE, fmt_bytes
from engine.config import ModelConfig
from engine.parallel.collectives import all_gather_bytes, ring_all_reduce_bytes
from engine.parallel.expert_math import MOE_MODELS, MoeShape, ep_cost, routing_imbalance
from engine.parallel.generate import Generation, StepCost
from engine.parallel.lab import ParallelResult
from engine.parallel.pipeline import PipelineRun
from engine.parallel.plan import tp_options
from engine.parallel.tp_scaling import DenseShape, tp_floor

ROOT = Path(__file__).resolve().parents[2]
H200_BENCH = ROOT / "bench" / "results" / "parallel_h200.json"
CPU_BENCH = ROOT / "bench" / "results" / "parallel_cpu.json"
CPU_BENCH_COMMAND = "OMP_NUM_THREADS=2 PYTHONPATH=. python3 bench/parallel.py --batches 1,16,64"
BENCH_COMMAND = "python3 bench/parallel.py --device cuda"
EP_GPUS = (8, 16, 32)
ROUTING_TOKENS = (16, 32, 64, 128, 256, 512, 1024)
ROUTING_DRAWS = 100  # routings averaged per point: steady to about 1 %, and fast enough for a slider


# ---- which degrees ---------------------------------------------------------------------------------

def degree_frame(cfg: ModelConfig) -> pd.DataFrame:
    """One row per degree; "Does not divide" names what fails, short enough for a projector row (the engine's
    full sentences, "9 query heads do not split evenly over 2 ranks", are the form's error message)."""
    return pd.DataFrame([{"TP degree": c.degree, "Splits evenly": c.ok,
                          "Does not divide evenly": ", ".join(r.split(" do not split")[0] for r in c.reasons) or NO_VALUE}
                         for c in tp_options(cfg)])


def allowed_degrees(cfg: ModelConfig) -> list[int]:
    return [c.degree for c in tp_options(cfg) if c.ok]


# ---- how one layer splits --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SplitRow:
    """One dimension of a layer that tensor parallelism cuts: its size and each rank's [start, stop)."""

    part: str
    total: int
    unit: str
    spans: tuple[tuple[int, int], ...]  # per rank


def _even(n: int, tp: int) -> tuple[tuple[int, int], ...]:
    # The same contiguous even split engine.parallel.tensor_parallel.shard_weights makes (check_degrees has
    # made sure tp divides n); tests/test_parallelism_page.py holds the two together.
    per = n // tp
    return tuple((r * per, (r + 1) * per) for r in range(tp))


def split_rows(cfg: ModelConfig, tp: int) -> list[SplitRow]:
    d = cfg.head_dim
    heads = _even(cfg.num_heads, tp)
    return [
        SplitRow("W_q rows: query heads", cfg.num_heads, "heads", heads),
        SplitRow("W_k, W_v rows: KV heads", cfg.num_kv_heads, "KV heads", _even(cfg.num_kv_heads, tp)),
        SplitRow("W_o columns (its heads' outputs)", cfg.num_heads * d, "columns",
                 tuple((a * d, b * d) for a, b in heads)),
        SplitRow("MLP: gate, up rows, down columns", cfg.intermediate_size, "channels",
                 _even(cfg.intermediate_size, tp)),
        SplitRow("Vocabulary: embedding and LM head rows", cfg.vocab_size, "rows", _even(cfg.vocab_size, tp)),
    ]


# ---- memory and collectives ------------------------------------------------------------------------

def memory_frame(result: ParallelResult) -> pd.DataFrame:
    """Weights and KV cache (allocated for the lab's whole context) on one rank of the TP = 1 run and on each
    rank of the sharded one, measured from the tensors."""
    one, many = result.single, result.sharded
    rows = [{"Where": "TP = 1: the one GPU", "Weights (MiB)": one.weight_bytes_per_rank[0] / MIB,
             "KV cache (MiB)": one.cache_bytes_per_rank[0] / MIB}]
    rows += [{"Where": f"TP = {many.tp}: rank {r}", "Weights (MiB)": w / MIB, "KV cache (MiB)": c / MIB}
             for r, (w, c) in enumerate(zip(many.weight_bytes_per_rank, many.cache_bytes_per_rank))]
    return pd.DataFrame(rows)


def replicated_bytes(result: ParallelResult) -> int:
    """What each rank holds in full (the norms): the sharded ranks' total minus the single copy is tp - 1 extra
    copies of it (the page once printed that total as the size of one copy, twice the norms at TP = 3)."""
    extra_copies = len(result.sharded.weight_bytes_per_rank) - 1
    surplus = sum(result.sharded.weight_bytes_per_rank) - result.single.weight_bytes_per_rank[0]
    return surplus // extra_copies if extra_copies else 0


SITE_LABELS = {"embed": "all-reduce · embedding",
               "attn": "all-reduce · after attention (W_o)",
               "mlp": "all-reduce · after the MLP (down)",
               "logits": "all-gather · logits (vocab slices)"}


def collective_counts(gen: Generation) -> Counter:
    return Counter(kind for kind, _site, _payload in gen.collective_sites)


def collective_frame(gen: Generation) -> pd.DataFrame:
    """One decode step's collectives grouped by where they sit, with the ring formulas' bytes sent per rank."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for kind, site, payload in gen.collective_sites:
        groups.setdefault(site.split(".")[0], []).append((kind, payload))
    rows = []
    for key, calls in groups.items():
        kind, payload = calls[0]
        sent = ring_all_reduce_bytes(payload, gen.tp) if kind == "all_reduce" else all_gather_bytes(payload, gen.tp)
        rows.append({"Collective": SITE_LABELS.get(key, key), "Per step": len(calls), "Bytes each": payload,
                     "Sent by a rank": sent * len(calls)})
    return pd.DataFrame(rows, columns=["Collective", "Per step", "Bytes each", "Sent by a rank"])


# ---- compute per forward pass ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PassTimes:
    """Milliseconds of one forward pass (the prefill, or the median decode step), measured here."""

    label: str
    one_rank: float  # TP = 1: the whole model
    per_rank: tuple[float, ...]  # each TP rank's own compute
    critical: float  # per segment the slowest rank, summed: the pass on tp GPUs without the wire
    serial: float  # every rank in turn: what this process spent


def _median_ms(steps: list[StepCost], pick) -> float:  # noqa: ANN001 (StepCost -> float)
    return statistics.median(pick(s) for s in steps) * 1e3


def pass_times(result: ParallelResult) -> list[PassTimes]:
    one, many = result.single.steps, result.sharded.steps
    out = [PassTimes(f"prefill ({result.prompt_tokens} tokens)", one[0].serial_seconds * 1e3,
                     tuple(s * 1e3 for s in many[0].rank_seconds), many[0].critical_seconds * 1e3,
                     many[0].serial_seconds * 1e3)]
    if len(one) > 1 and len(many) > 1:
        d1, dn = list(one[1:]), list(many[1:])
        out.append(PassTimes(f"decode step (median of {len(dn)})", _median_ms(d1, lambda s: s.serial_seconds),
                             tuple(_median_ms(dn, lambda s, r=r: s.rank_seconds[r]) for r in range(result.sharded.tp)),
                             _median_ms(dn, lambda s: s.critical_seconds), _median_ms(dn, lambda s: s.serial_seconds)))
    return out


# ---- the H200 bench and the projected wire ---------------------------------------------------------

@dataclass(frozen=True, slots=True, eq=False)
class H200Bench:
    device: str
    torch: str
    gpus: int
    context: int
    dtype: str
    tp_decode: pd.DataFrame  # tp, rank, batch, eager_ms, graph_ms
    pp_stage: pd.DataFrame  # pp, stage, first_layer, last_layer, batch, graph_ms
    all_reduce: pd.DataFrame  # ranks, bytes, us (empty with one GPU)
    # the engine's own decode step (fused Triton kernels, CUDA graphs, host scheduling included) on one rank's or
    # one stage's shapes: kind ("tp" or "pp"), degree, layers, batch, step_ms; empty in older files
    engine: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["kind", "degree", "layers", "batch",
                                                                            "step_ms"]))


def load_h200(path: Path = H200_BENCH) -> H200Bench | None:
    """bench/parallel.py's H200 results, or None when the file is missing or not what the bench writes."""
    try:
        data = json.loads(Path(path).read_text())
        tp = pd.DataFrame([{"tp": int(r["tp"]), "rank": int(r["rank"]), "batch": int(r["batch"]),
                            "eager_ms": float(r["eager_ms"]), "graph_ms": float(r["graph_ms"])}
                           for r in data["tp_decode"]], columns=["tp", "rank", "batch", "eager_ms", "graph_ms"])
        pp = pd.DataFrame([{"pp": int(r["pp"]), "stage": int(r["stage"]), "first_layer": int(r["first_layer"]),
                            "last_layer": int(r["last_layer"]), "batch": int(r["batch"]),
                            "graph_ms": float(r["graph_ms"])} for r in data.get("pp_stage", [])],
                          columns=["pp", "stage", "first_layer", "last_layer", "batch", "graph_ms"])
        ar = pd.DataFrame([{"ranks": int(r["ranks"]), "bytes": int(r["bytes"]), "us": float(r["us"])}
                           for r in data.get("all_reduce", [])], columns=["ranks", "bytes", "us"])
        eng = pd.DataFrame([{"kind": str(r["kind"]), "degree": int(r["degree"]), "layers": int(r["layers"]),
                             "batch": int(r["batch"]), "step_ms": float(r["step_ms"])} for r in data.get("engine_rank", [])],
                           columns=["kind", "degree", "layers", "batch", "step_ms"])
        if tp.empty:
            return None
        return H200Bench(str(data.get("device", "H200")), str(data.get("torch", "")), int(data.get("gpus", 1)),
                         int(data.get("context", 0)), str(data.get("dtype", "")), tp, pp, ar, eng)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def tp_projection(bench: H200Bench, tp: int, all_reduces: int, gathers: int, latency_us: float) -> pd.DataFrame:
    """Per batch: one GPU's whole decode step (TP = 1) and the slowest rank's share at `tp` (both measured, as
    CUDA graphs), and that share plus the collectives at an ASSUMED latency each (not measured: one GPU)."""
    g = bench.tp_decode
    one = g[g["tp"] == 1].groupby("batch")["graph_ms"].min()
    rank = g[g["tp"] == tp].groupby("batch")["graph_ms"].max()
    batches = sorted(set(one.index) & set(rank.index))
    wire_ms = (all_reduces + gathers) * latency_us / 1e3
    return pd.DataFrame([{"batch": b, "tp1_ms": float(one[b]), "rank_ms": float(rank[b]), "wire_ms": wire_ms,
                          "projected_ms": float(rank[b]) + wire_ms} for b in batches],
                        columns=["batch", "tp1_ms", "rank_ms", "wire_ms", "projected_ms"])


def batches_where_tp_pays(proj: pd.DataFrame) -> list[int]:
    """The batches of a `tp_projection` at which a rank's share plus the collectives beats one GPU."""
    return [int(b) for b in proj.loc[proj["projected_ms"] < proj["tp1_ms"], "batch"]]


@dataclass(frozen=True, slots=True)
class ProcessRun:
    """bench/parallel.py on the CPU: the real model tensor-parallel over real processes (gloo), one rank each."""

    tp: int
    same_tokens: bool  # as the ranks taking turns in one process
    decode_compute_ms: float  # rank 0, median decode step
    decode_wire_ms: float  # rank 0's time in the step's collectives, waiting for the others included
    collectives: int
    one_process_critical_ms: float  # the same step in one process: per segment the slowest rank, summed
    all_reduce_us: dict[int, float]  # ranks -> gloo all-reduce of one token's hidden state (fp32), microseconds
    cores: int | None  # the machine's CPU cores when benched (None: not recorded)


def load_process_run(path: Path = CPU_BENCH) -> ProcessRun | None:
    """The first `distributed` row of the CPU bench and its smallest gloo all-reduces, or None."""
    try:
        data = json.loads(Path(path).read_text())
        row = data["distributed"][0]
        small = {}
        for r in data.get("all_reduce", []):
            if r.get("backend") == "gloo" and (int(r["ranks"]) not in small or int(r["bytes"]) < small[int(r["ranks"])][0]):
                small[int(r["ranks"])] = (int(r["bytes"]), float(r["us"]))
        return ProcessRun(int(row["tp"]), bool(row["same_tokens_as_one_process"]), float(row["decode_compute_ms"]),
                          float(row["decode_wire_ms"]), int(row["collectives_per_step"]),
                          float(row["one_process_critical_ms"]), {k: v[1] for k, v in sorted(small.items())},
                          data.get("cpu_cores"))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def engine_tp_ms(bench: H200Bench, tp: int) -> dict[int, tuple[float, float]]:
    """batch -> (the engine's whole step at TP = 1, its step on one rank's shapes at `tp`), where both were run."""
    e = bench.engine[bench.engine["kind"] == "tp"]
    one = dict(zip(e[e["degree"] == 1]["batch"], e[e["degree"] == 1]["step_ms"]))
    rank = dict(zip(e[e["degree"] == tp]["batch"], e[e["degree"] == tp]["step_ms"]))
    return {int(b): (float(one[b]), float(rank[b])) for b in sorted(set(one) & set(rank))}


def h200_stage_ms(bench: H200Bench, pp: int, batch: int = 1) -> list[float] | None:
    """Each stage's measured decode step at `pp` stages and `batch` (CUDA graphs), or None when not benched."""
    rows = bench.pp_stage[(bench.pp_stage["pp"] == pp) & (bench.pp_stage["batch"] == batch)].sort_values("stage")
    return [float(v) for v in rows["graph_ms"]] if len(rows) == pp and pp > 1 else None


def break_even_latency_us(row: pd.Series, collectives: int) -> float:
    """The all-reduce latency at which TP's saved compute is all spent on the wire."""
    return max(0.0, (row["tp1_ms"] - row["rank_ms"]) * 1e3 / max(collectives, 1))


def tp_floor_frame(model: DenseShape, batch: int, context: int, bytes_per_s: float, memory_bytes: float,
                   latency_us: float, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> pd.DataFrame:
    """The decode-step floor of a published dense model per TP degree (engine/parallel/tp_scaling.py)."""
    rows = [tp_floor(model, tp, batch, context, bytes_per_s, memory_bytes, latency_us) for tp in degrees]
    return pd.DataFrame([{"tp": f.tp, "weights_gb": f.weights_gb, "kv_gb": f.kv_gb, "read_ms": f.read_ms,
                          "wire_ms": f.wire_ms, "step_ms": f.step_ms, "fits": f.fits} for f in rows])


def floor_fit_text(frame: pd.DataFrame, memory_bytes: float) -> str:
    """Which degree to take, or what does not fit at the largest: its weights alone, or its weights with the KV
    cache of this batch and context ("no degree fits its weights" was said of 405B at TP = 8, whose ~95 GiB of
    weights a GPU fit; its 505 GiB of KV cache did not)."""
    best = frame[frame["fits"]].sort_values("step_ms").head(1)
    if len(best):
        return f"the fastest that fits is TP = {int(best['tp'].iloc[0])} at {best['step_ms'].iloc[0]:.1f} ms a token"
    top = frame.sort_values("tp").iloc[-1]
    tp, weights, kv = int(top["tp"]), float(top["weights_gb"]) * 1e9, float(top["kv_gb"]) * 1e9
    if weights > memory_bytes:
        return (f"no degree up to {tp} fits even its weights on H200s ({fmt_bytes(weights)} a GPU at TP = {tp}, "
                f"against {fmt_bytes(memory_bytes)})")
    return (f"no degree up to {tp} fits: at TP = {tp} its weights fit ({fmt_bytes(weights)} a GPU), but not with "
            f"the KV cache of this batch and context ({fmt_bytes(kv)} more, {fmt_bytes(weights + kv)} in all, "
            f"against {fmt_bytes(memory_bytes)}); fewer sequences or a shorter context could fit")


def tp1_memory_text(tp_options_ok: list[int]) -> str:
    """The memory paragraph at TP = 1, where "each rank holds 100.0 % of the weights ... that is what lets a model
    too large for one GPU run at all" said the opposite of what one rank shows."""
    split = [d for d in tp_options_ok if d > 1]
    pick = f" Pick {' or '.join(map(str, split))} in the form to see it." if split else ""
    return ("**Memory.** At TP = 1 one rank holds all the weights and the whole KV cache: nothing is saved. Split "
            "over p ranks, each would hold about 1/p of the matrices (the norms copied to every rank) and 1/p of "
            "the KV heads, which is what lets a model too large for one GPU run at all." + pick)


# ---- the pipeline ----------------------------------------------------------------------------------

def stage_frame(result: ParallelResult, hop_seconds: float) -> pd.DataFrame:
    run, summary = result.pipeline, result.pipeline_summary(hop_seconds)
    rows = []
    for s, (a, b) in enumerate(run.stages):
        extra = [x for x, on in (("embedding", s == 0), ("LM head", s == run.pp - 1)) if on]
        work = sum(t.seconds for t in run.tasks if t.stage == s)
        rows.append({"GPU": s, "Layers": f"{a}–{b - 1}", "Also": " + ".join(extra) or NO_VALUE,
                     "Compute (ms)": work * 1e3, "Busy (%)": 100 * summary.busy_fraction[s]})
    return pd.DataFrame(rows)


def lm_head_layers(cfg: ModelConfig) -> float:
    """The LM head's weights in layers' worth of matrices: what the last stage carries on top of its layers."""
    h, d = cfg.hidden_size, cfg.head_dim
    layer = 2 * h * cfg.num_heads * d + 2 * h * cfg.num_kv_heads * d + 3 * h * cfg.intermediate_size
    return cfg.vocab_size * h / layer


def stage_label(run: PipelineRun, stage: int) -> str:
    a, b = run.stages[stage]
    return f"GPU {stage}: layers {a}–{b - 1}" + (" + LM head" if stage == run.pp - 1 else "")


@dataclass(frozen=True, slots=True)
class TokenLatency:
    """One decode token of the first request, all stages one after another: on pp GPUs the hops add to it."""

    one_device_ms: float
    pipelined_ms: float
    hops: int


def token_latency(run: PipelineRun, hop_seconds: float) -> TokenLatency:
    steps = sorted({t.step for t in run.tasks if t.micro == 0 and t.step > 0})
    if not steps:  # one token only: the prefill is all there is
        steps = [0]
    per_step = [sum(t.seconds for t in run.tasks if t.micro == 0 and t.step == s) for s in steps]
    work = statistics.median(per_step) * 1e3
    hops = run.pp if run.pp > 1 else 0  # pp - 1 forward, and the sampled token back to the first stage
    return TokenLatency(work, work + hops * hop_seconds * 1e3, hops)


# ---- expert parallelism (arithmetic) ---------------------------------------------------------------

def ep_fits(m: MoeShape, gpus: int) -> bool:
    """Whole experts per GPU: EP over more GPUs than experts would have to split an expert (that is TP)."""
    return gpus <= m.experts and m.experts % gpus == 0


def ep_frame(gpus: tuple[int, ...] = EP_GPUS) -> pd.DataFrame:
    rows = []
    for m in MOE_MODELS:
        for g in gpus:
            if not ep_fits(m, g):
                continue
            c = ep_cost(m, g)
            rows.append({"Model": m.name, "GPUs": g, "Experts per GPU": m.experts // g,
                         "EP weights per GPU (GiB)": c.weight_gb_per_gpu_ep * 1e9 / GIB,
                         "TP weights per GPU (GiB)": c.weight_gb_per_gpu_tp * 1e9 / GIB,
                         "EP all-to-all per token (KB)": c.a2a_bytes_per_token / 1e3,  # traffic: decimal
                         "TP all-reduce per token (KB)": c.tp_bytes_per_token / 1e3})
    return pd.DataFrame(rows)


def model_named(name: str) -> MoeShape:
    return next(m for m in MOE_MODELS if m.name == name)


def imbalance_curve(m: MoeShape, gpus: int, skews: tuple[float, ...],
                    tokens: tuple[int, ...] = ROUTING_TOKENS, draws: int = ROUTING_DRAWS) -> pd.DataFrame:
    """Busiest GPU over the mean, by tokens in the batch, for each skew."""
    rows = []
    for skew in skews:
        for t in tokens:
            r = routing_imbalance(t, m.experts, m.top_k, gpus, skew, draws=draws)
            rows.append({"skew": skew, "tokens": t, "mean": r.mean_per_gpu, "busiest": r.max_per_gpu_mean,
                         "ratio": r.ratio})
    return pd.DataFrame(rows, columns=["skew", "tokens", "mean", "busiest", "ratio"])


# ---- the run as JSON -------------------------------------------------------------------------------

def _gen(g: Generation, text: str) -> dict:
    return {"tp": g.tp, "text": text, "tokens": [list(t) for t in g.tokens],
            "weight_bytes_per_rank": list(g.weight_bytes_per_rank), "cache_bytes_per_rank": list(g.cache_bytes_per_rank),
            "collectives_per_decode_step": dict(collective_counts(g)),
            "steps": [{"step": s.step, "tokens": s.tokens, "rank_seconds": list(s.rank_seconds),
                       "critical_seconds": s.critical_seconds, "serial_seconds": s.serial_seconds,
                       "collectives": s.collectives, "sent_bytes_per_rank": s.sent_bytes_per_rank} for s in g.steps]}


def result_json(result: ParallelResult, hop_seconds: float) -> str:
    s, run = result.settings, result.pipeline
    summary = result.pipeline_summary(hop_seconds)
    return json.dumps({
        "settings": {"prompt": s.prompt, "max_new_tokens": s.max_new_tokens, "tp": s.tp, "pp": s.pp,
                     "micro_batches": s.micro_batches, "pipeline_tokens": s.pipeline_tokens},
        "measured_on": "the CPU, ranks and stages taking turns in one process, each timed; fp32",
        "prompt_tokens": result.prompt_tokens, "same_tokens": result.same_tokens,
        "single": _gen(result.single, result.single_text), "sharded": _gen(result.sharded, result.sharded_text),
        "pipeline": {"pp": run.pp, "stages": [list(x) for x in run.stages], "assumed_hop_seconds": hop_seconds,
                     "prompts": list(result.pipeline_prompts), "texts": list(result.pipeline_texts),
                     "tasks": [{"request": t.micro, "step": t.step, "stage": t.stage, "seconds": t.seconds,
                                "activation_bytes": t.activation_bytes} for t in run.tasks],
                     "summary": {"makespan_seconds": summary.makespan, "one_device_seconds": summary.one_device,
                                 "busy_fraction": list(summary.busy_fraction), "bubble": summary.bubble,
                                 "textbook_bubble": summary.textbook_bubble}},
    }, indent=1)
