"""Sections of the serving-parallelism page (pages/19_parallelism.py composes them)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from engine.config import ModelConfig
from engine.parallel.expert_math import MOE_MODELS
from engine.parallel.lab import (MAX_MICRO_BATCHES, MAX_NEW_TOKENS, MAX_PIPELINE_TOKENS, MAX_PROMPT_CHARS,
                                 PREFILL_TIMINGS, ParallelResult, ParallelSettings, run_parallel_lab)
from engine.parallel.plan import MAX_PP, MAX_TP
from engine.parallel.tp_scaling import DENSE_MODELS
from kernels.ceilings import REFERENCE_CEILINGS

from app.analysis.parallelism import (BENCH_COMMAND, CPU_BENCH, CPU_BENCH_COMMAND, EP_GPUS, H200_BENCH, ROUTING_DRAWS,
                                      ROUTING_TOKENS, allowed_degrees, batches_where_tp_pays, break_even_latency_us,
                                      collective_counts, collective_frame, degree_frame, engine_tp_ms, ep_fits,
                                      ep_frame, floor_fit_text, h200_stage_ms, imbalance_curve, lm_head_layers,
                                      load_h200, load_process_run, memory_frame, model_named, pass_times,
                                      replicated_bytes, result_json, split_rows, stage_frame, token_latency,
                                      tp1_memory_text, tp_floor_frame, tp_projection)
from app.charts.parallelism import (ep_figure, gantt_figure, imbalance_figure, memory_figure, pass_figure,
                                    projection_figure, rank_color, split_figure, tp_floor_figure)
from app.formatting import batches_text, fmt_bytes, fmt_duration, plural
from app.runtime import device, device_label, shared_weights, weights_mode
from app.state import page_run, page_settings, progress_reporter, submitted_settings
from app.theme import REQUEST_COLORS, show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation


H200_FILE = H200_BENCH  # bench/parallel.py's output (a module attribute, so tests can point it elsewhere)
CPU_FILE = CPU_BENCH


@dataclass(frozen=True, slots=True)
class PageSettings:
    """The lab's settings as the form hands them to `submitted_settings`, whose `check()` takes no model: the
    degrees are checked against the live model's shape here."""

    lab: ParallelSettings

    def check(self) -> None:
        try:
            self.lab.check(shared_weights().config)
        except ValueError as e:  # submitted_settings ends the message with its own full stop
            raise ValueError(str(e).rstrip(".")) from None


def par_explanation() -> None:
    explanation(
        "Three ways to cut a model across GPUs",
        [r"\text{TP: } Y = \textstyle\sum_{r=1}^{p} \big(X W^{\text{in}}_{r}\big) W^{\text{out}}_{r}"
         r"\quad\text{(one all-reduce)}",
         r"\text{collectives per token} = 2L + 2",
         r"\text{per-GPU memory} \approx |W| / p",
         r"\text{PP bubble} = \frac{p - 1}{m + p - 1}\quad (m \text{ micro-batches})",
         r"\text{EP: } \tfrac{E}{p} \text{ whole experts per GPU}",
         r"\text{all-to-all per token} \approx 2k\,\tfrac{p-1}{p}\,d"],
        ["**Tensor parallelism** splits every matrix: each GPU holds some heads and some MLP channels, computes its "
         "part of every layer, and the partial sums meet in an **all-reduce twice per layer**, on every decode "
         "step. Less compute and memory per GPU, a lower latency, if the wire is fast (NVLink).",
         "**Pipeline parallelism** gives each GPU a run of whole layers. Activations hop from stage to stage once "
         "per stage, not per layer, but a token still crosses every layer in turn: latency does not drop, "
         "throughput rises only when several requests are in flight.",
         "**Expert parallelism** (MoE models) puts whole experts on each GPU and sends each token to the GPUs of "
         "the experts its router picked: two all-to-alls per MoE layer, and the busiest GPU sets the pace.",
         "Below, the live model runs sharded over TP ranks and through PP stages on this CPU, every rank and stage "
         "timed; then the H200 figures, and expert parallelism in arithmetic."],
        note="p: GPUs in the group, L: layers, m: requests (micro-batches) in the pipeline, E experts of which a "
             "token's router picks k, d: the hidden size. W_in is split by columns (q, k, v, gate, up), W_out by rows "
             "(o, down), so each rank's part needs no communication until the sum.")


