"""The FlashAttention page's decoding section: split-KV (Flash-Decoding) on the prompt's newest row, the
engine's split plan, and what splitting measured on the H200."""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st
import torch

from kernels.split_kv_trace import SplitKVTrace, launched_splits, split_kv_decode

from app.analysis.flash_qkv import LayerQKV
from app.analysis.split_kv import (GpuShape, PlannerRule, kernel_check, kv_bytes, load_split_bench, merge_bytes,
                                   plan_gpu, plan_grid, planner_rule)
from app.charts.split_kv import merge_chart, plan_heatmap, split_gain_chart, split_scores_chart
from app.formatting import fmt_bytes, plural
from app.runtime import device
from app.sections.flashattention import PAGE  # one page cache: the kinds below differ from that module's
from app.state import cached_by_kind
from app.theme import show_figure

SPLIT_CHOICES = [1, 2, 3, 4, 6, 8]
LAYOUTS = {"every S-th tile (the engine's decode kernel)": "interleaved", "contiguous ranges": "contiguous"}


def _cached(key: tuple, build):  # noqa: ANN001, ANN202
    return cached_by_kind(PAGE, key, build)


def decoding_section(token_ids: tuple[int, ...], layer: int, head: int, block_n: int, qkv: LayerQKV) -> None:
    st.subheader("Decoding: split-KV (Flash-Decoding)")
    hq, hkv, d = int(qkv.q.shape[1]), int(qkv.k.shape[1]), int(qkv.k.shape[2])
    gpu, rule = plan_gpu(), planner_rule()
    st.markdown(
        f"A decode step has **one query row** per head, so the query tiles FA2 spreads over programs are gone. "
        f"With one program per sequence and KV head (the engine's decode kernel gives each KV head's "
        f"{hq // hkv} query heads to one program), batch 1 runs {hkv} programs on a GPU with {gpu.sms} SMs: "
        f"the keys stream through {hkv} SMs while the rest idle. Flash-Decoding cuts the keys into S splits, one "
        "program each: every split runs the online softmax above over its own tiles and leaves a partial (its max "
        "m_s, its sum l_s, an unnormalised output), and a second, tiny kernel merges them. Below: the prompt's "
        "newest token (row N − 1, which sees all N keys, exactly what a decode step computes), same layer and "
        "query head as above.")
    c = st.columns([2, 3, 3])
    splits = int(c[0].select_slider("Splits S (programs per KV head)", SPLIT_CHOICES, value=4, key="flash-splits",
                                    help="The S asked for. As in the engine's launcher, each split gets "
                                         "ceil(tiles / S) whole K tiles, and a split left without a tile never "
                                         "runs: fewer tiles than S run fewer programs"))
    layout_label = c[1].radio("How the K tiles are dealt", list(LAYOUTS), key="flash-split-layout",
                              help="The engine's decode kernel gives split s the tiles s, s + S, s + 2S, …: its first "
                                   "tile is then known from the program id alone, before the context length "
                                   "arrives. The Flash-Decoding write-up uses contiguous ranges; the merge is the "
                                   "same.")
    trace: SplitKVTrace = _cached(
        ("splitkv", token_ids, layer, head, block_n, splits, layout_label),
        lambda: split_kv_decode(qkv.q[-1].float().cpu(), qkv.k.float().cpu(), qkv.v.float().cpu(), qkv.scale,
                                splits, block_n, LAYOUTS[layout_label], head=head))
    _metrics(trace, hq, hkv, d, gpu.sms)
    left, right = st.columns([1.5, 1])
    with left:
        show_figure(split_scores_chart(trace), key="flash-split-scores", height=430)
    with right:
        show_figure(merge_chart(trace), key="flash-split-merge", height=430)
    st.markdown(r"$\displaystyle M = \max_s m_s,\quad L = \sum_s e^{\,m_s - M}\,\ell_s,\quad "
                r"O = \frac{1}{L}\sum_s e^{\,m_s - M}\,\mathrm{acc}_s$")
    st.caption(split_caption(trace, rule.decode_tile))
    _plan_part(hq, hkv, gpu, rule)
    _measured_part()
    if torch.device(device()).type == "cuda":
        _kernel_part(token_ids, layer, splits, qkv)


