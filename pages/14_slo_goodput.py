"""Tuning for latency SLOs (Inference 101: batch size, token budgets, TTFT, TPOT and goodput): the live engine
serves the same Poisson arrivals at several request rates under several configurations, and every request's
TTFT and TPOT is checked against targets the student sets."""
import streamlit as st

from app.sections.slo_goodput import (backend_line, curves_section, get_result, run_section, settings_form,
                                      slo_controls, slo_explanation, summary_section, table_section)

PAGE = "slo"
st.title("Tuning for latency SLOs: TTFT, TPOT and goodput")
st.markdown("A service promises latency, not throughput: the first token within T₁ seconds, then a token every "
            "T₂ milliseconds. Goodput is the highest request rate at which most requests still keep that promise. "
            "Below, the live engine serves the same requests at several rates under each configuration; set the "
            "targets and see which batch cap, token budget or output cap serves the most load within them.")
backend_line()
slo_explanation()
settings = settings_form(PAGE)
result = get_result(PAGE, settings)
if result is not None:
    slo = slo_controls(PAGE)
    summary_section(settings, result, slo, PAGE)
    curves_section(result, slo, PAGE)
    run_section(result, slo, PAGE)
    table_section(result, slo, PAGE)