def backend_line() -> None:
    where = ("" if device() == "cpu" else f" (this server's engine runs on {device_label()}; this lab stays on the "
             "CPU, where several ranks fit in one process)")
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) · **on the CPU in fp32**"
               f"{where} · the ranks of the tensor-parallel group and the pipeline's stages **take turns in one "
               "process**, each timed on its own; what separate GPUs would take is laid out from those times · the "
               "wire between GPUs is **not** measured here.")


# ---- settings ------------------------------------------------------------------------------------

def _key(page: str, name: str) -> str:
    return f"{page}-{name}"


def settings_form(page: str) -> ParallelSettings:
    """The form; returns the settings to run (the last that passed: a rejected form keeps them, with its message)."""
    shown: PageSettings = page_settings(page, lambda: PageSettings(ParallelSettings()))
    s = shown.lab
    ok = set(allowed_degrees(shared_weights().config))
    with st.form(f"{page}-form", border=True):
        prompt = st.text_input("Prompt (a chat message; the first pipeline request too)", s.prompt,
                               key=_key(page, "prompt"), help=f"up to {MAX_PROMPT_CHARS:,} characters")
        c = st.columns(5)
        new_tokens = c[0].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, s.max_new_tokens,
                                       key=_key(page, "new-tokens"), help="greedy, on one rank and on TP ranks")
        tp = c[1].selectbox("Tensor-parallel degree", list(range(1, MAX_TP + 1)), index=s.tp - 1,
                            format_func=lambda d: ("1 (one rank: not split)" if d == 1 else f"{d}" if d in ok
                                                   else f"{d} (does not split)"),
                            key=_key(page, "tp"), help="ranks the model is split over; try one that does not split")
        pp = c[2].selectbox("Pipeline stages", list(range(1, MAX_PP + 1)), index=s.pp - 1, key=_key(page, "pp"))
        micro = c[3].number_input("Requests in the pipeline", 1, MAX_MICRO_BATCHES, s.micro_batches,
                                  key=_key(page, "micro"), help="one micro-batch each, all in flight at once")
        ptokens = c[4].number_input("Tokens per pipeline request", 1, MAX_PIPELINE_TOKENS, s.pipeline_tokens,
                                    key=_key(page, "ptokens"))
        submitted = st.form_submit_button("Shard, pipeline and measure", icon=":material/play_arrow:", type="primary")
    candidate = PageSettings(ParallelSettings(str(prompt), int(new_tokens), int(tp), int(pp), int(micro),
                                              int(ptokens))) if submitted else None
    return submitted_settings(page, candidate).lab


def get_result(page: str, s: ParallelSettings) -> ParallelResult | None:
    def run(bar) -> ParallelResult:  # noqa: ANN001 (a Streamlit progress bar)
        return run_parallel_lab(shared_weights(), s, progress_reporter(bar))

    return page_run(page, s, run, "Sharding the model…", "The run failed")


# ---- which degrees -------------------------------------------------------------------------------

def degrees_section(cfg: ModelConfig) -> None:
    st.subheader("Which degrees this model allows")
    ok = ", ".join(str(d) for d in allowed_degrees(cfg))
    st.markdown(f"Each rank must hold **whole attention heads**: a head's softmax runs over its full {cfg.head_dim} "
                f"dimensions, so splitting a head would need a collective inside attention. With **{cfg.num_heads} "
                f"query heads and {cfg.num_kv_heads} KV heads**, only **{ok}** divide both. The "
                f"{cfg.intermediate_size:,} MLP channels and {cfg.vocab_size:,} vocabulary rows split almost any way.")
    st.dataframe(degree_frame(cfg), hide_index=True, width="stretch", column_config={
        "TP degree": st.column_config.NumberColumn(width="small"),
        "Splits evenly": st.column_config.CheckboxColumn(width="small"),
        "Does not divide evenly": st.column_config.TextColumn(width="large")})
    st.caption("Large models are shaped for this: 64 query and 8 KV heads split over 2, 4 or 8 GPUs. Beyond the "
               "KV-head count, serving engines copy KV heads onto several ranks instead.")


# ---- tensor parallelism --------------------------------------------------------------------------

