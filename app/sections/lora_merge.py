"""Sections of the merge-or-serve page (pages/16_lora_merge.py composes them)."""
from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from engine.lora.adapter import TARGETS
from engine.lora.merge_lab import (BATCH_CHOICES, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, RANDOM, RANKS, MergeResult,
                                   MergeSettings, Progress, bundled_names, default_settings, resolve_adapter,
                                   stored_merge_lab)
from engine.result_store import StoredResult
from engine.weights import LoadedWeights
from engine.lora.anatomy import spectrum

from app.analysis.lora_merge import (BENCH_COMMAND, H200_BYTES, LLAMA_8B, adapter_changes_at, divergence, examples,
                                     form_settings, learned_frame, live_deployment, load_bench, memory_frame,
                                     result_json, shaped_deployment, timing_frame, training_line)
from app.charts.lora_merge import (WAY_COLORS, WAY_LABELS, anatomy_figure, bench_figure, memory_figure,
                                   spectrum_figure, step_time_figure)
from app.formatting import NO_VALUE, fmt_bytes, fmt_duration, plural
from app.runtime import device, device_label, dtype_name, shared_weights, weights_mode
from app.state import page_cache, page_run, page_settings, progress_reporter, submitted_settings
from app.table_columns import in_percent_points, share_column
from app.theme import show_figure
from app.widgets.answer_rows import answer_rows
from app.widgets.explain import explanation

TRAIN_COMMAND = "python -m training.train_lora --adapter all"


def lora_explanation() -> None:
    cfg = shared_weights().config
    h, i = cfg.hidden_size, cfg.intermediate_size
    r = 8
    explanation(
        "Two ways to run one fine-tune",
        [r"y = W x + \tfrac{\alpha}{r}\, B (A x)",
         r"W' = W + \tfrac{\alpha}{r}\, B A \;\Rightarrow\; W' x = W x + \tfrac{\alpha}{r}\, B (A x)",
         r"\text{FLOPs: } 2 d_{in} d_{out} \;\text{vs}\; {+2r(d_{in} + d_{out})}",
         r"\text{bytes for N: } N\, |W| \;\text{vs}\; {|W| + N\, |A, B|}"],
        ["**Merge**: add the low-rank update into every adapted weight once. The result is an ordinary checkpoint: "
         "no extra kernels, exactly the base model's speed, and **one full copy of the weights per fine-tune**.",
         "**Serve unmerged**: keep W shared and apply each row's own A and B after the base matmul. A batch can mix "
         "requests for different fine-tunes; every adapted linear costs two extra thin matmuls per step.",
         f"On this model's gate projection ({h} → {i}) at rank {r}: {2 * h * i / 1e6:.2f} MFLOP per token for W "
         f"against {2 * r * (h + i) / 1e3:.0f} kFLOP for B(Ax), {r * (h + i) / (h * i):.1%} more; the same share "
         "in bytes.",
         "**The same tokens either way**: W′x and Wx + (α/r)B(Ax) are the same sum, rounded differently. Below, "
         "both deployments answer the same prompt and the page checks them token by token.",
         "**The trade**: merge when one fine-tune serves all the traffic; serve unmerged when many fine-tunes share "
         "one deployment (one base in memory, adapters of a few MiB, any mix in one batch)."],
        note="A is r × d_in and B is d_out × r, r far below both. Per adapted linear W (d_out × d_in) and token: "
             "the FLOPs of W against what the adapter adds; the bytes of N fine-tunes merged against one base and N "
             "adapters. α/r scales the update (here α = 2r). LoRA trains only A and B; the base weights never "
             "change, so the adapter file is all a fine-tune adds.")


def backend_line() -> None:
    dev, where = device(), device_label()
    kernels = ("the torch reference kernels (no GPU on this server; Triton is not used): the LoRA update is two "
               "small matmuls per fused linear and adapter, after the base matmul" if dev == "cpu" else
               "Triton kernels: the base GEMM, then the batched LoRA shrink and expand (SGMV-style) per fused linear")
    st.caption(f":material/memory: **SmolLM2-135M-Instruct** ({weights_mode()} weights) on {where} "
               f"({dtype_name()}) · {kernels} · every number below is measured by the live engine on this server.")


# ---- settings ------------------------------------------------------------------------------------

def _key(page: str, name: str) -> str:
    return f"{page}-{name}"


def _adapter_label(name: str) -> str:
    if name == RANDOM:
        return "random rank-r adapter (timing only)"
    try:
        a = resolve_adapter(shared_weights().config, name, 8)
    except (ValueError, OSError):
        return f"{name} (unreadable file)"
    return f"{name} · rank {a.rank} · {targets_words(a.targets)}"


