"""PagedAttention (seed chapter 03): the block pool, block tables, copy-on-write and measured waste."""
from app.scenario_library import PAGED_ATTENTION
from app.sections.paged_attention import (paged_explanation, pool_section, requests_section, tables_section,
                                          waste_section)
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "paged"
session = get_session(PAGE, PAGED_ATTENTION[0])
page_header("PagedAttention", "The KV cache lives in fixed-size physical blocks handed out from a free list; each "
            "sequence's block table maps its logical blocks to them, so memory is reserved one block at a time "
            "and can be shared.", session)
paged_explanation()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, PAGED_ATTENTION)
if record is not None:
    history = history_until(session, record)
    pool_section(session, record, history)
    tables_section(session, record)
    waste_section(history)
    requests_section(record)
kernel_timing_panel(record, PAGE)