def tp_answers_section(result: ParallelResult) -> None:
    tp = result.settings.tp
    decode = shared_weights().tokenizer.decode
    if tp == 1:  # one rank against one rank compares nothing: "the same 1 token on 1 and on 1 ranks"
        st.subheader("Tensor parallelism, live: TP = 1, one rank, nothing split")
        answer_rows([("TP = 1", "#6B7280", result.single.tokens[0])], result.single.tokens[0], decode, "par")
        split = [d for d in allowed_degrees(shared_weights().config) if d > 1]
        st.info("At TP = 1 one rank holds the whole model, so there is no split to compare with and no collective "
                "on the wire." + (f" Pick {' or '.join(map(str, split))} in the form to split it over ranks and "
                                  "compare their answer with this one." if split else ""), icon=":material/info:")
        return
    st.subheader(f"Tensor parallelism, live: one rank against {tp}")
    answer_rows([("TP = 1", "#6B7280", result.single.tokens[0]),
                 (f"TP = {tp}", rank_color(0), result.sharded.tokens[0])], result.single.tokens[0], decode, "par")
    n = len(result.single.tokens[0])
    if result.same_tokens:
        st.success(f"**The same {plural(n, 'token')} on 1 and on {tp} ranks.** Each rank adds up part of every "
                   "matrix product and the all-reduce adds the parts: the same sums in another order, far below "
                   "what flips a greedy choice.", icon=":material/check_circle:")
    else:
        st.warning(f"**The answers part** within {plural(n, 'token')}: the sharded sums are added in another order, "
                   "and a near-tie between two tokens was decided by rounding.", icon=":material/compare_arrows:")


def tp_layout_section(result: ParallelResult, page: str) -> None:
    cfg, tp, sharded = shared_weights().config, result.settings.tp, result.sharded
    show_figure(split_figure(split_rows(cfg, tp), tp), key=f"{page}-split", height=430)
    st.caption("Column-parallel first (W_q, W_k, W_v, gate, up: each rank its own output rows, no communication), "
               "then row-parallel (W_o, down: each rank a partial sum of the whole hidden state): one all-reduce "
               "closes each pair. The norms are copied to every rank.")
    left, right = st.columns([1, 1.2], gap="large")
    with left:
        show_figure(memory_figure(memory_frame(result)), key=f"{page}-memory", height=430, export_width=700)
    with right:
        w1, wn = result.single.weight_bytes_per_rank[0], max(sharded.weight_bytes_per_rank)
        if tp == 1:
            st.markdown(tp1_memory_text(allowed_degrees(cfg)))
        else:
            st.markdown(f"**Memory.** Each rank holds {wn / w1:.1%} of the weights "
                        f"({fmt_bytes(replicated_bytes(result))} copied to every rank: the norms) and 1/{tp} of the "
                        "KV cache: only its KV heads. That is what lets a model too large for one GPU run at all, and "
                        "leaves room on each GPU for a larger batch or longer contexts.")
        counts = collective_counts(sharded)
        st.markdown(f"**The price: one decode step's collectives** at TP = {tp}: "
                    + (f"{counts.get('all_reduce', 0)} all-reduces and {counts.get('all_gather', 0)} all-gather, "
                       "whatever the batch size. One token's hidden state is "
                       f"{cfg.hidden_size} numbers, {cfg.hidden_size * 2:,} bytes at bf16: the messages are tiny, so "
                       "each collective costs its **latency** (microseconds of synchronisation), not bandwidth."
                       if tp > 1 else "none: one rank talks to no one."))
    if tp > 1:
        # Full width: beside the chart, the byte columns were cut off at a projector's 1280 pixels.
        st.dataframe(collective_frame(sharded), hide_index=True, width="stretch", column_config={
            "Per step": st.column_config.NumberColumn(help="collectives of this kind in one decode step"),
            "Bytes each": st.column_config.NumberColumn(format="localized",
                                                        help="the tensor each rank ends with, at bf16"),
            "Sent by a rank": st.column_config.NumberColumn(
                format="localized", help="bytes, all of that kind in one step; ring: 2(p−1)/p × payload for an "
                                         "all-reduce, (p−1)/p × payload for an all-gather")})