def _metrics(trace: SplitKVTrace, hq: int, hkv: int, d: int, sms: int) -> None:
    m = st.columns(4)
    m[0].metric("Keys the decode row sees", f"{trace.seq_len:,}",
                help=f"{plural(trace.num_tiles, 'K tile')} of {trace.block_n} keys (the K tile control above)")
    # The splits that run, not the S asked for: the launcher starts no program for a split without a tile.
    m[1].metric("Programs at batch 1", f"{hkv * trace.splits}",
                delta=(f"{hkv} without splits, {sms} SMs" if trace.asked == trace.splits else
                       f"{trace.splits} of S = {trace.asked} splits run"), delta_color="off", delta_arrow="off",
                help=f"{hkv} KV heads × {plural(trace.splits, 'split')} that run" + dropped_splits_text(trace))
    m[2].metric("Merged vs one pass", f"{trace.max_abs_diff:.1e}",
                help="Largest |difference| over all heads and dimensions between the merged output and softmax(qKᵀ)V "
                     "over all keys at once, both in fp32: float rounding, so the merge is exact")
    merge = merge_bytes(hq, trace.splits, d)
    m[3].metric("The merge reads", fmt_bytes(merge) if merge else "nothing",
                help=f"Each of the {plural(trace.splits, 'split')} that run leaves its fp32 accumulator ({d} numbers), "
                     f"max and sum, per query head; the splits read {fmt_bytes(kv_bytes(trace.seq_len, hkv, d))} of "
                     "bf16 K and V for this layer between them. With one split the kernel writes the output directly "
                     "and skips the merge")


def dropped_splits_text(trace: SplitKVTrace) -> str:
    """Why fewer splits run than S asked for (empty when all of them run): the launcher's own rule."""
    if trace.asked == trace.splits:
        return ""
    per = math.ceil(trace.num_tiles / trace.asked)
    return (f". S = {trace.asked} gives each split {plural(per, 'tile')} of {trace.block_n} keys, so "
            f"{plural(trace.num_tiles, 'tile')} fill {plural(trace.splits, 'split')}: the engine's launcher (`plan` "
            "in kernels/paged_attention_triton.py) starts no program for a split that would own no tile, so the "
            f"other {trace.asked - trace.splits} of the {trace.asked} never run and the merge reads nothing from them")


def split_caption(trace: SplitKVTrace, kernel_tile: int) -> str:
    """What the two charts show for this prompt: where the row's max sits and how the shares fall, or why only
    one split runs; and how the kernel's own tile size would deal these keys."""
    if trace.splits == 1:
        return _one_split_text(trace) + _kernel_tile_text(trace, kernel_tile)
    top = max(trace.partials, key=lambda p: p.m)
    biggest = max(trace.partials, key=lambda p: p.weight)
    text = (f"Each split sees only its own keys, so its max m_s (diamonds) is a local one; split {top.split} holds "
            f"the row's max M = {trace.m:.3f}. The merge multiplies every split's sum and output by exp(m_s − M) ≤ 1, "
            f"the same rescale the online softmax applies when its max grows, once per split instead of once per "
            f"tile. Split {biggest.split} carries {100 * biggest.weight:.0f} % of the row's softmax mass")
    if trace.scores.numel() and int(trace.scores.argmax()) == 0 and biggest.split == trace.owner[0]:
        text += " (key 0, an attention sink, is in its first tile)"
    text += (". Change S or the dealing: the shares move, the output does not (the metric above stays at float "
             "rounding).")
    return text + _kernel_tile_text(trace, kernel_tile)


def _one_split_text(trace: SplitKVTrace) -> str:
    if trace.asked == 1:
        return ("One split: its program streams every tile itself and writes the output directly, with nothing to "
                "merge. Raise S to cut the keys over several programs.")
    fit = "fits" if trace.seq_len == 1 else "fit"
    return (f"The row's {plural(trace.seq_len, 'key')} {fit} in {plural(trace.num_tiles, 'tile')} of {trace.block_n}, "
            f"so one split runs whatever S asks (the launcher drops splits that would own no tile) and writes the "
            "output directly, with nothing to merge. A smaller K tile or a longer prompt splits the keys.")


def _kernel_tile_text(trace: SplitKVTrace, kernel_tile: int) -> str:
    """How the engine's decode tile would deal these keys at the same S, so the chart's tile size is not read
    as the kernel's (a fixed "small tiles keep the splits visible" was false at 128-key tiles)."""
    if trace.block_n == kernel_tile:
        return f" The engine's kernel uses the same {kernel_tile}-key tiles for decode."
    kernel = launched_splits(math.ceil(trace.seq_len / kernel_tile), trace.asked)
    text = (f" The engine's kernel uses {kernel_tile}-key tiles for decode: asked for S = {trace.asked}, it would "
            f"run {plural(kernel, 'split')} on these keys")
    if kernel == trace.splits:
        return text + ", as here."
    if kernel < trace.splits:
        return text + f"; {trace.block_n}-key tiles here show {trace.splits}, so a short prompt's splits stay visible."
    return text + f"; {trace.block_n}-key tiles here leave {trace.splits}."


