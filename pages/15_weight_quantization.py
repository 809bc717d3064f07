"""Weight-only quantization (Inference 101: GPTQ, AWQ and keeping your fine-tune): the live model's linears
rounded to 4 bits (or 8, 3, 2) three ways, calibrated on real text, measured against the full model."""
import streamlit as st

from app.sections.weight_quant import (backend_line, bits_section, download_section, get_result, layers_section,
                                       outliers_section, settings_form, summary_section, texts_section,
                                       wq_explanation)

PAGE = "wq"
st.title("Weight-only quantization: GPTQ and AWQ")
st.markdown("At batch 1 a decode step reads every weight once, so the bytes of the weights set the speed. Storing "
            "the linears in about 4 bits cuts their traffic nearly 4× (the whole checkpoint a little over 2× here: "
            "the embedding stays 16-bit), and how the 4-bit values are chosen decides how "
            "much of the model survives. Below, the live model's linears are rounded three ways and each "
            "checkpoint is measured against the full one.")
backend_line()
wq_explanation()
settings = settings_form(PAGE)
result = get_result(PAGE, settings)
if result is None:
    st.stop()
summary_section(result, PAGE)
bits_section(PAGE)
texts_section(result)
layers_section(result, PAGE)
outliers_section(result, PAGE)
download_section(result, PAGE)