def tp_timing_section(result: ParallelResult, page: str) -> None:
    tp = result.settings.tp
    times = pass_times(result)
    show_figure(pass_figure(times, tp), key=f"{page}-passes", height=440)
    decode = times[-1]
    st.caption(
        f"On this CPU the {tp} ranks take turns in one process, each timed segment by segment (between two "
        f"collectives). **On {tp} GPUs** they would run at once: per segment the slowest rank, summed "
        f"({decode.critical:.1f} ms per decode step here), and then the wire, which these bars leave out. "
        f"**Here** they ran one after another ({decode.serial:.1f} ms), no faster than one rank with the whole "
        f"model ({decode.one_rank:.1f} ms). A decode step's compute on {tp} GPUs would be "
        f"{decode.critical / max(decode.one_rank, 1e-9):.0%} of one GPU's, not 1/{tp}: its matmuls are small, and "
        "each rank pays the same fixed costs per call. The prefill's larger matmuls divide better. Every bar is a "
        f"median: the prefill's of {PREFILL_TIMINGS} passes (after one untimed warm-up), the decode's of its steps."
        if tp > 1 else
        "At TP = 1 there is one rank: choose "
        + " or ".join(str(d) for d in allowed_degrees(shared_weights().config) if d > 1)
        + " in the form to split the model.")


def processes_section() -> None:
    """The one wire measured here: the same model over real CPU processes (bench/parallel.py)."""
    run = load_process_run(CPU_FILE)
    if run is None:
        st.caption(f"`{CPU_BENCH_COMMAND}` also runs the model over real processes here, one rank each, through "
                   "torch.distributed; its results are not in this checkout.")
        return
    ar = ", ".join(f"{us / 1e3:.1f} ms over {n} processes" for n, us in run.all_reduce_us.items())
    cores = f"{run.cores} cores" if run.cores else "this machine's cores"
    st.markdown(
        f"**A real wire, on this machine.** The bench (a separate, earlier run: its times are not the chart's "
        f"above, as CPU timings move with whatever else the host is doing) ran the model at TP = {run.tp} as "
        f"{run.tp} separate processes, "
        f"one rank each, with torch.distributed's CPU backend (gloo) carrying the collectives. "
        f"{'**The same tokens**' if run.same_tokens else '**Different tokens**'} as the ranks taking turns in one "
        f"process. A decode step took rank 0 **{run.decode_compute_ms:.1f} ms of compute** (in the bench's "
        f"one-process run the slowest rank per segment summed to {run.one_process_critical_ms:.1f} ms) and "
        f"**{run.decode_wire_ms:.1f} ms in its {run.collectives} collectives**. One all-reduce of one token's hidden "
        f"state took {ar}.")
    st.caption(f"Processes on a shared CPU ({cores}; {run.tp} processes on fewer cores wait for one another) and "
               "loopback sockets are a slow wire; NVLink between GPUs is built for this and far faster (not measured "
               "here). The lesson carries over: the per-step collectives cost latency, whatever the batch, and the "
               f"slowest rank sets each one's pace. `{CPU_BENCH_COMMAND}` measures it.")


