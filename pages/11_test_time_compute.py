"""Inference-time compute scaling (seed chapter 11): best-of-N with three selection rules, and s1 budget forcing."""
from engine.test_time import load_tasks

from app.sections.test_time import (accuracy_section, current_settings, engine_factory, settings_form,
                                    step_section, test_time_explanation)
from app.analysis.test_time import library
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "ttc"
settings = current_settings(PAGE)
session = get_session(PAGE, settings.scenario(), engine_factory=engine_factory(settings))
page_header("Inference-time compute scaling", "Spend more tokens at inference to get more answers right: sample "
            "N answers in parallel and pick one (best-of-N, majority vote), or force the model to think longer "
            "(budget forcing). Every sample below comes from the live engine.", session)
test_time_explanation()
show_errors(session, PAGE)
settings_form(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, library(settings, load_tasks()))
if record is not None:
    step_section(session, record, history_until(session, record), PAGE)
kernel_timing_panel(record, PAGE)
accuracy_section(session, PAGE)
