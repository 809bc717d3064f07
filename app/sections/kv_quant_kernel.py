"""The KV compression page's kernel section: does a cache in fewer bits make a decode step faster? Only when the
attention kernel reads the low-bit codes itself (kernels/paged_decode_quant_triton.py). On a GPU the section times
the kernels live at a batch and context the user picks; on a CPU it shows what they measured on an H200."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from kernels.ceilings import Ceilings, ceilings_for, lookup_ceilings
from kernels.quant_decode_timing import BF16_BYTES_PER_TOKEN, QuantDecodeTimings, time_quant_decode

from app.analysis.kv_quant_kernel import BENCH_COMMAND, call_frame, load_measured, roofline_frame, sweep_frame
from app.charts.kv_quant_kernel import call_figure, roofline_figure, sweep_figure
from app.charts.roofline import fmt_rate
from app.formatting import NO_VALUE
from app.runtime import device, device_label
from app.state import mark_requested, page_settings, run_on_request, submitted_settings
from app.theme import show_figure

BATCHES = (1, 8, 16, 32, 64, 128)
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
SWEEP_BATCH = 64


@dataclass(frozen=True, slots=True)
class KernelShape:
    batch: int = 64
    context: int = 8192

    def check(self) -> None:
        if self.batch not in BATCHES or self.context not in CONTEXTS:
            raise ValueError(f"choose a batch of {', '.join(map(str, BATCHES))} and a context of "
                             f"{', '.join(f'{c:,}' for c in CONTEXTS)} tokens")


def _intro() -> None:
    st.subheader("Fewer bits, faster decoding? Only if the kernel reads the bits, and even then not for free")
    st.markdown("A decode step reads every cached key and value once and does little arithmetic with each, so the "
                "hope is that a cache in half the bits takes half the time. The lab above measures quality with the "
                "torch path, which **dequantizes the stored codes into a 16-bit copy and then attends**: it reads "
                "the codes, writes the copy and reads it again, more bytes than the 16-bit cache alone. Our **fused "
                "Triton kernel** reads the codes itself: the engine's paged decode (block tables, split-KV, the 3 "
                "query heads of a KV group in one tile) over the very FP8, INT8 and INT4 codes the lab stores, "
                "turned into numbers in registers. Scales never touch the codes: a key's score is q·codes × its "
                "scale, a value's scale joins its softmax weight, and INT4's two groups of 32 numbers a row each "
                "get their own products (their zero points add z·Σq to a score).")
    st.markdown("Whether that is faster depends on what the step is short of. Fewer bytes help only a kernel that "
                "waits for memory; every key now also costs the work of turning its codes into numbers the tensor "
                "cores take, and with SmolLM2's small heads (3 KV heads of 64) the 16-bit kernel is already close "
                "to that balance. The measurements below say how it comes out, and the roofline says why: a kernel that "
                "still waits for memory sits on the bandwidth roof; one that has run out of instructions per second "
                "falls below it.")


def _verdict(timings: list[QuantDecodeTimings]) -> str:
    """One sentence on what the measured calls show, from their numbers."""
    def span(values: list[float]) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"

    parts = [f"{fmt.upper()} {span([t.speedup(fmt) for t in timings])}" for fmt in ("fp8", "int8", "int4")]
    unfused = [t.unfused_int4_us / t.engine_bf16_us for t in timings]
    best = max(t.speedup(fmt) for t in timings for fmt in ("fp8", "int8", "int4"))
    if best < 1:
        ratios = [BF16_BYTES_PER_TOKEN / timings[0].format(f).bytes_per_token for f in ("fp8", "int4")]
        outcome = ("The fused kernel reads a half to a third of the bytes and is still not faster: per key, "
                   "unpacking and converting codes costs as much time as the bytes saved. Here a low-bit cache buys "
                   f"**capacity** ({ratios[0]:.1f}× the tokens in the same memory in FP8, {ratios[1]:.1f}× in INT4, "
                   "so bigger batches), not a faster step; beating BF16 per call needs cheaper conversions or heads "
                   "with more work per byte.")
    else:
        outcome = (f"At its best a low-bit pool ran {best:.2f}× as fast as BF16: fewer bytes paid for the "
                   "conversions where the step waited for memory.")
    return (f"Against the engine's BF16 kernel: {', '.join(parts)} (above 1× is faster). {outcome} Dequantizing "
            f"into a copy first is {min(unfused):.0f}–{max(unfused):.0f}× slower.")


def _call_view(t: QuantDecodeTimings, where: str, key: str, ceilings: Ceilings | None) -> None:
    frame = call_frame(t)
    show_figure(call_figure(frame, t.batch, t.context, where), key=key, height=360, export_width=1100)
    if ceilings is not None:
        show_figure(roofline_figure(roofline_frame(t, ceilings), ceilings, t.batch, t.context, where),
                    key=f"{key}-roofline", height=440, export_width=1100)
        st.caption(f"Not drawn: the compute roof, {fmt_rate(ceilings.peak_flops, 'FLOP/s')}, far above these "
                   f"points; the bandwidth roof meets it only at {ceilings.ridge:.0f} FLOP/B.")
    num = st.column_config.NumberColumn
    # Cells with no value (the reference path has no error against itself; the copy-first path reads and writes a
    # copy, so its pool rate means nothing) read "–" (placeholder) rather than "None"; the rest stay numbers, so
    # a column sorts by value. At 1024 pixels with the sidebar open the seven columns took 780 of 690 pixels, so
    # the speed-up, time and error headers are shorter, what they compare against in their tooltips.
    st.dataframe(frame[["path", "bytes_per_token", "us", "speed-up", "bytes ratio", "TB/s", "error"]],
                 hide_index=True, width="stretch", placeholder=NO_VALUE, column_config={
        "path": st.column_config.TextColumn("Path"),
        "bytes_per_token": num("Bytes/token/layer", format="%,.0f",
                               help="one layer's K and V, all 3 KV heads, scales included (× 30 layers for the "
                                    "whole cache, as the tables above count it)"),
        "us": num("µs/call", format="%,.1f", help="microseconds per decode attention call (one layer)"),
        "speed-up": num("Speed-up", format="%.2f×",
                        help="the engine's BF16 kernel's time over this path's: above 1× is faster than it"),
        "bytes ratio": num("Bytes ratio", format="%.2f×",
                           help="BF16's bytes over this format's: a bandwidth-bound kernel's ceiling"),
        "TB/s": num("Pool TB/s", format="%.2f", help="pool bytes read per second"),
        "error": num("Rel. error", format="%.1e",
                     help="‖out − ref‖ / ‖ref‖, ref: dequantize-then-attend in fp32; the kernel reads the same "
                          "numbers, so only rounding differs"),
    })


def _measured_view(page: str) -> None:
    measured = load_measured()
    if measured is None:
        st.info(f"No measured timings in this checkout (run `{BENCH_COMMAND}` on a CUDA machine).",
                icon=":material/info:")
        return
    name, timings = measured
    where = f"measured on an {name}"
    if any(t.batch == SWEEP_BATCH for t in timings):
        show_figure(sweep_figure(sweep_frame(timings, SWEEP_BATCH), SWEEP_BATCH, where), key=f"{page}-qk-h200-sweep",
                    height=420, export_width=1100)
    shapes = [(t.batch, t.context) for t in timings]
    pick = st.selectbox("One call in detail", shapes, index=shapes.index((64, 8192)) if (64, 8192) in shapes else 0,
                        format_func=lambda s: f"batch {s[0]} × {s[1]:,} tokens", key=f"{page}-qk-h200-shape")
    _call_view(next(t for t in timings if (t.batch, t.context) == pick), where, f"{page}-qk-h200-call",
               lookup_ceilings(name))
    st.markdown(_verdict(timings))
    st.caption(f"Measured on an {name} with `{BENCH_COMMAND}` (bench/results/kv_quant_decode_h200.json): SmolLM2's "
               "decode shape, shuffled 16-token pages, each call replayed from a CUDA graph over input sets four "
               "times the L2's size, median of 100.")


def _live_view(page: str) -> None:
    key = f"{page}-qk"
    shown: KernelShape = page_settings(key, KernelShape)
    with st.form(f"{key}-form", border=True):
        c = st.columns([1, 1, 2])
        batch = c[0].selectbox("Sequences in the batch", BATCHES, index=BATCHES.index(shown.batch), key=f"{key}-b")
        context = c[1].selectbox("Context per sequence", CONTEXTS, index=CONTEXTS.index(shown.context),
                                 format_func=lambda n: f"{n:,} tokens", key=f"{key}-l")
        submitted = c[2].form_submit_button("Time the kernels on this GPU", icon=":material/timer:", type="primary")
    candidate = None
    if submitted:
        mark_requested(key)
        candidate = KernelShape(int(batch), int(context))
    settings: KernelShape = submitted_settings(key, candidate)
    result = run_on_request(key, settings, lambda _bar: time_quant_decode(settings.batch, settings.context),
                            "Timing the decode kernels…", "Timing the kernels failed",
                            "Press **Time the kernels on this GPU**: every format's pool is built and quantized, then "
                            "each call is replayed from a CUDA graph (a few seconds).")
    if result is not None:
        _call_view(result, f"measured live on {device_label()}", f"{key}-call", ceilings_for(device(), prefer_table=True))
        st.markdown(_verdict([result]))
    with st.expander(f"The sweep measured on an H200 ({BENCH_COMMAND})"):
        _measured_view(page)


def fused_kernel_section(page: str) -> None:
    _intro()
    if device() == "cpu":
        st.caption(":material/memory: No CUDA GPU on this server, so the Triton kernel cannot run here (the lab above "
                   "runs the torch path on the CPU). What it measured on a GPU:")
        _measured_view(page)
    else:
        _live_view(page)
