"""Attention roofline (seed chapter 02): prefill vs decode against this machine's measured ceilings."""
from app.runtime import device
from app.sections.parallel_decoding import parallel_decoding_section
from app.sections.roofline import (ROOFLINE_SCENARIOS, calculator_section, ceilings_section, kernel_paths_section,
                                   latency_section, roofline_explanation, roofline_section, warm_up_gpu_kernels)
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "roofline"
session = get_session(PAGE, ROOFLINE_SCENARIOS[0])
page_header("Attention roofline", "Every kernel either waits for arithmetic or for memory. Prefill does tens to "
            "hundreds of FLOPs per byte and runs into the compute roof; decode does a few and runs along the "
            "bandwidth slope. "
            "Here are the live model's kernels, step by step, against this machine's measured ceilings.", session)
roofline_explanation(session.engine.model_config, session.kv_bytes_per_element)
ceilings = ceilings_section(device())
warm_up_gpu_kernels()  # on a GPU: compile the Triton kernels before the first step is timed
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, ROOFLINE_SCENARIOS)
if record is not None:
    history = history_until(session, record)
    roofline_section(session, record, ceilings)
    latency_section(session, record, history)
kernel_timing_panel(record, PAGE)
kernel_paths_section(session)
choice = calculator_section(session.engine.model_config, ceilings, session.kv_bytes_per_element)
parallel_decoding_section(session, choice, PAGE)
