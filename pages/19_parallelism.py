"""Parallelism for serving (Inference 101): the live model split by matrix over tensor-parallel ranks (the same
tokens, a third of the weights and cache each, 62 collectives a step) and by layer over pipeline stages (a Gantt
of measured stage times), the H200 step with an assumed wire, and expert parallelism in arithmetic."""
import streamlit as st

from app.runtime import shared_weights
from app.sections.parallelism import (backend_line, degrees_section, download_section, expert_section, get_result,
                                      par_explanation, pipeline_section, settings_form, tp_answers_section,
                                      tp_layout_section, tp_pays_section, tp_timing_section, when_section,
                                      wire_section)

PAGE = "par"
st.title("Parallelism for serving: tensor, pipeline and expert")
st.markdown("A model too large for one GPU, or a token that must come faster, is split across GPUs: **by "
            "matrix** (tensor parallelism), **by layer** (pipeline parallelism) or **by expert** (expert "
            "parallelism). Each buys lower latency or more memory per GPU and pays in communication, on every decode "
            "step. Below, the live model is split both ways on this machine and every rank and stage is timed.")
backend_line()
par_explanation()
settings = settings_form(PAGE)
degrees_section(shared_weights().config)
result = get_result(PAGE, settings)
if result is None:
    st.stop()
tp_answers_section(result)
tp_layout_section(result, PAGE)
tp_timing_section(result, PAGE)
latency = wire_section(result, PAGE)
tp_pays_section(PAGE, latency)
hop = pipeline_section(result, PAGE)
expert_section(PAGE)
when_section()
download_section(result, PAGE, hop)
