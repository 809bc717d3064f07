"""Sections of the attention roofline page (pages/02_attention_roofline.py composes them)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import streamlit as st
import torch

from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.trace import StepRecord
from kernels.ceilings import REFERENCE_CEILINGS, Ceilings, ceilings_for, measure_ceilings, memory_capacity

from app.analysis.kernel_paths import (PATHS, expected_steps, first_difference, run_paths, runnable_paths,
                                       summary_rows)
from app.analysis.roofline_math import (above_roof, attention_decode_intensity, crossing_batch, decode_step, family_points,
                                        phase_points,
                                        flops_per_token, kernel_points, linear_intensity, matmul_params, step_phase, step_totals,
                                        unplottable_kernels)
from app.charts.kernel_paths import kernel_path_chart
from app.charts.roofline import (decode_intensity_chart, decode_throughput_chart, fmt_rate, point_label,
                                 request_latency_chart, roofline_chart, step_latency_chart)
from app.formatting import NO_VALUE, fmt_duration
from app.runtime import server_engine_settings, shared_weights
from app.scenarios import RequestSpec, Scenario
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.comparison import comparison_runner
from app.widgets.controls import RUN_TO_END_LIMIT
from app.widgets.explain import explanation

LONG_PROMPT = (
    "Summarise the following notes in two sentences. A transformer forward pass is a long chain of matrix "
    "multiplications. For every token, each weight matrix is multiplied by that token's activation vector, so "
    "the work per token is about two floating point operations per parameter. During prefill the whole prompt "
    "is processed at once: hundreds of tokens share a single read of every weight matrix from memory, so the "
    "processor does hundreds of operations for every byte it loads and the arithmetic units are the limit. "
    "During decoding the model produces one token per sequence per step. Every weight matrix still has to be "
    "read from memory in full, together with the keys and values cached for every earlier token, but now it "
    "is used for only a handful of tokens. The processor does about one operation per byte and spends most "
    "of its time waiting for memory. That is why the time to the first token depends on the prompt length "
    "and the compute throughput, while the time per output token depends on the memory bandwidth, and why "
    "serving systems batch many sequences together: a larger batch reuses every byte of weights for more tokens."
)

ROOFLINE_SCENARIOS: list[Scenario] = [
    Scenario(
        name="Long prompt, then decoding",
        description="One request with a ~260-token prompt: step 0 prefills it in one go (compute-heavy), "
                    "every later step decodes one token (memory-heavy).",
        engine={"block_size": 16, "num_blocks": 64, "max_num_batched_tokens": 512, "max_model_len": 512},
        requests=(RequestSpec(LONG_PROMPT, max_tokens=24, ignore_eos=True),),
    ),
    Scenario(
        name="Eight requests decoding together",
        description="Eight short requests prefill together, then decode as a batch of 8: the decode linear "
                    "layers reuse each weight byte for 8 tokens, so their intensity is 8 x that of one sequence.",
        engine={"block_size": 16, "num_blocks": 96, "max_num_seqs": 8, "max_num_batched_tokens": 512,
                "max_model_len": 256},
        requests=tuple(RequestSpec(p, max_tokens=16, ignore_eos=True) for p in (
            "What is a GPU?", "Name a prime number.", "Why is the sea salty?", "What is RAM?",
            "Say hello in Spanish.", "What is a compiler?", "Name a planet.", "What is bandwidth?")),
    ),
    Scenario(
        name="A long prompt joins running decodes",
        description="Two requests are decoding when a long prompt arrives at step 4; with chunked prefill its "
                    "chunk shares a step with the decodes (a mixed step), which is why their TPOT jumps.",
        engine={"block_size": 16, "num_blocks": 96, "max_num_batched_tokens": 160, "max_model_len": 512},
        requests=(RequestSpec("Count from one to twenty in words.", max_tokens=24, ignore_eos=True),
                  RequestSpec("List some colours.", max_tokens=24, ignore_eos=True),
                  RequestSpec(LONG_PROMPT, max_tokens=8, arrival_step=4, ignore_eos=True)),
    ),
]

_CEILINGS_KEY = "roofline-ceilings"
_REMEASURED_KEY = "roofline-ceilings-remeasured"  # the time of the last "Measure again", if any


def roofline_explanation(cfg: ModelConfig, elem: int) -> None:
    p = matmul_params(cfg)
    explanation(
        "The roofline, and what it predicts for LLM inference",
        [r"{P = \min\big(\pi,\ \beta \cdot I\big)}, \qquad\allowbreak {I = \frac{\text{FLOPs}}{\text{bytes}}}, \qquad\allowbreak "
         r"{I^{*} = \frac{\pi}{\beta}}",
         rf"\text{{FLOPs/token}} \approx 2 N_{{\text{{params}}}} \approx {2 * p / 1e6:.0f}\ \text{{MFLOP}}",
         r"\text{bytes/decode step} \approx {e\,N_{\text{params}}} + {B\,\text{ctx}\cdot 2 L H_{kv} d\, e}",
         r"{I_{\text{decode, linear}} \approx \tfrac{2B}{e}}, \qquad\allowbreak {I_{\text{prefill, linear}} \approx \tfrac{2T}{e}}"],
        ["Each marker is one kernel family of the selected step (the toggle splits them per kernel), summed over "
         "its 30 layers: x = its FLOPs over its bytes, y = its FLOPs over its measured time. The black line is the most this machine can do at "
         "that intensity.",
         "**Prefill** (orange): a long prompt puts hundreds of rows through every matmul, so the linear layers "
         "sit far right, near the compute roof. **Decode** (blue): one row per sequence, so the same matmuls sit "
         "far left on the bandwidth slope: they wait for the weights to arrive.",
         "Decode attention stays left whatever the batch: each sequence reads its own KV cache "
         f"({attention_decode_intensity(cfg, elem):.3g} FLOP/B here, thanks to {cfg.num_heads // cfg.num_kv_heads} "
         "query heads per KV head).",
         "Markers far below the roof are overhead-bound: small calls pay Python and kernel-launch costs that no "
         "FLOP or byte count sees (on a GPU, CUDA graphs remove most of them). On a GPU the first steps of a run "
         "also include Triton's compilation and autotuning: judge the later ones.",
         "TTFT is dominated by the prefill step (compute), TPOT by the decode steps (bandwidth): scrub between "
         "step 0 and a later step to see both."],
        note=f"π = peak FLOP/s, β = bytes/s, N_params = {p / 1e6:.1f}M matmul parameters, e = bytes per number "
             f"({elem} on this server: so I ≈ B/2 here, ≈ B at bf16), B = batch, T = prompt tokens, "
             f"L = {cfg.num_layers} layers, {cfg.num_kv_heads} KV heads of dimension {cfg.head_dim}. "
             f"Both ≈ hold while B or T is small beside the hidden size ({cfg.hidden_size}); past it the "
             "activations' own bytes pull I below them.",
    )


@st.cache_resource(show_spinner="Compiling the Triton kernels once for this server (first visit on a GPU)…")
def _warm_up_kernels(device: str, dtype: str, weights: str) -> float:
    """Run a throwaway engine through every kernel path once (fresh prefill, prefill chunks on the
    paged path, decodes), so the first step a student sees is not Triton's JIT compilation."""
    t0 = time.perf_counter()
    # Triton specialises integer arguments (== 1, multiples of 16) and split counts, so cover the
    # shapes the scenarios meet: one sequence and several, short and > 256-token contexts, chunks.
    runs = [[list(range(100, 160))], [list(range(1000, 1300))], [list(range(i * 40, i * 40 + 30)) for i in range(4)]]
    for prompts in runs:
        engine = LLMEngine(EngineConfig(device=device, dtype=dtype, weights=weights, num_blocks=64, max_model_len=512,
                                        max_num_batched_tokens=128), shared_weights())
        for ids in prompts:
            engine.add_request(ids, SamplingParams(max_tokens=4, ignore_eos=True))
        while engine.has_work():
            engine.step()
    return time.perf_counter() - t0


