"""Medusa and EAGLE (seed chapter 08): heads on the target's own hidden states draft a tree; one pass
with a tree attention mask verifies every branch."""
from app.scenario_library import TREE_SPEC
from app.sections.tree_spec import (bench_section, compare_section, cost_section, training_section, tree_controls,
                                    tree_explanation, tree_step_section)
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "tree"
session = get_session(PAGE, TREE_SPEC[0])
page_header("Medusa and EAGLE", "Small heads on the model's own hidden states guess a whole tree of "
            "continuations; one forward pass with a tree attention mask checks every branch, and the longest "
            "branch the model agrees with is kept.", session)
tree_explanation()
show_errors(session, PAGE)
tree_controls(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, TREE_SPEC)
history = history_until(session, record)
if record is not None:
    tree_step_section(session, record, history, PAGE)
training_section()
cost_section(session, PAGE)
bench_section()
kernel_timing_panel(record, PAGE)
compare_section(session, PAGE)
