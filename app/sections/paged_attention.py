"""Sections of the PagedAttention page (pages/03_paged_attention.py composes them)."""
from __future__ import annotations

import streamlit as st

from engine.trace import StepRecord

from app.analysis.trace_metrics import cow_events, fullest_before
from app.charts.block_pool import block_pool_grid, waste_over_time
from app.charts.block_tables import block_table_grid, mapping_graph, mapping_graph_height
from app.session import EngineSession
from app.theme import show_figure
from app.widgets.explain import explanation
from app.widgets.request_table import request_state_table


def paged_explanation() -> None:
    explanation(
        "How a paged KV cache finds a token",
        [r"\text{physical slot}(p) = {\text{block\_table}\big[\lfloor p / B \rfloor\big] \times B} + {(p \bmod B)}",
         r"\text{waste}_{\text{paged}} \le B - 1 \ \text{slots per sequence}",
         r"\text{waste}_{\text{contiguous}} = {\text{max\_model\_len} - \text{length}}"],
        ["Each tile of the pool is one physical block of B token slots: the solid part is filled, the pale part is "
         "reserved but empty. Only a sequence's last block can be partly empty.",
         "A sequence's blocks are scattered over the pool; its block table (below) is the only thing that keeps "
         "them in order. The attention kernel reads K and V through that table.",
         "With n = 2, both samples point at the same prompt blocks (yellow, ref count ×2). The first time a sample "
         "writes into the shared, partly filled last block, the engine copies it: copy-on-write.",
         "Finished requests hand their blocks back to the free list; new requests reuse them right away.",
         "The waste chart compares the pool with reserving max_model_len slots per request up front.",
         "Inside a block, the engine stores K and V token by token on the CPU ([B, KV heads, head dim]) and head "
         "by head on a GPU ([KV heads, B, head dim]), so that one head's B keys sit side by side in memory and "
         "the Triton kernel streams long contexts 2–3.5 % faster. The block table and the slot formula are the "
         "same either way."],
    )


def cow_callout(records: list[StepRecord], record: StepRecord) -> set[int]:
    """Tell the copy-on-write story at the selected step; returns the blocks to highlight."""
    events = [e for e in cow_events(records) if e.step <= record.step]
    now = [e for e in events if e.step == record.step]
    shared = [b for b, r in enumerate(record.pool.ref_counts) if r > 1]
    for e in now:
        st.warning(f"**Copy-on-write at step {e.step}:** {e.request_id} was about to write into block "
                   f"{e.shared_block}, which it shared with another sample, so the engine copied it to block "
                   f"{e.new_block} (logical block {e.logical_block}) and writes there.", icon=":material/content_copy:")
    if not now and events:
        first = events[0]
        st.caption(":material/content_copy: Copy-on-write so far: "
                   + "; ".join(f"step {e.step}: {e.request_id} block {e.shared_block} → {e.new_block}" for e in events)
                   + f". Scrub to step {first.step} to see the moment of the copy.")
    if not now and not events and shared:
        st.info(f"Blocks {shared} are shared (ref count > 1). The next write into a shared partly filled block "
                "will copy it.", icon=":material/link:")
    return {b for e in now for b in (e.shared_block, e.new_block)} | set(shared if not now else [])


def pool_section(session: EngineSession, record: StepRecord, history: list[StepRecord]) -> None:
    pool = record.pool
    c = st.columns(5)
    c[0].metric("Blocks used", f"{pool.used_blocks} / {pool.num_blocks}")
    c[1].metric("Free list", pool.free_blocks)
    c[2].metric("Shared blocks (ref > 1)", sum(1 for r in pool.ref_counts if r > 1))
    # With nothing allocated (every request finished) waste is undefined, not 0 %.
    c[3].metric("Paged waste", f"{100 * pool.paged_waste_fraction:.1f}%" if pool.allocated_tokens else "–",
                help=f"{pool.internal_waste_tokens} empty slots in {pool.allocated_tokens} allocated")
    c[4].metric("Contiguous waste",
                f"{100 * pool.contiguous_waste_fraction:.1f}%" if pool.contiguous_reserved_tokens else "–",
                help=f"{pool.contiguous_waste_tokens} of {pool.contiguous_reserved_tokens} slots if each live "
                     "sequence reserved max_model_len")
    if fullest := fullest_before(record, history):
        st.info(f"Every request has finished and returned its blocks to the free list. The pool was fullest at "
                f"step {fullest.step} ({fullest.pool.used_blocks} of {pool.num_blocks} blocks): drag the timeline "
                "there to see the blocks and tables in use.", icon=":material/history:")
    highlight = cow_callout(history, record)
    show_figure(block_pool_grid(record, session.request_order, highlight), key="paged-pool", height=470)
    free = [b for b, r in enumerate(pool.ref_counts) if r == 0]
    st.markdown(f"**Free list** ({len(free)} blocks): " + (" ".join(f"`{b}`" for b in free) if free else "empty"))


def tables_section(session: EngineSession, record: StepRecord) -> None:
    st.subheader("Block tables: logical → physical")
    left, right = st.columns([1.4, 1])
    with left:
        h = mapping_graph_height(record, max(120 + 52 * max(len(record.block_tables), 1), 260))
        show_figure(block_table_grid(record, session.request_order), key="paged-tables", height=h, export_width=800)
    with right:
        show_figure(mapping_graph(record, session.request_order, h), key="paged-graph", height=h, export_width=600)


def waste_section(history: list[StepRecord]) -> None:
    st.subheader("Paged vs contiguous reservation, measured on this run")
    show_figure(waste_over_time(history), key="paged-waste", height=360)
    st.caption("Contiguous = what a pre-paging server would hold: max_model_len slots per live sequence. Paged = "
               "the empty slots in allocated blocks. The pool summary in every StepRecord measures both.")


def requests_section(record: StepRecord) -> None:
    with st.expander("Requests at this step", expanded=False):
        request_state_table(record)
