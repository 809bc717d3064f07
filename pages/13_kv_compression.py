"""KV cache quantization and eviction (Inference 101: FP8, INT4, H2O and attention sinks): the same prompt
decoded with the cache stored in fewer bits or cut to a budget, measured against the full cache."""
import streamlit as st

from app.sections.kv_compression import (backend_line, eviction_section, get_result, kv_explanation, memory_section,
                                         positions_section, quantization_section, settings_form, summary_section,
                                         texts_section)
from app.sections.kv_quant_kernel import fused_kernel_section

PAGE = "kvq"
st.title("KV cache quantization and eviction")
st.markdown("The KV cache grows by every token of every sequence, so serving runs out of cache memory long before "
            "it runs out of compute. Two ways to shrink it: store each number in fewer bits (FP8, INT4, INT2), or "
            "keep fewer tokens (a window, attention sinks, heavy hitters). Below, the live model decodes one prompt "
            "with each cache side by side, and every variant is measured against the full cache.")
backend_line()
kv_explanation()
settings = settings_form(PAGE)
result = get_result(PAGE, settings)
summary_section(settings, result, PAGE)
texts_section(result)
positions_section(result, PAGE)
quantization_section(result, PAGE)
eviction_section(result, PAGE)
memory_section(PAGE)
fused_kernel_section(PAGE)