def wire_section(result: ParallelResult, page: str) -> float:
    """Returns the assumed all-reduce latency in µs (the next section prices a big model's wire with it)."""
    st.subheader("The wire: what the collectives cost on a GPU")
    processes_section()
    bench = load_h200(H200_FILE)
    counts = collective_counts(result.sharded)
    reduces, gathers = counts.get("all_reduce", 0), counts.get("all_gather", 0)
    latency = st.slider("Assumed latency of one all-reduce (µs), an assumption, not a measurement", 1, 50, 10,
                        key=_key(page, "latency"), help="NCCL over NVLink within a node: roughly 5–20 µs for a "
                        "few kB; the all-gather of the logits is charged the same")
    if bench is None:
        st.info(f"**No H200 measurement here yet**: bench/results/parallel_h200.json is missing (`{BENCH_COMMAND}` "
                "on a GPU machine writes it). The page shows the CPU figures above only.", icon=":material/info:")
        st.caption(f"At {latency} µs each, one decode step's {reduces + gathers} collectives would add "
                   f"{(reduces + gathers) * latency / 1e3:.2f} ms to every step on GPUs, whatever the batch.")
        return latency
    tp = result.settings.tp if result.settings.tp > 1 else 3
    proj = tp_projection(bench, tp, reduces or 2 * shared_weights().config.num_layers + 1, gathers or 1, latency)
    if proj.empty:
        st.info(f"The H200 file has no TP = {tp} rows.", icon=":material/info:")
        return latency
    n = int(proj["wire_ms"].iloc[0] * 1e3 / latency) if latency else 0
    show_figure(projection_figure(proj, tp, latency, n), key=f"{page}-h200", height=440)
    small = proj.iloc[0]
    st.caption(
        f"Measured on one {bench.device} ({bench.dtype}, random weights, {bench.context} tokens of context, "
        f"torch {bench.torch}): one rank's share of a decode step at TP = {tp} (this page's per-rank functions in "
        f"plain torch, about 60 small kernels a layer) as a CUDA graph, against the whole step at TP = 1. **The all-reduces were not measured**: only one-GPU machines were lent, so the hatched "
        f"part is {n} × the latency you set. At batch {int(small['batch'])} TP saves "
        f"{(small['tp1_ms'] - small['rank_ms']) * 1e3:,.0f} µs of compute per step: it breaks even at "
        f"{break_even_latency_us(small, n):.1f} µs per collective. " + _where_tp_pays(proj, latency))
    eng = engine_tp_ms(bench, tp)
    if eng:
        parts = "; ".join(f"batch {b}: {one:.2f} ms whole, {rank:.2f} ms a rank" for b, (one, rank) in eng.items())
        st.caption(f"The same shapes through **this engine's own decode step** (fused Triton kernels replayed as CUDA "
                   f"graphs, the host's scheduling included, on the {bench.device}): {parts}. "
                   + _rank_speedup_text(eng, tp))
    if not bench.all_reduce.empty:
        st.dataframe(bench.all_reduce.rename(columns={"ranks": "GPUs", "bytes": "Bytes", "us": "µs (measured)"}),
                     hide_index=True)
    return latency


def _where_tp_pays(proj: pd.DataFrame, latency_us: float) -> str:
    """Which batches the chart shows TP ahead at, in words: at the largest batches a 135M model's step has
    enough compute to split, so 'too small to gain' is only true of the small ones."""
    wins = batches_where_tp_pays(proj)
    big = ("A 70B model's step is tens of milliseconds of compute even at batch 1, so there the same collectives "
           "are a small price (the next section does the arithmetic).")
    if not wins:
        return f"At {latency_us:g} µs per collective TP loses at every batch measured: this model is too small. " + big
    if len(wins) == len(proj):
        return f"At {latency_us:g} µs per collective TP is ahead at every batch measured. " + big
    last = proj.loc[proj["batch"] == wins[-1]].iloc[0]
    saved = f"{(last['tp1_ms'] - last['projected_ms']) * 1e3:,.0f} µs a step"
    where = f"{batches_text(wins)} (by {saved}{'' if len(wins) == 1 else f' at {wins[-1]:,}'})"
    return (f"At {latency_us:g} µs per collective TP is ahead only at {where}, where the step has enough compute "
            "to split; at smaller batches this model is too small to gain. " + big)


def _rank_speedup_text(eng: dict[int, tuple[float, float]], tp: int) -> str:
    """How much faster a rank's share of the engine's step is than the whole step, per the measured batches."""
    ratio = {b: one / rank for b, (one, rank) in eng.items() if rank > 0}
    if not ratio:
        return ""
    best = max(ratio, key=ratio.__getitem__)
    slow = [b for b, r in ratio.items() if r <= 1.0]
    text = (f"A rank's kernels have 1/{tp} of the heads, channels and vocabulary to spread over the GPU, so at this "
            f"model's size a rank is at most {ratio[best]:.2f}× as fast as the whole step (batch {best:,}), far "
            f"from {tp}×")
    if slow:
        text += f", and at {batches_text(slow)} it is no faster at all"
    return text + "."