def targets_words(targets: tuple[str, ...]) -> str:
    if set(targets) == set(TARGETS):
        return "every linear"
    if set(targets) == {"q", "k", "v", "o"}:
        return "attention (q, k, v, o)"
    return ", ".join(targets)


def settings_form(page: str) -> MergeSettings:
    """The form; returns the settings to show (the last ones that ran: a rejected form keeps them, with its
    message)."""
    shown: MergeSettings = page_settings(page, default_settings)
    names = bundled_names()
    if not names:
        st.info(f"**No trained adapter yet**: engine/assets/adapters/ holds no adapter file (`{TRAIN_COMMAND}` "
                "writes pirate, terse and bullets). The page runs a **random** adapter: every cost below is real, "
                "but it learned nothing, so its answer is just a perturbed base answer.", icon=":material/info:")
    choices = [*names, RANDOM]
    with st.form(f"{page}-form", border=True):
        c = st.columns([2.4, 1, 1])
        adapter = c[0].selectbox("Adapter", choices, index=choices.index(shown.adapter) if shown.adapter in choices
                                 else len(choices) - 1, format_func=_adapter_label, key=_key(page, "adapter"),
                                 help="the trained adapters in engine/assets/adapters/, or random A and B of any "
                                      "rank (for the cost at each rank)")
        rank = c[1].selectbox("Random rank r", RANKS, index=RANKS.index(shown.rank) if shown.rank in RANKS else 1,
                              key=_key(page, "rank"), help="only for the random adapter; a trained one has its own")
        new_tokens = c[2].number_input("Tokens to generate", 1, MAX_NEW_TOKENS, shown.max_new_tokens,
                                       key=_key(page, "new-tokens"))
        # Every size on view, the chosen ones lit, on a row of its own: a multiselect in a fourth of the row kept
        # its chips on one line, and at 1024 pixels with the sidebar open "32" of "1, 8, 32" scrolled out of sight.
        batches = st.segmented_control("Decode batch sizes to time", BATCH_CHOICES, selection_mode="multi",
                                       default=list(shown.batch_sizes), key=_key(page, "batches"),
                                       help="B copies of the prompt decode together on each deployment")
        prompt = st.text_input("Prompt (a chat message every deployment answers)", shown.prompt,
                               key=_key(page, "prompt"),
                               help=f"up to {MAX_PROMPT_CHARS:,} characters; sent in the model's ChatML template")
        submitted = st.form_submit_button("Merge, serve and measure", icon=":material/play_arrow:", type="primary")
    candidate = None
    if submitted:
        candidate = form_settings(str(adapter), int(rank), str(prompt), int(new_tokens), batches)
    return submitted_settings(page, candidate)


def lab_run(weights: LoadedWeights, s: MergeSettings, progress: Progress | None = None) -> StoredResult[MergeResult]:
    """The lab at the server's device and dtype, read back from disk when it ran before: what the page runs and
    what `python3 -m app.prewarm` computes ahead of a class."""
    return stored_merge_lab(weights, s, progress, device(), dtype_name())


def get_result(page: str, s: MergeSettings) -> MergeResult | None:
    """The run for these settings (`page_run`: this tab's, the server's, or computed now with a progress bar)."""
    def run(bar) -> StoredResult[MergeResult]:  # noqa: ANN001 (a Streamlit progress bar)
        return lab_run(shared_weights(), s, progress_reporter(bar))

    return page_run(page, s, run, "Merging and serving…", "The run failed")


# ---- results -------------------------------------------------------------------------------------