def _plan_part(hq: int, hkv: int, gpu: GpuShape, rule: PlannerRule) -> None:
    cells = _cached(("splitplan", gpu.sms, hq, hkv), lambda: plan_grid(hq, hkv, gpu.sms))
    left, right = st.columns([1.2, 1])
    with left:
        show_figure(plan_heatmap(cells, hkv, gpu.sms, gpu.name if gpu.live else f"an {gpu.name}"),
                    key="flash-split-plan", height=430, export_width=900)
    with right:
        st.markdown("**How many splits, and when none**")
        st.markdown(
            f"The grid is the engine's own decode launcher (`kernels/paged_attention_triton.py`, `plan`) asked for "
            f"{'this GPU' if gpu.live else 'an H200 (this server has no GPU)'}. It aims at {rule.programs_per_sm} "
            f"programs per SM: batch × {hkv} KV heads × S ≈ {rule.programs_per_sm} × {gpu.sms}, but never fewer than "
            f"{rule.min_partition} keys per split, because every split adds a partial to write and merge. At batch 1 "
            "the splits grow with the context; from batch 64 the sequences alone nearly fill the GPU and one or two "
            "splits are enough; at short contexts with many sequences it drops the split, and its merge kernel, "
            "altogether.")


def _measured_part() -> None:
    bench = load_split_bench()
    if bench is None:
        st.info("No recorded split-KV timings: run `python3 bench/split_kv.py` on a GPU to write "
                "`bench/results/split_kv_h200.json`.", icon=":material/info:")
        return
    left, right = st.columns([1.2, 1])
    with left:
        show_figure(split_gain_chart(bench), key="flash-split-gain", height=430, export_width=900)
    with right:
        rows = sorted(bench.rows, key=lambda r: (r.batch, r.context))
        # Numbers, not pre-formatted text, so that each column sorts by value ("16,384" sorted before "2,048").
        st.dataframe(pd.DataFrame([{"batch": r.batch, "context": r.context, "splits": r.splits,
                                    "split µs": r.split_us, "unsplit µs": r.one_split_us, "gain": r.gain}
                                   for r in rows]),
                     hide_index=True, height=390, column_config={  # one decimal throughout: "6.0", not "6"
                         "context": st.column_config.NumberColumn(format="%,.0f"),
                         "split µs": st.column_config.NumberColumn(format="%.1f"),
                         "unsplit µs": st.column_config.NumberColumn(format="%.1f", help="the same call with "
                                                                     "one split: one program per (sequence, head)"),
                         "gain": st.column_config.NumberColumn(format="%.2f×")})
    best = max(bench.rows, key=lambda r: r.gain)
    st.caption(f"Recorded with `{bench.command}` on the {bench.device} (`bench/results/split_kv_h200.json`): one "
               "decode step's attention for one layer, bf16, 16-token pages in shuffled order, CUDA-graph timed. "
               f"Splitting pays most where the GPU was emptiest: batch {best.batch} at {best.context:,} tokens, "
               f"{best.gain:.1f}× ({best.one_split_us:.0f} → {best.split_us:.1f} µs); at batch 64 the sequences "
               "already fill the GPU and the splits add at most a few per cent. The chart's hover also gives torch "
               "SDPA on a contiguous cache, the reference the kernel is benchmarked against.")


def _kernel_part(token_ids: tuple[int, ...], layer: int, splits: int, qkv: LayerQKV) -> None:
    runs = _cached(("splitcheck", token_ids, layer, splits), lambda: kernel_check(qkv, splits))
    st.markdown(":material/memory: **The engine's Triton decode kernel on this GPU**, on the same row (every query "
                "head, batch 1), reading K and V through a block table from shuffled 16-token pages:")
    st.dataframe(pd.DataFrame([{"launch": r.label, "splits": r.splits, "keys per split": r.partition,
                                "K tile": r.block_n, "rel. error vs float64": r.rel_err} for r in runs]),
                 hide_index=True, column_config={"rel. error vs float64": st.column_config.NumberColumn(format="%.1e")})
