"""Speculative decoding (seed chapter 07): a drafter proposes γ tokens, the target verifies them in one pass; and
self-speculation with a quantized KV cache (QuantSpec), the model drafting for itself."""
from app.scenario_library import SPECULATIVE
from app.sections.speculative import (bench_section, closed_form_section, compare_section, spec_controls,
                                      speculative_explanation, step_section)
from app.sections.quantspec import quantspec_section
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "spec"
session = get_session(PAGE, SPECULATIVE[0])
page_header("Speculative decoding with draft models", "A cheap drafter guesses the next γ tokens; the model "
            "checks all of them in one forward pass and keeps the longest prefix it agrees with, plus one token of "
            "its own. Same output distribution, fewer passes of the big model.", session)
speculative_explanation()
show_errors(session, PAGE)
spec_controls(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, SPECULATIVE)
history = history_until(session, record)
if record is not None:
    step_section(session, record, history, PAGE)
closed_form_section(session, history, PAGE)
bench_section()
kernel_timing_panel(record, PAGE)
compare_section(session, PAGE)
quantspec_section(PAGE)