def tp_pays_section(page: str, latency_us: float) -> None:
    """Where TP pays: a published dense model's decode-step floor per TP degree, in arithmetic."""
    st.markdown("**Where tensor parallelism pays.** A large model's decode step at small batch is bound by reading "
                "its weights and KV cache; TP divides those bytes over the GPUs and adds the same "
                "2 collectives per layer. Its floor, per degree:")
    c = st.columns([1.4, 1, 1])
    name = c[0].selectbox("Model", [m.name for m in DENSE_MODELS], index=1, key=_key(page, "dense-model"))
    batch = c[1].select_slider("Sequences in the batch", [1, 8, 32, 128], value=1, key=_key(page, "dense-batch"))
    context = c[2].select_slider("Context (tokens)", [1024, 4096, 16384, 65536], value=4096,
                                 key=_key(page, "dense-context"))
    model = next(m for m in DENSE_MODELS if m.name == name)
    ref = REFERENCE_CEILINGS["NVIDIA H200"]
    frame = tp_floor_frame(model, batch, context, ref.ceilings.peak_bytes_per_s, ref.memory_bytes, latency_us)
    show_figure(tp_floor_figure(frame, model.name, latency_us), key=f"{page}-tp-floor", height=430)
    where = floor_fit_text(frame, ref.memory_bytes)
    st.caption(f"{model.name} ({model.params_b:g} B parameters in bf16, {model.layers} layers, {model.kv_heads} KV "
               f"heads; {model.source}): {where}. Arithmetic, not a run: bytes per GPU over the H200's measured "
               f"device copy ({ref.ceilings.peak_bytes_per_s / 1e12:.2f} TB/s), each H200 holding "
               f"{fmt_bytes(ref.memory_bytes)} (which decides the degrees that fit), plus {2 * model.layers + 2} "
               "collectives at the latency set "
               "above. Compute and kernel overheads are left out, so a real step is slower. Unlike the 135M model "
               "above, the bytes TP divides here are far more than the wire it adds.")


# ---- pipeline parallelism ------------------------------------------------------------------------

def pipeline_section(result: ParallelResult, page: str) -> float:
    """Returns the assumed hop in seconds (the download records it)."""
    run, s = result.pipeline, result.settings
    st.subheader(f"Pipeline parallelism, live: {plural(len(run.tokens), 'request')} through "
                 f"{plural(run.pp, 'stage')}")
    hop_us = st.slider("Assumed stage-to-stage hop (µs), an assumption, not a measurement", 0, 200, 20,
                       key=_key(page, "hop"), help="sending one token's activations to the next GPU (and the "
                       "sampled token back to the first); not measured here")
    hop = hop_us * 1e-6
    placed = result.placed(hop)
    summary = result.pipeline_summary(hop)
    show_figure(gantt_figure(result, placed), key=f"{page}-gantt", height=200 + 70 * run.pp)
    lat = token_latency(run, hop)
    c = st.columns(4)
    c[0].metric(f"All requests, {run.pp} GPUs", fmt_duration(summary.makespan),
                f"{summary.one_device / summary.makespan:.2f}× faster than one GPU" if run.pp > 1 else None,
                delta_color="off", delta_arrow="off",
                help=f"one GPU, the same work in turn: {fmt_duration(summary.one_device)}")
    # The hops in µs: at one decimal of a millisecond "64.2 ms = one GPU's 64.2 ms + 3 hops" compared a number
    # with itself.
    c[1].metric("One token's latency", f"{lat.pipelined_ms:.1f} ms",
                f"compute + {lat.hops} hops of {hop_us} µs" if run.pp > 1 else None, delta_color="off",
                delta_arrow="off",
                help="the first request's median decode step, every stage in turn, plus the assumed hops")
    c[2].metric("Bubble (measured)", f"{summary.bubble:.0%}", f"textbook {summary.textbook_bubble:.0%}",
                delta_color="off", delta_arrow="off",
                help="1 − busy time / (stages × makespan); textbook: (p − 1) / (m + p − 1), one forward of m equal "
                     "micro-batches")
    c[3].metric("Busiest stage", f"GPU {max(range(run.pp), key=lambda i: summary.busy_fraction[i])}",
                f"busy {max(summary.busy_fraction):.0%} of the time", delta_color="off", delta_arrow="off")
    left, right = st.columns([1.2, 1], gap="large")
    with left:
        st.dataframe(stage_frame(result, hop), hide_index=True, width="stretch", column_config={
            "GPU": st.column_config.NumberColumn(width="small"),
            "Compute (ms)": st.column_config.NumberColumn(format="%.1f", help="measured, all its tasks"),
            "Busy (%)": st.column_config.NumberColumn(format="%.0f", help="share of the makespan the GPU computes")})
    with right:
        cfg = shared_weights().config
        st.markdown(
            f"- **Latency does not drop**: a token still crosses all {cfg.num_layers} layers one after another, plus "
            f"{plural(lat.hops, 'hop')} ({lat.one_device_ms:.1f} ms of compute + {lat.hops * hop_us} µs of "
            "hops).\n"
            f"- **Throughput rises only with requests in flight**: with {plural(len(run.tokens), 'request')} "
            f"and {run.pp} stages, {'every stage has work' if len(run.tokens) >= run.pp else 'some stages idle'}; "
            "with one request, only one GPU works at a time.\n"
            f"- **Memory per GPU drops**: each holds about 1/{run.pp} of the layers and their KV cache.\n"
            f"- **The last stage is the busiest**: it also runs the LM head ({cfg.vocab_size:,} × "
            f"{cfg.hidden_size} weights, as many as {lm_head_layers(cfg):.0f} layers' matrices); real "
            "deployments give it fewer layers.")

    bench = load_h200(H200_FILE)
    on_gpu = h200_stage_ms(bench, run.pp) if bench is not None else None
    if on_gpu:
        st.caption(f"On one {bench.device} (CUDA graphs, batch 1, random weights), one decode step of each stage: "
                   + ", ".join(f"GPU {i} {ms:.2f} ms" for i, ms in enumerate(on_gpu))
                   + ". Measured by bench/parallel.py, one stage at a time; the hops between GPUs were not.")
    st.markdown("**What the pipeline's requests answered**")
    decode = shared_weights().tokenizer.decode
    for m, (p, t) in enumerate(zip(result.pipeline_prompts, run.tokens)):
        # Each row its own reference: nothing here is compared, so nothing is highlighted.
        answer_rows([(f"request {m + 1}: {p[:48] + ('…' if len(p) > 48 else '')}",
                      REQUEST_COLORS[m % len(REQUEST_COLORS)], t)], t, decode, "pp")
    st.caption(f"Greedy, {plural(s.pipeline_tokens, 'token')} each at most; each request is one micro-batch. "
               "The first is your prompt (the same answer as above, cut shorter).")
    return hop


