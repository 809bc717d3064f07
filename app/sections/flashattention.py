"""Sections of the FlashAttention-2 page (pages/05_flashattention.py composes them)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st
import torch

from kernels.flash_trace import FlashTrace, flash_attention_tiled

from app.analysis.flash_compare import (MATRIX_DTYPE, STATE_DTYPE, AttentionMemory, MethodResult, compare_methods,
                                        kernel_tiles_text, largest_cpu_cache, memory_table)
from app.analysis.flash_qkv import LayerQKV, layer_qkv
from app.analysis.flashattention_tiles import tile_shares
from app.charts.flash_tiles import future_tiles, method_chart, online_softmax_chart, score_matrix, tile_grid
from app.formatting import fmt_bytes, plural
from app.runtime import backend_summary, device, dtype_name, shared_weights, weights_mode
from app.state import cached_by_kind, page_cache
from app.theme import show_figure
from app.widgets.explain import explanation

PAGE = "flash"
MAX_TOKENS = 1024
ROW_KEY = "flash-row"
ROW_N_KEY = "flash-row-n"  # the N the followed row was chosen for
LAST_IDS_KEY = "flash-last-ids"  # the last prompt that had tokens: shown while the prompt box is empty
SINK_SHARE = 0.3  # key 0 taking this much of an average row's weight is called an attention sink
TILE_SIZES = [8, 16, 32, 64, 128]
DEFAULT_PROMPT = (
    "FlashAttention computes exact attention without ever writing the full matrix of attention scores to "
    "memory. It splits the queries into tiles that stay in fast on-chip memory, streams the keys and values "
    "past them tile by tile, and keeps only a running maximum and a running sum for every query row. When a "
    "new tile contains a larger score, everything accumulated so far is rescaled by the exponential of the "
    "difference between the old and the new maximum. With a causal mask, tiles that lie entirely in the "
    "future of every query in the tile are skipped, so about half of the work disappears. Explain this to a "
    "student in three short sentences."
)


@dataclass(frozen=True, slots=True)
class FlashSettings:
    token_ids: tuple[int, ...]
    layer: int
    head: int
    block_m: int
    block_n: int
    row: int
    show: str  # "probabilities" or "scores"


def flash_header() -> None:
    cfg = shared_weights().config
    model = cfg.name if weights_mode() == "real" else f"random weights ({cfg.name} shape)"
    st.caption(f":material/memory: **{model}** · live attention backend: **{backend_summary()}** · "
               f"dtype {dtype_name()}")


def flash_explanation() -> None:
    explanation(
        "Online softmax, one key tile at a time",
        # S and m on separate lines: on one they overflowed the formula column at a 1500-pixel window.
        [r"S_{ij} = Q_i K_j^{\top} / \sqrt{d}",
         r"m^{(j)} = \max\big(m^{(j-1)},\ \operatorname{rowmax} S_{ij}\big)",
         r"\ell^{(j)} = e^{\,m^{(j-1)} - m^{(j)}}\,\ell^{(j-1)} + \operatorname{rowsum} e^{\,S_{ij} - m^{(j)}}",
         r"O^{(j)} = e^{\,m^{(j-1)} - m^{(j)}}\,O^{(j-1)} + e^{\,S_{ij} - m^{(j)}}\, V_j",
         r"O = O^{(\text{last})} \,/\, \ell^{(\text{last})}",
         r"\text{memory: naive } \Theta(N^2) \text{ per head}, \quad\allowbreak \text{FA2 } \Theta(N)"],
        ["The tile grid: one Q tile per program; K/V tiles stream past it. Blue tiles need no mask, orange tiles "
         "straddle the diagonal and apply the causal mask, grey tiles are entirely in the future and are never "
         "loaded: about half the grid.",
         "The row chart: the running max only ever rises; each time it does, the sum so far (and the output "
         "accumulator) is multiplied by exp(m_old − m_new) < 1. After the last tile both equal the values "
         "computed from the whole row at once: exact, not an approximation.",
         "The heatmap is what naive attention writes to memory for one head: N² numbers (and the same again for "
         "the probabilities). FA2 keeps two numbers per row instead.",
         "Change the tile sizes: the number of skipped tiles and of rescales changes, the output does not "
         "(the error column stays at float rounding).",
         "In deep layers the first token (an attention sink) holds the row's max from tile 0 on, so the max "
         "rarely grows; early layers (0–3) rescale more often.",
         "At the bottom, decoding: one query row, its keys split over S programs (Flash-Decoding). Each split's "
         "max is only local; one rescale per split in the merge gives the same output, and the splits are what "
         "keeps a GPU busy at batch 1."],
        note="The real Triton kernel also works in base 2 (exp2 with scores pre-multiplied by log₂e) and keeps O "
             "unnormalised in fp32 registers; the math is the same.",
    )


def _times(ratio: float) -> str:
    """A ratio as '512×', '2.5×' or '0.5×': ',.0f' printed 0.5 as '0×'."""
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.2g}×"


def _tokenize(prompt: str, chat: bool) -> list[int]:
    tok = shared_weights().tokenizer
    if chat:
        return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return tok.encode(prompt)


def _prompt_ids(prompt: str, chat: bool) -> list[int]:
    """The prompt's tokens (the first MAX_TOKENS); for an empty prompt the last prompt that had some (or the
    default one), so every control and chart below stays on the page while the student types."""
    if str(prompt).strip():
        ids = _tokenize(str(prompt), chat)
        if len(ids) > MAX_TOKENS:
            st.warning(f"The prompt has {len(ids):,} tokens; this page uses the first {MAX_TOKENS:,}.",
                       icon=":material/content_cut:")
            ids = ids[:MAX_TOKENS]
        st.session_state[LAST_IDS_KEY] = ids
        return ids
    ids = st.session_state.get(LAST_IDS_KEY) or _tokenize(DEFAULT_PROMPT, True)
    st.error(f"Type a prompt: FlashAttention needs at least one token. Until then the page shows the last "
             f"prompt ({plural(len(ids), 'token')}).", icon=":material/error:")
    return ids


def _follow_last_row_on_new_length(n: int) -> None:
    """A prompt of a new length follows its last row (it sees every K tile of its Q tile: the most to
    watch); a row picked for this length stays. Without the reset, row 0 picked on a 1-token prompt was
    still followed on a 1024-token one, a single point on a flat chart."""
    if st.session_state.get(ROW_N_KEY) != n or not 0 <= st.session_state.get(ROW_KEY, -1) < n:
        st.session_state[ROW_KEY] = n - 1
    st.session_state[ROW_N_KEY] = n


def _row_control(n: int, container) -> int:  # noqa: ANN001 (a Streamlit column)
    help_text = "Its running max and sum are traced tile by tile; a new prompt length follows its last row"
    if n == 1:  # a slider needs two ends: show the only row, disabled, so the control keeps its place
        container.number_input("Query row to follow", 0, 0, 0, disabled=True, key="flash-row-only",
                               help=help_text)
        return 0
    _follow_last_row_on_new_length(n)
    return int(container.slider("Query row to follow", 0, n - 1, key=ROW_KEY, help=help_text))


def settings_section() -> FlashSettings:
    cfg = shared_weights().config
    with st.form("flash-prompt-form", border=False):
        # [5, 1] cut "Use this prompt" at 1280 px, [4, 1] at 1024 px with the sidebar open, and [3, 1] in
        # presentation mode at 1024 px (its 24-pixel label).
        c = st.columns([2.5, 1], vertical_alignment="bottom")
        prompt = c[0].text_area("Prompt (its real Q, K, V are taken from the model)", DEFAULT_PROMPT, height=100,
                                key="flash-prompt")
        chat = c[1].checkbox("chat template", True, key="flash-chat")
        c[1].form_submit_button("Use this prompt", icon=":material/play_arrow:", type="primary")
    ids = _prompt_ids(str(prompt), bool(chat))
    n = len(ids)
    # At 1024 pixels with the sidebar open the heatmap's "probabilities" broke into "probabilitie / s": its column
    # takes width from the tile sizes (two-digit numbers) and the row slider (its label still on one line).
    c = st.columns([1.1, 0.9, 0.9, 0.9, 2, 1.5])
    layer = c[0].slider("Layer", 0, cfg.num_layers - 1, 3, key="flash-layer")
    head = c[1].selectbox("Query head", list(range(cfg.num_heads)), index=min(3, cfg.num_heads - 1), key="flash-head",
                          help=f"{cfg.num_heads} query heads share {cfg.num_kv_heads} KV heads "
                               f"(head h reads KV head h // {cfg.num_heads // cfg.num_kv_heads})")
    block_m = c[2].selectbox("Q tile (BLOCK_M)", TILE_SIZES, index=1, key="flash-bm")
    block_n = c[3].selectbox("K tile (BLOCK_N)", TILE_SIZES, index=1, key="flash-bn")
    row = _row_control(n, c[4])
    show = c[5].radio("Heatmap", ["probabilities", "scores"], key="flash-show")
    st.caption(f"{plural(n, 'token')} → N = {n:,} query {'row' if n == 1 else 'rows'} and {plural(n, 'key')} "
               f"per head. The real H200 kernel uses {kernel_tiles_text()} (bench/kernels.py); small tiles here "
               "make the grid readable.")
    return FlashSettings(tuple(ids), int(layer), int(head), int(block_m), int(block_n), row, str(show))


def _cached(key: tuple, build):  # noqa: ANN001, ANN202
    return cached_by_kind(PAGE, key, build)


def get_qkv(s: FlashSettings) -> LayerQKV:
    def build() -> LayerQKV:
        weights = shared_weights()
        dt = getattr(torch, dtype_name())
        return layer_qkv(weights, list(s.token_ids), s.layer, device(), dt)

    return _cached(("qkv", s.token_ids, s.layer), build)


def get_trace(s: FlashSettings, qkv: LayerQKV) -> FlashTrace:
    return _cached(("trace", s.token_ids, s.layer, s.block_m, s.block_n, s.row, s.head),
                   lambda: flash_attention_tiled(qkv.q.float(), qkv.k.float(), qkv.v.float(), qkv.scale,
                                                 s.block_m, s.block_n, trace_row=s.row, trace_head=s.head))


def head_matrices(qkv: LayerQKV, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and causal softmax probabilities [N, N] of one head (CPU, fp32)."""
    group = qkv.q.shape[1] // qkv.k.shape[1]
    q = qkv.q[:, head].float().cpu()
    k = qkv.k[:, head // group].float().cpu()
    s = (q @ k.T) * qkv.scale
    n = s.shape[0]
    p = torch.softmax(s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
    return s, p


def tiles_section(s: FlashSettings, trace: FlashTrace, scores: torch.Tensor) -> None:
    st.subheader("The tile schedule, and one row's online softmax")
    m = st.columns(5)
    shares = tile_shares(trace)
    m[0].metric("Tile pairs", f"{shares.pairs}", help=f"{trace.num_q_tiles} Q tiles × {trace.num_k_tiles} K tiles")
    # Short labels: one that wraps at 1280 px drops its value below the row's others.
    m[1].metric("Full (no mask)", trace.count("full"), help="tiles computed without a causal mask")
    m[2].metric("Diagonal (masked)", trace.count("diagonal"))
    # A share, not a change: without delta_arrow="off" st.metric drew an ↑ in front of it. Its unit is said
    # ("of tile pairs") because the next metric is a share of scores: side by side, 25 % and 85 % read as 110 %.
    m[3].metric("Skipped by causality", shares.skipped_pairs,
                delta=f"{shares.skipped_pair_share:.0%} of tile pairs, never loaded", delta_color="off",
                delta_arrow="off",
                help=f"A share of tile pairs, not of scores: the skipped tiles hold {shares.skipped_scores:,} of the "
                     f"{shares.scores:,} scores ({shares.skipped_score_share:.0%} of N²); tiles on the grid's last "
                     "row and column are cut short by N, so a tile's share and its scores' share differ")
    m[4].metric("Scores computed", f"{shares.computed_score_share:.0%} of N²",
                delta=f"{shares.computed_scores:,} of {shares.scores:,} scores", delta_color="off", delta_arrow="off",
                help="A share of score entries, not of tile pairs; the exact causal half is "
                     f"{trace.seq_len * (trace.seq_len + 1) // 2:,}: the diagonal tiles compute a few masked extras. "
                     f"The other {shares.skipped_scores:,} lie in the skipped tiles")
    row_scores = scores[s.row, : s.row + 1]
    exact_m = float(row_scores.max())
    exact_l = float(torch.exp(row_scores - exact_m).sum())
    left, right = st.columns([1, 1.25])
    with left:
        show_figure(tile_grid(trace), key="flash-grid", height=480)
    with right:
        show_figure(online_softmax_chart(trace, exact_m, exact_l), key="flash-online", height=480)
    st.caption(row_caption(s, trace, exact_m, exact_l))


def _tile_span(tiles: list[int]) -> str:
    return f"tile {tiles[0]}" if len(tiles) == 1 else f"tiles {tiles[0]}–{tiles[-1]}"


def row_caption(s: FlashSettings, trace: FlashTrace, exact_m: float, exact_l: float) -> str:
    """What the online-softmax chart shows for the followed row, including the cases where it has little to
    show (one K tile, or only one with keys this row can see) and what its grey band is."""
    steps = trace.row_steps
    last = steps[-1]
    seen = [r.k_tile for r in steps if r.visible_keys]
    rescales = sum(1 for r in steps[1:] if r.rescale < 1)
    text = (f"Row {s.row} visits {plural(len(steps), 'K tile')}; its max grew (forcing a rescale) "
            f"{plural(rescales, 'time')}. After the last tile: m = {last.m:.4f}, l = {last.l:.4f}; computed from "
            f"the whole row at once: max = {exact_m:.4f}, Σ exp(s − max) = {exact_l:.4f}.")
    future = future_tiles(trace)
    if future:
        text += (f" Grey: K {_tile_span(future)} lie wholly in row {s.row}'s future; its Q tile still loads them "
                 "for its later rows, but they add nothing to this row's m or l.")
    if len(seen) == 1:
        text += (f" Row {s.row} sees keys in a single K tile, so its max is set once and never rescaled: pick a "
                 "later row, a smaller K tile or a longer prompt to watch the max grow.")
    return text


def memory_frame(n: int, heads: int) -> pd.DataFrame:
    rows = []
    for mem in memory_table(n, heads):
        # Short headers: the table shares half the page with the heatmap, and long ones pushed the last
        # column out of view.
        rows.append({"N": f"{mem.seq_len:,}" + (" (prompt)" if mem.seq_len == n else ""),
                     "naive S + P": fmt_bytes(mem.naive_bytes),
                     "FA2 m, l": fmt_bytes(mem.flash_state_bytes),
                     "naive, 1 head": fmt_bytes(mem.naive_bytes / heads)})
    return pd.DataFrame(rows)


def matrix_caption(s: FlashSettings, probs: torch.Tensor) -> str:
    """The followed row's strongest key, an attention sink only where the data has one, and how to read the
    colours of the mode shown ("bright first columns" described probabilities even in scores mode)."""
    tok = shared_weights().tokenizer
    strongest = int(probs[s.row, : s.row + 1].argmax())
    p = float(probs[s.row, strongest])
    text = (f"Row {s.row} (token “{tok.decode_token(s.token_ids[s.row])}”) puts most weight on key {strongest} "
            f"(“{tok.decode_token(s.token_ids[strongest])}”, p = {p:.2f})." if p >= 0.01 else
            f"Row {s.row} (token “{tok.decode_token(s.token_ids[s.row])}”) spreads its weight thinly: its largest "
            f"probability, on key {strongest} (“{tok.decode_token(s.token_ids[strongest])}”), is {p:.1e}.")
    sink = float(probs[1:, 0].mean()) if probs.shape[0] > 1 else 0.0  # row 0 has only key 0 to look at
    if s.show == "probabilities":
        if sink >= SINK_SHARE:
            text += f" Key 0 takes {sink:.0%} of an average row's weight: an attention sink, the bright first column."
        text += " Colour is log₁₀ P: yellow holds the weight, dark purple almost none (below 10⁻⁴ shows as −4)."
    else:
        if sink >= SINK_SHARE:
            text += f" Key 0 takes {sink:.0%} of an average row's weight (an attention sink)."
        text += (" Colour is the raw score S: red above 0, blue below. The softmax weighs each score only against "
                 "its row's max, so switch to probabilities to see where the weight goes.")
    return text


def matrix_section(s: FlashSettings, qkv: LayerQKV, trace: FlashTrace, scores: torch.Tensor,
                   probs: torch.Tensor) -> None:
    st.subheader("The N × N matrix FlashAttention never writes")
    heads = shared_weights().config.num_heads
    n = qkv.seq_len
    left, right = st.columns([1.25, 1])
    with left:
        show_figure(score_matrix(probs, scores, trace, s.show), key="flash-matrix", height=560)
    with right:
        here = AttentionMemory(n, heads)  # the same record as the table's "(prompt)" row
        c = st.columns(2)
        c[0].metric(f"Naive: S and P for this layer ({MATRIX_DTYPE})", fmt_bytes(here.naive_bytes),
                    help=f"2 matrices (S, then P) × {heads} heads × {n}² × {here.elem} bytes")
        c[1].metric(f"FA2: m and l for this layer ({STATE_DTYPE})", fmt_bytes(here.flash_state_bytes),
                    help=f"{heads} heads × {n} rows × 2 numbers × {here.state_elem} bytes")
        st.metric("Ratio", _times(here.ratio),
                  help="(2 × N² numbers) / (2 × N numbers) = N: grows linearly with the sequence")
        st.dataframe(memory_frame(n, heads), hide_index=True, width="stretch")
        st.caption(f"Per layer ({heads} heads). S and P in {MATRIX_DTYPE}, the dtype the naive row below "
                   f"materialises them in (bf16 would halve them); m and l in {STATE_DTYPE}, as FA2 keeps them "
                   "whatever the input dtype. Naive attention writes S to HBM, reads it back for the softmax, "
                   "writes P, and reads P for the PV matmul: Θ(N²) traffic per head. FA2 computes each S tile in "
                   "SRAM and throws it away; its HBM traffic is Q, K, V and O (Θ(N·d)).")
        st.caption(matrix_caption(s, probs))


def cache_sentence(n: int, heads: int) -> str:
    """How this prompt's naive S and P compare with the CPU's largest cache: a fixed "at a few hundred tokens
    the matrix fits in the caches" stood next to the tens of MiB the page itself showed at N = 1024."""
    mem = AttentionMemory(n, heads)
    size = f"Naive attention's S and P take {fmt_bytes(mem.naive_bytes)} for this layer at N = {n:,}"
    cache = largest_cpu_cache()
    if cache is None:
        return size + "."
    if mem.naive_bytes <= cache.bytes:
        return (f"{size}, within this CPU's {fmt_bytes(cache.bytes)} L{cache.level} cache, so materialising "
                "them costs little here.")
    return (f"{size}, more than this CPU's {fmt_bytes(cache.bytes)} L{cache.level} cache, so they stream through "
            "main memory.")


def compare_section(s: FlashSettings, qkv: LayerQKV) -> None:
    st.subheader("Same inputs, several implementations: time and error")
    key = ("compare", s.token_ids, s.layer, s.block_m, s.block_n)
    cache = page_cache(PAGE)
    again = st.button("Measure again", icon=":material/timer:", key="flash-measure",
                      help="Timings on a shared machine are noisy: each is the best of at least 3 runs, "
                           "repeated for 50 ms where a run is quicker. CPU rows run on one thread: with two, "
                           "a browser drawing on the same machine can stall every call for a whole time slice")
    if again:
        cache.pop("compare", None)
    with st.spinner("Timing naive attention, SDPA, the engine's path and the tiled re-enactment…"):
        results: list[MethodResult] = _cached(key, lambda: compare_methods(qkv, s.block_m, s.block_n))
    show_figure(method_chart(results), key="flash-methods", height=100 + 62 * len(results))
    # A static table, not a dataframe: its cells wrap, so the "what runs" sentences are read whole rather than
    # cut off at the right edge of a scrolling grid.
    # The short cells on one line (only "what runs" wraps): a static table wraps every column, and "5.5e-07"
    # broke after its minus sign, "CPU, 1 thread" after its comma.
    st.markdown("<style>.st-key-flash-methods-table td:not(:last-child) * { white-space: nowrap; }</style>",
                unsafe_allow_html=True)
    with st.container(key="flash-methods-table"):
        st.table(pd.DataFrame([{"method": r.method, "device": r.device, "dtype": r.dtype,
                                "ms": f"{r.ms:.3g}" if r.ms == r.ms else "–",
                                "rel. error": f"{r.rel_err:.1e}" if r.rel_err == r.rel_err else "–",
                                "writes N×N": "yes" if r.materialises_scores else "no",
                                "what runs": r.error or r.what} for r in results]).set_index("method"))
    gpu = torch.device(device()).type == "cuda"
    heads = int(qkv.q.shape[1])
    long_n = AttentionMemory(32768, heads)
    st.caption(
        f"All heads of layer {s.layer}, N = {qkv.seq_len:,}; the reference is naive attention in float64. "
        "The tiled row is an **instrumented Python re-enactment** of FA2 for teaching: one Python loop iteration "
        "per tile pair, so it is slow; it shows the algorithm, not its speed. "
        + ("The **Triton kernel** rows are the real FA2 kernel the engine runs on this GPU." if gpu else
           "The real FA2 kernel is the Triton kernel the engine runs on CUDA (`kernels/prefill_attention_triton.py`); "
           "this server has no GPU, so the engine runs the torch reference path, which is what the "
           f"“engine attention path” row times. {cache_sentence(qkv.seq_len, heads)} FlashAttention's win is the "
           f"HBM traffic it saves on a GPU at long N (the table above: {fmt_bytes(long_n.naive_bytes)} of S and "
           "P per layer at 32k tokens)."))