def answers_section(result: MergeResult) -> None:
    decode = shared_weights().tokenizer.decode
    st.subheader("The same fine-tune, deployed two ways")
    desc = f" (“{result.description}”)" if result.description else ""
    st.markdown(f"Adapter **{result.adapter_name}**{desc} · rank {result.rank}, α = {result.alpha:g}, on "
                f"{targets_words(result.targets)} of every layer. “{html.escape(result.settings.prompt)}” "
                f"({plural(result.prompt_tokens, 'prompt token')} in ChatML), greedy, from the live engine: the base "
                "model and the unmerged adapter are two rows of **one batch on one LoRA engine**; the merged "
                "checkpoint runs on a plain engine.")
    answer_rows([(WAY_LABELS[a.kind], WAY_COLORS[a.kind], a.token_ids) for a in result.answers],
                result.merged.token_ids, decode, "lm")
    st.caption("Plain text matches the merged checkpoint's answer; the highlighted rest is where an answer leaves it.")
    n = len(result.merged.token_ids)
    d = divergence(result, decode)
    if d is None:
        st.success(f"**Merged and unmerged wrote the same {plural(n, 'token')}.** W′x and Wx + (α/r)·B(Ax) are "
                   f"the same sum in a different order; in {result.dtype} the difference stays far below what "
                   "flips a greedy choice.", icon=":material/check_circle:")
    else:
        st.warning(f"**Merged and unmerged part at token {d.position + 1}** of {n}: merged wrote "
                   f"`{d.merged!r}`, unmerged `{d.unmerged!r}`. The sums are equal in exact arithmetic; "
                   + ("in bfloat16 the merged W′ is rounded once more when stored (an update of a few per cent "
                      "loses part of its bits), so near-tied tokens can flip." if result.dtype == "bfloat16" else
                      "a near-tie between two tokens was decided by rounding."), icon=":material/compare_arrows:")
    at = adapter_changes_at(result)
    st.caption("The base model's answer " + ("is the fine-tune's too: this prompt does not show the adapter's effect."
                                             if at is None else f"leaves the fine-tune's at token {at + 1}."))


def learned_section(result: MergeResult) -> None:
    meta = dict(result.meta)
    if not meta:
        if result.settings.adapter == RANDOM:
            st.caption("A random adapter has no training record: it stands in for a fine-tune of rank "
                       f"{result.rank} in every cost below, and its answer is noise around the base model's.")
        return
    st.subheader("What this fine-tune learned")
    line = training_line(meta)
    st.markdown(f"From its training record (in the adapter file){': ' + line if line else ''}. Held-out prompts "
                "the adapter never trained on, base model against the fine-tune:")
    frame = learned_frame(meta)
    if frame is not None:
        st.dataframe(frame, hide_index=True, width="stretch")
    ex = examples(meta)
    if ex:
        with st.expander(f"{plural(len(ex), 'held-out example')} from training"):
            for e in ex:
                st.markdown(f"**{html.escape(e['prompt'])}**")
                c = st.columns(2)
                c[0].caption("Base model")
                c[0].text(e["base"])
                c[1].caption("Fine-tuned")
                c[1].text(e["adapted"])


def _gpu_extra_text(bench: pd.DataFrame) -> str:
    """What the fused GPU kernels add in the bench: little in milliseconds, much relative to a step of this
    small a model (the chart's GPU lines sit above the CPU's, which read as the GPU doing worse)."""
    extra_ms = bench["unmerged_ms"] - bench["merged_ms"]
    return (f"A GPU kernel fuses that work: in the bench below it adds {extra_ms.min():.2g} to {extra_ms.max():.2g} "
            f"ms a step, yet that is {bench['extra'].min():+.0%} to {bench['extra'].max():+.0%} of the step, "
            f"because a whole step of a 135M model there takes only {bench['merged_ms'].min():.2g} to "
            f"{bench['merged_ms'].max():.2g} ms.")