def warm_up_gpu_kernels() -> None:
    server = server_engine_settings()
    if torch.device(server["device"]).type == "cuda":
        _warm_up_kernels(server["device"], server["dtype"], server["weights"])


def ceilings_section(device: str) -> Ceilings:
    """Measure (once per server process) and show π and β; a button re-measures."""
    dev = torch.device(device)
    if st.session_state.get(_CEILINGS_KEY) is None:
        with st.spinner("Measuring this machine's ceilings (a matmul and a large copy)…"):
            st.session_state[_CEILINGS_KEY] = ceilings_for(dev)
    c: Ceilings = st.session_state[_CEILINGS_KEY]
    with st.container(border=True):
        st.markdown("##### :material/speed: This machine's two ceilings")
        m = st.columns([1.3, 1.1, 1.2])  # "264 GFLOP/s" on one line at 1280 px
        m[0].metric("Peak compute π", fmt_rate(c.peak_flops, "FLOP/s"), help=f"dense {c.dtype} matmul")
        m[1].metric("Memory bandwidth β", fmt_rate(c.peak_bytes_per_s, "B/s"), help="large copy, read + write")
        m[2].metric("Ridge point π/β", f"{c.ridge:.3g} FLOP/B",
                    help="Kernels with fewer FLOPs per byte than this cannot reach π: they are memory-bound")
        # The button sits beside the source line, not in the metrics' row: a fourth column there cut its label
        # to "Measure a…" on a 1024-pixel projector with the sidebar open.
        with st.container(horizontal=True, vertical_alignment="center", gap="medium"):
            again = st.button("Measure again", icon=":material/refresh:", key="roofline-remeasure",
                              help="The machine is shared: re-measure if the numbers look off")
            st.caption(f"Source: {c.source}{_when(c, st.session_state.get(_REMEASURED_KEY))}. Measured, never "
                       "datasheet figures: a roofline only means something against the ceilings of the machine the "
                       "kernels ran on.")
        if again:
            st.session_state[_CEILINGS_KEY] = measure_ceilings(dev, fresh=True)
            st.session_state[_REMEASURED_KEY] = time.strftime("%H:%M:%S")
            st.rerun()
        with st.expander("Reference: ceilings and attention throughput measured on a GPU"):
            # A static table per GPU: its cells wrap, so the long descriptions and values are read whole.
            paths = _reference_kernel_paths()
            for ref in REFERENCE_CEILINGS.values():
                rows = [{"what": what, "measured": value} for what, value in ref.notes] + [
                    {"what": r["what"], "measured": r["measured"]} for r in paths if r["GPU"] == ref.name]
                st.markdown(f"**{ref.name}**")
                st.table(pd.DataFrame(rows).set_index("what"))
            h = next(iter(REFERENCE_CEILINGS.values())).ceilings
            st.caption(f"H200 ridge: {h.ridge:.0f} FLOP/byte at bf16, so a bf16 decode step needs a batch in the "
                       "hundreds before its linear layers stop being memory-bound (see the calculator below).")
    return c