# ---- expert parallelism --------------------------------------------------------------------------

@st.cache_data(show_spinner=False, max_entries=64)
def _curve(model: str, gpus: int, skews: tuple[float, ...]) -> pd.DataFrame:
    return imbalance_curve(model_named(model), gpus, skews)


def expert_section(page: str) -> None:
    st.subheader("Expert parallelism, in arithmetic")
    st.caption("SmolLM2 has no experts, so this part is **computed, not run**: from the published shapes of three "
               "mixture-of-experts models (their config.json files and papers), weights at fp8 as they ship.")
    names = [m.name for m in MOE_MODELS]
    model = st.radio("MoE model", names, index=len(names) - 1, horizontal=True, key=_key(page, "moe"))
    m = model_named(model)
    frame = ep_frame()
    show_figure(ep_figure(frame, model), key=f"{page}-ep", height=430)
    st.caption(f"{m.name}: {m.experts} routed experts per MoE layer, {m.top_k} per token, hidden size {m.hidden:,}. "
               "EP keeps each expert whole (large, efficient matmuls) but copies attention and the dense parts to "
               "every GPU, so its per-GPU weights sit above TP's. Per token, EP's dispatch and combine send the "
               f"hidden state to ~{m.top_k} experts' GPUs and back: more bytes than TP's all-reduce, but over far "
               "fewer GPUs per message, and no all-reduce inside the experts. Large deployments mix them: "
               "attention data- or tensor-parallel, experts expert-parallel."
               + ("" if all(ep_fits(m, g) for g in EP_GPUS) else
                  f" {m.experts} experts cannot go whole onto more than {m.experts} GPUs, so only those columns."))
    with st.expander("All three models at 8, 16 and 32 GPUs"):
        # Short headers, the units and meanings in the tooltips: all seven columns fit in the expander.
        num = st.column_config.NumberColumn
        st.dataframe(frame, hide_index=True, width="stretch", column_config={
            "Model": st.column_config.TextColumn(width=150), "GPUs": num(width=56),
            "Experts per GPU": num("Experts/GPU", width=90),
            "EP weights per GPU (GiB)": num("EP GiB/GPU", format="%.1f", width=90,
                                           help="expert parallelism: weights per GPU, GiB"),
            "TP weights per GPU (GiB)": num("TP GiB/GPU", format="%.1f", width=90,
                                           help="tensor parallelism: weights per GPU, GiB"),
            "EP all-to-all per token (KB)": num("EP KB/token", format="%.1f", width=100,
                                                help="expert parallelism: all-to-all bytes per token, KB"),
            "TP all-reduce per token (KB)": num("TP KB/token", format="%.1f", width=100,
                                                help="tensor parallelism: all-reduce bytes per token, KB"),
        })
    st.markdown("**Routing imbalance.** The router picks experts per token; some experts are more popular, and the "
                "GPU holding them gets more tokens. Everyone waits for it.")
    c = st.columns([1, 1.4, 1.4])
    gpu_options = [g for g in EP_GPUS if ep_fits(m, g)]
    gpus = c[0].selectbox("GPUs", gpu_options, key=_key(page, f"ep-gpus-{model}"))
    tokens = c[1].select_slider("Tokens in the batch", ROUTING_TOKENS, value=256, key=_key(page, "ep-tokens"))
    skew = c[2].slider("Routing skew (0: every expert equally likely)", 0.0, 1.5, 0.5, step=0.25,
                       key=_key(page, "ep-skew"), help="expert i picked with weight (i + 1)^−skew: what a router "
                       "drifts to without a balancing loss")
    skews = (0.0,) if skew == 0 else (0.0, float(skew))
    curve = _curve(model, int(gpus), skews)
    show_figure(imbalance_figure(curve, int(tokens), float(skew)), key=f"{page}-imbalance", height=420)
    at = curve[(curve["skew"] == skew) & (curve["tokens"] == tokens)].iloc[0]
    st.caption(f"At {tokens} tokens on {gpus} GPUs: the mean GPU gets {at['mean']:,.0f} expert slots (token × pick), "
               f"the busiest {at['busiest']:,.0f}, so the MoE layer takes **{at['ratio']:.2f}×** as long as with "
               f"perfect balance (averaged over {ROUTING_DRAWS} random routings). Small batches (decode) are "
               "lumpy even with a uniform router; skew stays whatever the batch. Remedies: an auxiliary "
               "**balancing loss** in training (or DeepSeek-V3's bias on the router scores), **redundant copies** "
               "of hot experts on spare GPUs, and capacity limits that drop or reroute overflow tokens.")


