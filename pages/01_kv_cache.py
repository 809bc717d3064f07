"""KV cache (seed chapter 01, and the KV cache topic): the byte formula, live growth, head sharing (MHA, GQA, MQA),
MLA's latent cache in arithmetic and retrofitted onto the live model, and cache vs recompute."""
from app.sections.kv_cache import formula_section, growth_section, timing_section, variants_section
from app.sections.kv_latent import mla_section
from app.scenario_library import KV_CACHE
from app.state import get_session
from app.widgets.controls import engine_controls
from app.widgets.header import page_header, show_errors
from app.widgets.kernel_panel import kernel_timing_panel
from app.widgets.request_editor import scenario_editor
from app.widgets.scrubber import history_until, timeline_scrubber

PAGE = "kv"
session = get_session(PAGE, KV_CACHE[0])
page_header("KV cache", "Each decode step adds one token of keys and values per layer to the cache, so the model "
            "never recomputes the past. Here is what that costs in bytes and saves in time, on the live model.",
            session)
formula_section(session.engine.model_config, session.kv_bytes_per_element)
show_errors(session, PAGE)
engine_controls(session, PAGE)
record = timeline_scrubber(session, PAGE)
scenario_editor(session, PAGE, KV_CACHE)
growth_section(session, record, history_until(session, record))
kernel_timing_panel(record, PAGE)
variants_section(session.engine.model_config)
mla_section(PAGE)
timing_section(PAGE)