def _when(c: Ceilings, remeasured_at: str | None) -> str:
    """When the ceilings shown were measured, for the caption: re-measured by this visitor, or the one
    measurement this server process made when the page was first opened (nothing for a table lookup)."""
    if remeasured_at:
        return f", re-measured at {remeasured_at}"
    return " (once per server process, when this page was first opened)" if c.source.startswith("measured") else ""


def roofline_section(session: EngineSession, record: StepRecord, c: Ceilings) -> None:
    phase = step_phase(record)
    per_kernel = st.toggle("One marker per kernel (instead of one per kernel family)", key="roofline-per-kernel")
    points = kernel_points if per_kernel else (lambda r: family_points(kernel_points(r)))
    now = points(record)
    # Every other recorded step, not only the earlier ones: scrubbed back to the prefill, the decode
    # cluster stays visible for contrast.
    others = phase_points([p for r in session.records if r.step != record.step for p in points(r)])
    totals = step_totals(record)
    m = st.columns(5)
    m[0].metric("Selected step", f"{record.step} ({phase})")
    m[1].metric("Tokens computed", record.num_batched_tokens,
                help=f"{record.num_prefill_tokens} prefill + {record.num_decode_tokens} decode")
    m[2].metric("Step FLOPs", fmt_rate(totals.flops, "FLOP"), help="summed over every timed kernel")
    m[3].metric("Step bytes moved", fmt_rate(totals.bytes, "B"),
                help=f"summed over every timed kernel, in decimal units (1 MB = 10⁶ bytes: {totals.bytes:,.0f} bytes) "
                     "as bandwidth is quoted, so bytes ÷ GB/s reads off directly; sizes held in memory, such as the "
                     "weights, are in binary MiB (1 MiB = 1.049 MB)")
    # The unit sits in the label: five metrics share the row, and a value wider than its column is cut off.
    above = totals.intensity >= c.ridge
    m[4].metric("Step intensity (FLOP/B)", f"{totals.intensity:.3g}",
                delta=f"{'above' if above else 'below'} the ridge ({c.ridge:.3g})", delta_color="off",
                delta_arrow="up" if above else "down")
    title = (f"Step {record.step} ({phase}: {record.num_prefill_tokens} prefill + {record.num_decode_tokens} decode "
             f"tokens) on the roofline")
    if not now:
        st.info("This step timed no kernels with FLOPs (nothing ran, or the decode ran as one CUDA graph replay).")
        return
    show_figure(roofline_chart(c, now, others, title), key="roofline-main", height=640)
    above = above_roof(now + others, c)  # faded steps too: any point over the roof disproves it
    if above:
        worst = above[0]
        st.warning(f"**{point_label(worst)}** ran at {fmt_rate(worst.flops_per_s, 'FLOP/s')}, "
                   f"{worst.flops_per_s / c.attainable(worst.intensity):.1f}× what the roof allows at its intensity. "
                   "No kernel can beat a true ceiling, so these were measured while the machine was busy with "
                   "something else (it is shared): press **Measure again** above.", icon=":material/warning:")
    if session.engine is not None and session.engine.device.type == "cuda":
        st.info("A 135M-parameter model is far too small to fill this GPU: each kernel runs for microseconds, so "
                "per-call costs (Python, the launch, the timing events) dominate and the markers sit one to three "
                "orders of magnitude under the roof. Their x positions come from the shapes alone and still separate "
                "prefill (right) from decode (left); the calculator below shows where a large enough batch lands, "
                "and CUDA graphs are how real servers remove the per-call cost.", icon=":material/info:")
    best = max(now, key=lambda p: p.flops)
    skipped = sorted(set(unplottable_kernels(record)))
    st.caption(f"Biggest kernel of this step: **{best.name}** at I = {best.intensity:.3g} FLOP/B, "
               f"{fmt_rate(best.flops_per_s, 'FLOP/s')} = {best.flops_per_s / c.attainable(best.intensity):.0%} of "
               f"the roof there ({c.bound(best.intensity)}). "
               + (f"Not plotted (no FLOPs, pure data movement): {', '.join(skipped)}. " if skipped else "")
               + "Faded markers are the other recorded steps of this run: step through a prefill and some decodes "
                 "to see the two clusters.")