# ---- when to use which, and the download ---------------------------------------------------------

def when_section() -> None:
    with st.expander("When to use which", icon=":material/help:"):
        st.markdown(
            "- **Model fits on one GPU?** Don't split it: run copies (data parallelism) and get throughput with no "
            "wire at all.\n"
            "- **Too large, or latency matters: tensor parallelism within one node** (NVLink, 2–8 GPUs). It cuts "
            "per-token latency and per-GPU memory, but pays two all-reduces per layer on every step, so it stays "
            "inside the fast interconnect and within the KV-head count.\n"
            "- **Larger still: pipeline parallelism across nodes.** One hop per stage, not per layer, so slow "
            "links are fine; it needs many requests in flight to fill the bubble and does not cut latency.\n"
            "- **Mixture-of-experts: expert parallelism** for the experts (whole experts per GPU, all-to-all "
            "routing), usually with data or tensor parallelism for attention; watch the load balance.\n"
            "- Production deployments combine them, e.g. TP 8 inside each node × PP 2 across two nodes, or "
            "attention DP + expert EP over 32 GPUs.")


def download_section(result: ParallelResult, page: str, hop_seconds: float) -> None:
    st.download_button("Download this run (JSON)", result_json(result, hop_seconds), file_name="parallelism.json",
                       mime="application/json", icon=":material/download:", key=f"{page}-download")
    took = sum(s.serial_seconds for s in result.single.steps + result.sharded.steps) + result.pipeline_summary().one_device
    st.caption(f"The measured compute of this run adds up to {fmt_duration(took)} here; the run is kept for everyone "
               "on this server, so a class opening the page sees it at once.")
