"""Constrained decoding (Inference 101: grammars and JSON schemas): the mask before every sampled token,
what it overrides, jump-forward, and free vs masked output measured on the same prompt."""
from app.sections.constrained import (compare_section, constrained_explanation, current_settings, engine_factory,
                                      settings_form, step_section)
from app.analysis.constrained import library
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "cd"
settings = current_settings(PAGE)
session = get_session(PAGE, settings.scenario(), engine_factory=engine_factory(settings))
page_header("Constrained decoding", "Make a model's output follow a JSON schema, a regular expression or a list "
            "of choices: before every token, mask what the grammar forbids, then sample. Every token below comes "
            "from the live engine, with the mask it was sampled under.", session)
constrained_explanation()
show_errors(session, PAGE)
settings_form(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, library(settings))
if record is not None:
    step_section(session, record, history_until(session, record), PAGE)
kernel_timing_panel(record, PAGE)
compare_section(session, PAGE)
