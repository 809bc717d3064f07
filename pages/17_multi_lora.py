"""Multi-LoRA serving (Inference 101: S-LoRA, Punica and adapter batching): requests for different LoRA
fine-tunes in one batch on the live engine, the device's adapter slots, and mixed vs merged deployments."""
from app.analysis.multi_lora import lora_engine
from app.scenario_library import MULTI_LORA
from app.sections.multi_lora import (adapters_table, comparison_section, lora_explanation, missing_adapters_warning,
                                     step_section)
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "ml"
session = get_session(PAGE, MULTI_LORA[0], engine_factory=lora_engine)
page_header("Multi-LoRA serving", "One copy of the base model serves requests for many LoRA fine-tunes in the "
            "same batch: the base weights are read once per step, each adapter's small matrices only for its own "
            "rows.", session)
lora_explanation()
missing_adapters_warning()
adapters_table()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, MULTI_LORA)
if record is not None:
    step_section(session, record, history_until(session, record))
kernel_timing_panel(record, PAGE)
comparison_section(session, PAGE)
