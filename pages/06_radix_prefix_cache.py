"""Radix prefix cache (seed chapter 06): the tree of cached prompt prefixes, hits, savings and evictions."""
from app.scenario_library import RADIX_PREFIX_CACHE
from app.sections.radix import (compare_section, follow_up_section, history_section, radix_explanation,
                                tree_section)
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "radix"
session = get_session(PAGE, RADIX_PREFIX_CACHE[0])
page_header("Prefix caching and RadixAttention", "Finished and running requests leave their KV blocks in a radix "
            "tree keyed by tokens; a new request whose prompt starts the same way shares those blocks and "
            "prefills only the rest.", session)
radix_explanation()
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, RADIX_PREFIX_CACHE)
follow_up_section(session, session.records[-1] if session.records else None)
if record is not None:
    tree_section(session, record)
    history_section(session, record, history_until(session, record))
kernel_timing_panel(record, PAGE)
compare_section(session, PAGE)