def timing_section(result: MergeResult, page: str) -> None:
    st.subheader("What serving it unmerged costs per decode step")
    frame = timing_frame(result)
    cols = st.columns(len(frame))
    for col, (_, row) in zip(cols, frame.iterrows()):
        col.metric(f"Batch {int(row['Batch'])}: unmerged", f"{row['Unmerged ms']:.3g} ms",
                   f"{row['Extra']:+.0%} vs merged", delta_color="inverse",
                   help=f"merged {row['Merged ms']:.3g} ms (the base model's cost); medians of "
                        f"{result.settings.timed_steps} timed steps")
    show_figure(step_time_figure(result), key=f"{page}-steps", height=460)
    shown = in_percent_points(frame, "Extra", "LoRA share of step", "LoRA FLOPs vs linears")
    num = st.column_config.NumberColumn
    # Set widths, short headers (the details in the tooltips) and the milliseconds' unit in the cells ("62.8 ms"
    # under "Merged"): at 1024 pixels with the sidebar open (a 690-pixel page) the nine columns took 722 and hid
    # "Unmerged tok/s". A GPU's "0.712 ms" still fits.
    st.dataframe(shown, hide_index=True, width="stretch", placeholder=NO_VALUE, column_config={
        "Batch": num(width=48),
        "Merged ms": num("Merged", format="%.3g ms", width=62, help="median decode step of the merged "
                                                                    "checkpoint: the base model's shapes, so the "
                                                                    "base model's cost"),
        "Unmerged ms": num("Unmerged", format="%.3g ms", width=72, help="median decode step with the adapter served "
                                                                        "unmerged by the LoRA kernels"),
        "Extra": num(format="%+.0f%%", width=54, help="unmerged / merged − 1"),
        "LoRA kernels ms": num("LoRA", format="%.3g ms", width=62, help="the LoRA kernels (lora.qkv + lora.o + "
                                                                        "lora.gate_up + lora.down over 30 layers) "
                                                                        "in the unmerged median step"),
        "LoRA share of step": share_column("LoRA share", width=96,
                                           help="the LoRA kernels' share of the unmerged step"),
        "LoRA FLOPs vs linears": num(
            "LoRA FLOPs", format="%.1f%%", width=80,
            help="the LoRA kernels' FLOPs over the base linears' (LM head included), as the engine counts them: its "
                 "slots pad every fused linear to the full stacked rank"),
        "Merged tok/s": num(format="%.0f", width=88, help="decode tokens a second: batch / merged step"),
        "Unmerged tok/s": num(format="%.0f", width=105, help="decode tokens a second: batch / unmerged step"),
    })
    last = frame.iloc[-1]
    fp = result.footprint
    gpu_bench = load_bench("cuda") if result.device == "cpu" else None
    where = ("On this CPU the LoRA kernels take far more of the step than their arithmetic: the torch reference "
             "groups the rows by adapter and runs two small matmuls per fused linear (120 calls a step), each "
             "with a fixed cost that a thin rank-r matmul cannot hide. "
             + (_gpu_extra_text(gpu_bench) if gpu_bench is not None else
                f"A GPU kernel fuses that work (`{BENCH_COMMAND} --device cuda --weights random` measures it there).")
             if result.device == "cpu" else
             "Each LoRA kernel is a thin shrink and expand over the rows of each adapter; at large batches the "
             "base GEMM grows and the adapter's share shrinks.")
    st.caption(f"B copies of the prompt decode together on each deployment, one step of each in turn so both see "
               f"the same load; {result.settings.warmup_steps} warm-up steps, then the median of "
               f"{result.settings.timed_steps} (the kernel split: the median of as many more, timed per kernel). "
               f"The adapter's own arithmetic is {fp.extra_flops_share:.1%} of the base model's per token (the "
               f"engine's stacked slots multiply {fp.served_flops / (fp.base_linear_flops + fp.lm_head_flops):.1%}: "
               f"a fused linear's B holds zero blocks); at batch {int(last['Batch'])} the unmerged step is "
               f"{last['Extra']:+.0%}. {where}")
    bench_section(page)


def bench_section(page: str) -> None:
    frames = {}
    for dev, label in (("cpu", "CPU"), ("cuda", "GPU")):
        f = load_bench(dev)
        if f is not None:
            frames[f"{label} ({f.attrs.get('device', dev)})" if dev == "cuda" else label] = f
    if not frames:
        st.caption(f"No benchmark file for every rank yet: run `{BENCH_COMMAND}`.")
        return
    show_figure(bench_figure(frames), key=f"{page}-bench", height=440)
    notes = []
    for label, f in frames.items():
        threads = f.attrs.get("threads")
        notes.append(f"{label}: {f.attrs.get('weights')} weights, {f.attrs.get('dtype')}"
                     + (f", {plural(threads, 'thread')}" if label == "CPU" and threads else "")
                     + (", CUDA graphs" if f.attrs.get("graphs") else ""))
    st.caption(f"From `{BENCH_COMMAND}` ({'; '.join(notes)}). Only the page's run above is live.")


def anatomy_section(result: MergeResult, page: str) -> None:
    st.subheader("What the adapter adds: ΔW = (α/r)·BA, rank r")
    show_figure(anatomy_figure(result), key=f"{page}-anatomy", height=360)
    c = st.columns([1, 3], gap="medium")
    default = (result.spectrum.layer, result.spectrum.target)
    targets = list(result.targets)
    with c[0]:
        st.markdown("**Pick a linear**")
        layer = st.number_input("Layer", 0, shared_weights().config.num_layers - 1, default[0],
                                key=f"{page}-sv-layer-{result.adapter_name}")
        target = st.selectbox("Projection", targets, index=targets.index(default[1]), format_func=lambda t: f"{t}_proj",
                              key=f"{page}-sv-target-{result.adapter_name}")
        st.caption(f"Opened on the linear the adapter changes most (layer {default[0]}, {default[1]}_proj).")
    sp = _spectrum(result, int(layer), str(target), page)
    with c[1]:
        show_figure(spectrum_figure(sp), key=f"{page}-spectrum", height=430, export_width=1050)
    st.caption(f"ΔW is B (d_out × {result.rank}) times A ({result.rank} × d_in): at most {result.rank} independent "
               f"directions, whatever the layer. W needs all of its {len(sp.weight)}. That is why an adapter is "
               "small and why merging it is free at inference: the sum W + ΔW is an ordinary matrix of W's shape.")


