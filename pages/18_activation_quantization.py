"""FP8 and FP4 inference, SmoothQuant and activation quantization (Inference 101): the live model's weights and
linear inputs rounded to INT8, FP8 E4M3 and FP4 with block scales, with and without SmoothQuant, simulated in fp32
and measured against the full model."""
import streamlit as st

from app.sections.act_quant import (aq_explanation, backend_line, download_section, get_result, outliers_section,
                                    quality_section, settings_form, sweep_section, texts_section, why_section)

PAGE = "aq"
st.title("FP8, FP4 and SmoothQuant: quantizing activations")
st.markdown("To run the matmuls themselves on FP8 or FP4 tensor cores, the activations must be quantized as well "
            "as the weights. Weights are tame; activations are not: a few channels of each layer's input are "
            "tens to thousands of times larger than the rest, and one scale has to cover them. Below, the live model's "
            "weights and activations are rounded to each format and measured against the full model.")
backend_line()
aq_explanation()
settings = settings_form(PAGE)
result = get_result(PAGE, settings)
if result is None:
    st.stop()
outliers_section(result, PAGE)
quality_section(result, PAGE)
sweep_section(result, PAGE)
texts_section(result)
why_section()
download_section(result, PAGE)
