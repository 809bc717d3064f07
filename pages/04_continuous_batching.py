"""Continuous batching (seed chapter 04): the batch rebuilt every iteration, and static vs continuous."""
from app.scenario_library import CONTINUOUS_BATCHING
from app.sections.continuous_batching import batching_explanation, comparison_section, step_section
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "cb"
session = get_session(PAGE, CONTINUOUS_BATCHING[0])
page_header("Continuous batching", "The scheduler rebuilds the batch at every forward pass: finished requests "
            "leave and waiting ones join immediately, so decode steps stay full.", session)
batching_explanation()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, CONTINUOUS_BATCHING)
if record is not None:
    step_section(session, record, history_until(session, record))
kernel_timing_panel(record, PAGE)
comparison_section(session, PAGE)
