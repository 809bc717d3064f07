"""Chunked prefill (seed chapter 09, SARATHI): prompt chunks share each iteration's token budget with decodes."""
from app.scenario_library import CHUNKED_PREFILL
from app.sections.chunked import chunked_explanation, compare_section, step_section
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "chunked"
session = get_session(PAGE, CHUNKED_PREFILL[0])
page_header("Chunked prefill", "A long prompt is split into chunks that share each iteration's token budget with "
            "the running decodes, so no iteration is much longer than the others and nobody's text freezes.",
            session)
chunked_explanation()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, CHUNKED_PREFILL)
if record is not None:
    step_section(session, record, history_until(session, record))
kernel_timing_panel(record, PAGE)
compare_section(session, PAGE)
