"""Disaggregated prefill/decode (seed chapter 10): a prefill worker and a decode worker, the KV handed between them."""
from engine.disaggregated import DisaggregatedEngine

from app.scenario_library import DISAGGREGATED
from app.sections.disaggregated import compare_section, disaggregated_explanation, step_section
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "disagg"
session = get_session(PAGE, DISAGGREGATED[0], engine_factory=DisaggregatedEngine)
page_header("Disaggregated prefill/decode", "Prompts and decoding run on separate workers, each with its own KV "
            "pool: the prefill worker computes a prompt, its KV blocks are handed to the decode worker, and the "
            "decode worker's iterations never wait behind a long prompt.", session)
disaggregated_explanation()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, DISAGGREGATED)
if record is not None:
    step_section(session, record, history_until(session, record))
compare_section(session, PAGE)