def latency_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    st.subheader("What a request feels: TTFT and TPOT")
    reqs = [q for q in record.requests if q.ttft_seconds >= 0]
    tpots = [q.tpot_seconds for q in record.requests if q.tpot_seconds >= 0]
    m = st.columns(4)
    m[0].metric("Requests with a first token", f"{len(reqs)} / {len(record.requests)}")
    m[1].metric("Mean TTFT", fmt_duration(sum(q.ttft_seconds for q in reqs) / len(reqs)) if reqs else "–",
                help="engine clock from arrival to the first token: the prefill (and any queueing)")
    m[2].metric("Mean TPOT", fmt_duration(sum(tpots) / len(tpots)) if tpots else "–",
                help="mean time between later tokens: the decode steps")
    decode_steps = [r.wall_seconds for r in history if step_phase(r) == "decode"]
    prefill_steps = [r.wall_seconds for r in history if step_phase(r) in ("prefill", "mixed")]
    if decode_steps and prefill_steps:
        m[3].metric("Prefill step / decode step", f"{max(prefill_steps) / (sum(decode_steps) / len(decode_steps)):.0f}×",
                    help="the longest prefill step over the mean decode step")
    left, right = st.columns([1.2, 1])
    with left:
        show_figure(step_latency_chart(history, record.step), key="roofline-steps", height=340)
    with right:
        show_figure(request_latency_chart(record, session.request_order), key="roofline-ttft", height=340)