def _spectrum(result: MergeResult, layer: int, target: str, page: str):  # noqa: ANN202 (a Spectrum)
    if (layer, target) == (result.spectrum.layer, result.spectrum.target):
        return result.spectrum
    cache = page_cache(page).setdefault("spectra", {})
    key = (id(result), layer, target)
    if key not in cache:
        if len(cache) > 16:
            cache.clear()
        cache[key] = spectrum(shared_weights(), result.adapter, layer, target)
    return cache[key]


def deployment_section(result: MergeResult, page: str) -> None:
    st.subheader("One checkpoint per fine-tune, or one base and many adapters")
    fp = result.footprint
    live = live_deployment(fp, "SmolLM2-135M")
    big = shaped_deployment(LLAMA_8B, result.rank, result.targets)
    c = st.columns(4)
    c[0].metric("Checkpoint (bf16)", fmt_bytes(fp.checkpoint_bytes),
                help=f"{fp.base_params:,} parameters in the state dict × 2 bytes: one merged fine-tune")
    c[1].metric("Adapter (bf16)", fmt_bytes(fp.adapter_bytes), f"{fp.adapter_share:.1%} of it",
                delta_color="off", delta_arrow="off", help=f"{fp.adapter_params:,} parameters of A and B × 2 bytes")
    c[2].metric("Extra FLOPs per token", f"+{fp.extra_flops_share:.1%}", delta_color="off",
                help=f"2r(d_in + d_out) over the adapted linears: {fp.adapter_flops / 1e6:.2f} MFLOP against "
                     f"{(fp.base_linear_flops + fp.lm_head_flops) / 1e6:.0f} MFLOP of base linears and LM head; "
                     f"the engine's padded slots compute {fp.served_flops / 1e6:.2f} MFLOP")
    # The capacity in the label, to the decimal the fits are divided by (the chart's line says the same).
    c[3].metric(f"On one H200 ({fmt_bytes(H200_BYTES)})", f"{live.merged_fit():,} merged",
                f"or 1 base + {live.adapters_fit():,} adapters", delta_color="off", delta_arrow="off",
                help=f"{fmt_bytes(H200_BYTES)} as torch reports it (NVIDIA quotes 141 GB), weights only (no KV cache): "
                     "whole checkpoints, or one base and adapters")
    show_figure(memory_figure(memory_frame([live, big]), live, big, H200_BYTES), key=f"{page}-memory", height=470)
    n = 100
    st.caption(f"At {n} fine-tunes: {fmt_bytes(live.merged_bytes(n))} merged against "
               f"{fmt_bytes(live.unmerged_bytes(n))} unmerged for this model; an 8B model "
               f"({fmt_bytes(big.checkpoint_bytes)} a checkpoint, {fmt_bytes(big.adapter_bytes)} an adapter of "
               f"this shape) fits {big.merged_fit()} merged copies on an H200 ({fmt_bytes(H200_BYTES)}), or one "
               f"base and {big.adapters_fit():,} adapters. In practice the KV cache needs most of that memory too.")
    left, right = st.columns(2)
    with left.container(border=True):
        # The LoRA kernels' time, not the "Extra" column: on a busy host a merged step can time slower than an
        # unmerged one (-27 % read as extra work that merging removes).
        lora_ms = timing_frame(result)["LoRA kernels ms"].dropna()
        gone = (f" (the LoRA kernels' {lora_ms.min():.3g} to {lora_ms.max():.3g} ms a step above are gone)"
                if len(lora_ms) else "")
        st.markdown(f"**Merge** when one fine-tune takes all the traffic: zero extra work per step{gone}, any kernel "
                    "or runtime serves it, and each fine-tune is its own deployment.")
    with right.container(border=True):
        st.markdown("**Serve unmerged** when many fine-tunes share a deployment: one base in memory, "
                    f"{fmt_bytes(fp.adapter_bytes)} per extra fine-tune, and requests for different fine-tunes "
                    "batched together, for a little time on every step.")


def download_section(result: MergeResult, page: str) -> None:
    st.download_button("Download this run (JSON)", result_json(result), file_name="lora_merge.json",
                       mime="application/json", icon=":material/download:", key=f"{page}-download")
    st.caption(f"The run took {fmt_duration(result.seconds)} (merging {fmt_duration(result.merge_seconds)}); it is "
               "kept for everyone on this server, so a class opening the page sees it at once.")
