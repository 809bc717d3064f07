"""Merge the LoRA or serve the adapter (Inference 101): one fine-tune of the live model merged into the weights
and served unmerged beside them, the same tokens either way; what each costs per decode step, measured, and in
memory for one fine-tune or a hundred; the update BA and its rank."""
import streamlit as st

from app.sections.lora_merge import (anatomy_section, answers_section, backend_line, deployment_section,
                                     download_section, get_result, learned_section, lora_explanation, settings_form,
                                     timing_section)

PAGE = "lm"
st.title("Merge the LoRA or serve the adapter?")
st.markdown("A LoRA fine-tune is a small update BA to the base weights. **Merged** into them, it becomes an "
            "ordinary checkpoint: no cost at inference, but one full copy of the weights per fine-tune. **Served "
            "unmerged**, the base stays shared and each request applies its own adapter: a little work on every "
            "step, and many fine-tunes in one deployment. Below, one adapter runs both ways on the live engine.")
backend_line()
lora_explanation()
settings = settings_form(PAGE)
result = get_result(PAGE, settings)
if result is None:
    st.stop()
answers_section(result)
learned_section(result)
timing_section(result, PAGE)
anatomy_section(result, PAGE)
deployment_section(result, PAGE)
download_section(result, PAGE)