@dataclass(frozen=True, slots=True)
class CalculatorChoice:
    """What the reader set in the calculator, for the sections under it."""

    ceilings: Ceilings
    ceilings_label: str
    elem: int
    context: int

    @property
    def ceilings_name(self) -> str:
        return ceilings_name(self.ceilings_label)


def ceilings_name(label: str) -> str:
    """The calculator's ceilings choice in words: "this machine", "NVIDIA H200" (its radio label's suffix off)."""
    return label.removesuffix(" (table)").removesuffix(" (measured)")


def calculator_section(cfg: ModelConfig, c: Ceilings, server_elem: int) -> CalculatorChoice:
    st.subheader("Calculator: when does decoding stop being memory-bound?")
    st.markdown("A decode step reads **every weight once** however many sequences it serves, so the batch size is "
                "the lever: each extra sequence adds FLOPs but (almost) no weight bytes. The KV cache read does grow "
                "with the batch, which is why the whole step flattens out.")
    k = st.columns([1.4, 1.2, 1, 1.3])
    batch = k[0].select_slider("Batch size B", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                               value=8, key="roofline-calc-batch")
    context = k[1].select_slider("Context per sequence (cached tokens)", [0, 128, 512, 1024, 2048, 4096, 8192],
                                 value=1024, key="roofline-calc-ctx")
    dtypes = {"bf16 (2 B)": 2, "fp32 (4 B)": 4}
    default = "fp32 (4 B)" if server_elem == 4 else "bf16 (2 B)"
    elem = dtypes[k[2].radio("Weights and KV", list(dtypes), index=list(dtypes).index(default),
                             key="roofline-calc-dtype")]
    options = {"this machine (measured)": (c, memory_capacity(server_engine_settings()["device"]))}
    options.update({f"{name} (table)": (ref.ceilings, ref.memory_bytes) for name, ref in REFERENCE_CEILINGS.items()})
    label = k[3].radio("Ceilings", list(options), key="roofline-calc-device")
    chosen, capacity = options[label]
    step = decode_step(cfg, batch, context, elem)
    cross = crossing_batch(cfg, elem, chosen.ridge)
    lin = linear_intensity(cfg, batch, elem)
    t = step.seconds(chosen)
    # Two rows of three: at five to a row the longer values ("30.1 ms", "B = 5") were cut off.
    top, bottom = st.columns(3), st.columns(3)
    top[0].metric("FLOPs per decode step", fmt_rate(step.flops, "FLOP"),
                  help=f"B × (2 × {matmul_params(cfg) / 1e6:.1f}M params + attention over the context) = "
                       f"{batch} × {fmt_rate(flops_per_token(cfg, context), 'FLOP')}")
    top[1].metric("Bytes per decode step", fmt_rate(step.bytes, "B"),
                  help=f"weights {fmt_rate(step.weight_bytes, 'B')} + KV {fmt_rate(step.kv_bytes, 'B')} + "
                       f"activations {fmt_rate(step.activation_bytes, 'B')}")
    top[2].metric("Linear-layer intensity (FLOP/B)", f"{lin:.3g}",
                  delta=f"ridge {chosen.ridge:.3g}: {'compute' if lin >= chosen.ridge else 'memory'}-bound",
                  delta_color="off", delta_arrow="up" if lin >= chosen.ridge else "down")
    bottom[0].metric("Linear layers cross the ridge at", f"B = {cross}" if cross else "never",
                     help="counting the activation bytes too, so a little above ridge × e / 2")
    whole_bound = step.bound(chosen)
    bottom[1].metric("Predicted step time", f"{t * 1e3:.3g} ms", delta=f"whole step {whole_bound}", delta_color="off",
                     delta_arrow="up" if whole_bound == "compute-bound" else "down",
                     help="max(FLOPs/π, bytes/β): the linear layers alone can be compute-bound while the KV "
                          "read keeps the whole step memory-bound")
    bottom[2].metric("Predicted output tokens/s", f"{batch / t:,.0f}", help="B tokens per step ÷ the step time")
    resident = step.weight_bytes + step.kv_bytes
    if capacity and resident > capacity:
        where = ceilings_name(label)
        st.warning(f"This batch does not fit: the weights and {batch} × {context:,} cached tokens of KV need "
                   f"{fmt_rate(resident, 'B')}, and {where} has {fmt_rate(capacity, 'B')} of memory. A server would "
                   f"cap the batch near {_batch_that_fits(cfg, context, elem, capacity):,} at this context, or "
                   "preempt requests; the prediction below assumes the memory were there.",
                   icon=":material/memory:")
    left, right = st.columns(2)  # side by side from 780 pixels of page, stacked below
    with left:
        show_figure(decode_intensity_chart(cfg, elem, chosen, batch, context), key="roofline-calc", height=520,
                    export_width=700)
    with right:
        show_figure(decode_throughput_chart(cfg, elem, chosen, batch, context), key="roofline-calc-throughput",
                    height=520, export_width=700)
    st.caption(_prefill_caption(cfg, elem, chosen, cross))
    return CalculatorChoice(chosen, label, elem, context)


