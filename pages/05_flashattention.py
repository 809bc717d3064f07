"""FlashAttention-2 (seed chapter 05): tiles, the online softmax and the matrix that is never written,
on the real Q, K and V of one layer of the model; then decoding with split-KV (Flash-Decoding)."""
import streamlit as st

from app.sections.flash_decoding import decoding_section
from app.sections.flashattention import (head_matrices, compare_section, flash_explanation, flash_header, get_qkv,
                                         get_trace, matrix_section, settings_section, tiles_section)

st.title("FlashAttention-2")
st.markdown("Exact causal attention without the N × N score matrix: queries stay in fast on-chip memory, keys "
            "and values stream past them tile by tile, and an online softmax keeps just a running max and a "
            "running sum per row. Below, the algorithm replayed tile by tile on the real queries, keys and values "
            "of one layer of the model for your prompt, and at the end how a decode step splits its keys over "
            "several programs (Flash-Decoding).")
flash_header()
flash_explanation()
settings = settings_section()  # always a prompt: an empty box keeps the last one, so the page stays whole
qkv = get_qkv(settings)
trace = get_trace(settings, qkv)
scores, probs = head_matrices(qkv, settings.head)
tiles_section(settings, trace, scores)
matrix_section(settings, qkv, trace, scores, probs)
compare_section(settings, qkv)
decoding_section(settings.token_ids, settings.layer, settings.head, settings.block_n, qkv)