def _batch_that_fits(cfg: ModelConfig, context: int, elem: int, capacity: float) -> int:
    """The largest batch whose weights and KV at `context` tokens fit in `capacity` bytes."""
    one = decode_step(cfg, 1, context, elem)
    return max(0, int((capacity - one.weight_bytes) // max(one.kv_bytes, 1)))


def _prefill_caption(cfg: ModelConfig, elem: int, c: Ceilings, cross: int | None) -> str:
    """Prefill against decode with the chosen ceilings: the same matmuls, rows from the prompt instead
    of from the batch, so the prompt length where prefill turns compute-bound is the same number."""
    at256, at2048 = linear_intensity(cfg, 256, elem), linear_intensity(cfg, 2048, elem)
    head = ("A prefill of T prompt tokens is the same matmuls with T rows: its linear-layer intensity "
            f"(activations' bytes included) is {at256:.0f} FLOP/B at T = 256 and {at2048:.0f} at T = 2048, against "
            f"a ridge of {c.ridge:.3g}. ")
    if cross is None:
        return head + "With these ceilings even long prompts stay memory-bound: the weights are too small to reuse enough."
    return head + (f"So a prompt of {cross:,} tokens or more is compute-bound, while decode needs {cross:,} sequences "
                   "in one batch for the same: prefill gets its rows from the prompt for free, decode has to batch "
                   "them, which is why prefill is compute-bound and decode is not.")


def kernel_paths_section(session: EngineSession) -> None:
    """The page's scenario run to its end on every kernel path this server has, decode steps timed."""
    st.subheader("What kernel launches cost: the same scenario on every kernel path")
    st.markdown(f"A decode step of this model is a few hundred kernels ({session.weights.config.num_layers} layers of "
                "norms, projections, RoPE, attention and MLP), each working on a handful of tokens. Launched one by one "
                "from Python, every kernel costs "
                "microseconds of host time before the GPU has anything to do; a **CUDA graph** records the whole step "
                "once and then replays it with a single launch. The button runs this page's scenario to its end on "
                "each kernel path this server has: fresh engines, stepped in turn, kernel timing off.")
    server = server_engine_settings()
    runnable, missing = runnable_paths(server["device"])
    runs = comparison_runner(
        session, "roofline", button_label="Run the scenario on every kernel path", button_key="roofline-paths-run",
        progress_text="Running the scenario on every kernel path…", step_text="step {n} on every path",
        expected_steps=expected_steps(session.scenario),
        hint="Press the button to time every decode step of the scenario on each kernel path.",
        run=lambda progress: run_paths(session.scenario, shared_weights(), server, runnable, RUN_TO_END_LIMIT, progress),
        errors_of=lambda rs: [f"{r.path.label}: {r.error}" for r in rs if r.error])
    if missing:
        needs = " and ".join(f"“{p.label}”" for p in missing)
        st.info(f"This server has no CUDA GPU, so only the {runnable[0].label} run here; {needs} "
                f"need{'s' if len(missing) == 1 else ''} one. What all {len(PATHS)} paths measured on a GPU in "
                f"“{ROOFLINE_SCENARIOS[0].name}” (also in the reference table under this machine's ceilings):",
                icon=":material/info:")
        st.dataframe(_reference_path_table(), hide_index=True, width="stretch")
    if not runs:
        return
    show_figure(kernel_path_chart(runs), key="roofline-paths", height=130 + 85 * len(runs))
    st.dataframe(pd.DataFrame(summary_rows(runs)), hide_index=True, width="stretch",
                 placeholder=NO_VALUE)  # a path that ran no decode step has no decode figures
    if len(runs) < 2:
        st.caption("One kernel path ran here, so there are no tokens to compare and no launch overhead to remove: "
                   "the GPU's figures are in the table above.")
        return
    differs = first_difference(runs)
    graphs_ran = any(r.path.key == "graphs" for r in runs)
    st.caption(("Every path produced the same tokens for every request. " if not differs else
                f"Not every path produced the same tokens ({differs}): the kernels round differently, and in "
                "bfloat16 a near-tie between two tokens can go either way. ")
               + ("A CUDA graph's first replay at a new batch size includes capturing it: that step sits apart."
                  if graphs_ran else ""))


def _reference_path_times() -> list[tuple[str, str, str]]:
    """(GPU, kernel path, its median decode step of this page's first scenario) for each reference GPU."""
    label = {p.key: p.label for p in PATHS}
    return [(ref.name, label[key], f"{ms:.3g} ms") for ref in REFERENCE_CEILINGS.values()
            for key, ms in ref.kernel_paths_ms]


def _reference_path_table() -> pd.DataFrame:
    """The same figures as `_reference_kernel_paths`, one row per kernel path and one column per GPU: a row per
    figure repeated the GPU and the scenario in every row, and at 1024 pixels its columns ran past the page."""
    long = pd.DataFrame(_reference_path_times(), columns=["GPU", "kernel path", "ms"])
    wide = long.pivot(index="kernel path", columns="GPU", values="ms").reindex(long["kernel path"].unique())
    return wide.rename(columns=lambda gpu: f"median decode step, {gpu}").reset_index().rename_axis(columns=None)


def _reference_kernel_paths() -> list[dict[str, str]]:
    """The reference GPUs' median decode step of this page's first scenario on each kernel path."""
    return [{"GPU": gpu, "what": f"median decode step, “{ROOFLINE_SCENARIOS[0].name}”, {path}", "measured": ms}
            for gpu, path, ms in _reference_path_times()]
