"""End-to-end: the real Streamlit server in headless Chromium (Playwright), one screenshot per page.

Starts `streamlit run app/main.py` on a free localhost port, opens every page, presses Step, waits on
data-testid selectors, and checks that charts rendered and no exception or error element appeared.
Screenshots go to test-artifacts/ (gitignored) for a human to look at.

Uses the real model unless INFERSCOPE_WEIGHTS is set. Run: pytest -m browser tests/test_browser.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import pytest

from tests.streamlit_server import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, streamlit_server

VIEWPORT = {"width": 1600, "height": 1000}
PROJECTOR = {"width": 1280, "height": 1000}  # a lecture-hall projector
SMALL_PROJECTOR = {"width": 1024, "height": 768}  # an older one
SCRIPT_TIMEOUT_MS = 240_000  # a step is 0.1-0.3 s on an idle 2-core CPU, much more when it is shared

pytestmark = [pytest.mark.browser, pytest.mark.slow]

playwright_sync = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not installed (apt install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with streamlit_server("streamlit-server.log", start_timeout_s=90) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser):  # noqa: ANN001
    ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    pg = ctx.new_page()
    pg.set_default_timeout(SCRIPT_TIMEOUT_MS)
    yield pg
    ctx.close()


# Resolves once every chart holds a drawn Plotly SVG and nothing in the main area has changed for `quiet` ms
# (Plotly draws, and re-lays out after a resize, a little after the delta arrives), or after `cap` ms.
_SETTLED_JS = """([quiet, cap]) => new Promise(resolve => {
    const main = document.querySelector('[data-testid="stMain"]') || document.body;
    // A chart whose code is still loading is a Suspense skeleton, not yet an stPlotlyChart: count it as undrawn.
    const drawn = () => !main.querySelector('[data-testid="stSkeleton"]')
        && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('.main-svg'));
    let timer = null;
    const done = () => { obs.disconnect(); clearTimeout(limit); resolve(true); };
    const arm = () => { clearTimeout(timer); timer = setTimeout(() => drawn() ? done() : arm(), quiet); };
    const obs = new MutationObserver(arm);
    obs.observe(main, {subtree: true, childList: true, attributes: true, characterData: true});
    const limit = setTimeout(done, cap);
    arm();
})"""


def settle_charts(pg, quiet_ms: int = 400, cap_ms: int = 20000) -> None:  # noqa: ANN001
    """Wait until Plotly has finished drawing: a quiet main area instead of a fixed sleep (a fixed second per
    rerun was a third of the browser tests' time). The cap only counts when charts are slow to draw: a CI run
    with the other worker on real-model tests found the weight page's five charts not drawn after 6 s. Streamlit
    loads the chart component lazily and shows a skeleton (stSkeleton) meanwhile, so a page whose charts were all
    still skeletons looked drawn (no stPlotlyChart at all): a CI run found the merge page with none of its charts."""
    pg.evaluate(_SETTLED_JS, [quiet_ms, cap_ms])


def wait_idle(pg, settle: bool = True) -> None:  # noqa: ANN001
    """Wait until the script run (callbacks included) triggered by the last action has finished:
    stApp carries the script state, the same signal Streamlit's own e2e tests wait on. `settle` then
    waits for Plotly to draw what the run sent; a step whose charts nobody measures skips it."""
    pg.wait_for_timeout(300)
    pg.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=SCRIPT_TIMEOUT_MS)
    if settle:
        settle_charts(pg)


def assert_clean(pg) -> None:  # noqa: ANN001
    assert pg.locator('[data-testid="stException"]').count() == 0, pg.locator('[data-testid="stException"]').first.inner_text()
    errors = pg.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 0, errors.first.inner_text()


def open_page(pg, server: str, path: str) -> None:  # noqa: ANN001
    pg.goto(f"{server}/{path}")
    pg.wait_for_selector('[data-testid="stMainBlockContainer"]')
    pg.wait_for_selector("h1")
    wait_idle(pg)


def click_button(pg, label: str) -> None:  # noqa: ANN001
    """Click, see the run it starts begin (on a busy box it can start later than wait_idle's 0.3 s, and the page
    read before it would be the previous run's: a CI run once checked "Run to end" against step 1's strip),
    then wait for it to end. A run so short that no frame showed it running has ended already."""
    pg.locator('[data-testid="stMainBlockContainer"] button', has_text=label).first.click()
    try:
        pg.wait_for_selector('[data-testid="stApp"][data-test-script-state="running"]', timeout=2000)
    except playwright_sync.TimeoutError:
        pass
    wait_idle(pg)


def choose(pg, label: str, option: str) -> None:  # noqa: ANN001
    """Pick the first option of the select box `label` that matches `option` as typed, and wait for the rerun."""
    box = pg.get_by_role("combobox", name=label)
    box.click()
    box.fill(option)
    pg.keyboard.press("Enter")
    wait_idle(pg)


def step(pg, expected_records: int, settle: bool = True) -> None:  # noqa: ANN001
    """Press Step and wait until the timeline reports the new record (deterministic, unlike timers)."""
    pg.locator('[data-testid="stMainBlockContainer"] button', has_text="Step").first.click()
    label = f"{expected_records} step{'s' if expected_records > 1 else ''} recorded"
    pg.get_by_text(label, exact=False).first.wait_for()
    wait_idle(pg, settle)


def scrub_to_first_step(pg) -> None:  # noqa: ANN001
    """Drag the timeline back to step 0: the page redraws that step from its record."""
    slider = pg.locator('input[type="range"][aria-label^="Timeline"]').first
    slider.focus()
    slider.press("Home")
    pg.wait_for_function(
        "() => document.querySelector('input[type=range][aria-label^=\"Timeline\"]').getAttribute('aria-valuetext') === 'step 0'")
    wait_idle(pg)


def assert_metrics_fit(pg) -> None:  # noqa: ANN001
    """No metric's value, label or delta is cut off ("…") or spills into its neighbour: each fits its column;
    and the values of a row of metrics line up."""
    overflowing = pg.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stMetricValue"] .stMarkdownEllipsis, [data-testid="stMetricLabel"] .stMarkdownEllipsis')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right >
                     e.closest('[data-testid="stColumn"], [data-testid="stVerticalBlock"]').getBoundingClientRect().right + 1)
        .map(e => e.innerText)""")
    assert not overflowing, f"metrics cut off or spilling over: {overflowing}"
    # A row of metrics (no deltas) whose labels wrap differently still lines its values up: each value's bottom
    # within 3 px of the row's others, where a label on two lines used to drop its value ~15 px below.
    ragged = pg.evaluate("""() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stHorizontalBlock"]')]
        .filter(r => r.querySelector('[data-testid="stMetric"]') && !r.querySelector('[data-testid="stMetricDelta"]')
                     && [...r.children].every(c => c.querySelector(':scope > [data-testid="stVerticalBlock"]')
                                                   ?.children.length === 1))
        .flatMap(r => { const v = [...r.querySelectorAll('[data-testid="stMetricValue"]')]
                            .map(e => e.getBoundingClientRect()).filter(b => b.height > 0);
                        const ys = v.map(b => b.bottom);
                        return ys.length > 1 && Math.max(...ys) - Math.min(...ys) > 3
                            ? [r.innerText.replace(/\\s+/g, ' ').slice(0, 80)] : []; })""")
    assert not ragged, f"metric values not lined up in their row: {ragged}"


# scrollWidth and clientWidth are whole pixels, so text 0.6 px wider than its box passed the check above while
# the browser drew it with an ellipsis. For a box that ellipsises, its text's laid-out width (a Range's, which
# the ellipsis does not shorten) is compared with the box's content width in fractional pixels.
ELLIPSISED_JS = """e => {
    const css = getComputedStyle(e);
    if (css.textOverflow !== 'ellipsis' || !e.firstChild) return false;
    const r = document.createRange(); r.selectNodeContents(e);
    const inner = e.getBoundingClientRect().width - parseFloat(css.paddingLeft) - parseFloat(css.paddingRight)
        - parseFloat(css.borderLeftWidth) - parseFloat(css.borderRightWidth);
    return r.getBoundingClientRect().width > inner + 0.05; }"""


def assert_buttons_fit(pg) -> None:  # noqa: ANN001
    """No button's or widget label's text is cut off ("Apply an…" in a sixth of a 1280-pixel row, "Use this
    prompt" beside the prompt box): each element that holds text is as wide as its text; and every chosen
    option of a multiselect is in sight."""
    cut = pg.evaluate("() => { const ellipsised = " + ELLIPSISED_JS + """;
        return [...document.querySelectorAll(
        '[data-testid="stMain"] button, [data-testid="stMain"] [data-testid="stWidgetLabel"] p')]
        .flatMap(b => [b, ...b.querySelectorAll('p, span, div')])
        .filter(e => e.clientWidth > 0 && (e.scrollWidth > e.clientWidth + 1 || ellipsised(e)))
        .map(e => e.innerText.trim()).filter(t => t); }""")
    assert not cut, f"button or label text cut off: {sorted(set(cut))}"
    # A multiselect does not wrap its chips: in a narrow column the weight page's third method was scrolled
    # out of sight, and the box looked as if only two were chosen.
    hidden = pg.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stMain"] [data-testid="stMultiSelectTagsContainer"]')]
        .filter(c => c.clientWidth > 0 && c.scrollWidth > c.clientWidth + 1).map(c => c.innerText.trim())""")
    assert not hidden, f"multiselect choices scrolled out of sight: {hidden}"


def assert_tables_fit(pg) -> None:  # noqa: ANN001
    """Every data table shows all its columns without scrolling sideways: at 1280 pixels the load test's
    table of runs hid its last two columns, the per-request table beside its scatter three, and the
    speculative benchmark, the weight-quantization results, the LoRA timings, QuantSpec's runs and the
    constrained modes one to eight each. Not the data editors in forms: the request editor is a spreadsheet
    of twelve fields whose headers carry an edit icon, and its sampling fields scroll into view beside the
    pinned name and prompt (squeezed to fit, every header was cut to two or three letters)."""
    wide = pg.evaluate("""() => [...document.querySelectorAll('[data-testid="stDataFrame"]')]
        .filter(df => !df.closest('[data-testid="stForm"]')).flatMap(df => {
        const s = df.querySelector('.dvn-scroller');
        return s && s.scrollWidth > s.clientWidth + 1
            ? [`${s.scrollWidth} px of columns in ${s.clientWidth} px: ` + [...df.querySelectorAll('th')]
                .map(h => h.innerText).join(' | ').slice(0, 100)] : []; })""")
    assert not wide, f"tables wider than their place: {wide}"


def assert_formulas_fit(pg) -> int:  # noqa: ANN001
    """Every formula of the explanation panel is drawn whole inside its column (no KaTeX error, nothing past
    the column's right edge); returns how many there are."""
    found = pg.evaluate("""() => [...document.querySelectorAll('[class*="st-key-explain-formulas"] [data-testid="stMarkdownContainer"]')]
        .map(c => [c.querySelector('.katex-html') ? c.querySelector('.katex-html').getBoundingClientRect().right
                   - c.getBoundingClientRect().right : 1e9, c.querySelectorAll('.katex-error').length, c.innerText])""")
    bad = [text for over, errors, text in found if over > 1 or errors]
    assert not bad, f"formulas cut off or not rendered: {bad}"
    return len(found)


def assert_chart_text_fits(pg) -> None:  # noqa: ANN001
    """No chart title, subtitle, axis title, annotation or legend entry runs past its chart's edges."""
    cut = pg.evaluate("""() => [...document.querySelectorAll('[data-testid=stPlotlyChart]')].flatMap(ch => {
        const svg = ch.querySelector('svg.main-svg'); if (!svg) return [];
        const box = svg.getBoundingClientRect();
        return [...ch.querySelectorAll('text.gtitle, text.gtitle-subtitle, text.xtitle, text.ytitle, '
                                       + 'g.annotation-text-g text, .legendtext')]
            .filter(t => { const r = t.getBoundingClientRect(); return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1); })
            .map(t => t.textContent); })""")
    assert not cut, f"chart text cut off at the chart's edge: {cut}"


def assert_chart_text_apart(pg, charts: str = "[data-testid=stPlotlyChart]") -> None:  # noqa: ANN001
    """No two of a chart's texts (title, axis titles, tick labels, annotations such as subplot titles and line
    labels, the legend, bar values, text drawn at points such as tree node labels) cover each other: at 1280
    pixels the roofline page's "TTFT" and "TPOT" subplot titles ran into one line, the speculative page's α
    labels into the next panel's y-axis title, sibling radix-tree labels into each other, the tree mask's 25
    column labels into one string, and the chunked page's shared y-axis title onto the strips' tick labels.
    Tick labels of two different axes may touch where the axes meet (the x and y "0" at the origin)."""
    clashes = pg.evaluate("""charts => [...document.querySelectorAll(charts)].flatMap(ch => {
        const items = [...ch.querySelectorAll('text.gtitle, text.gtitle-subtitle, [class^="x"][class$="title"], '
                                              + '[class^="y"][class$="title"], '
                                              + 'g.annotation-text-g, g.legend, text.bartext, .scatterlayer text, '
                                              + '[class$="tick"] > text')]
            .map(e => [e.textContent.trim(), e.getBoundingClientRect(),
                       /tick$/.test(e.parentNode.getAttribute('class') || '') ? e.parentNode.getAttribute('class') : ''])
            .filter(([t, r]) => t && r.width > 0);
        const out = [];
        items.forEach(([ta, a, axa], i) => items.slice(i + 1).forEach(([tb, b, axb]) => {
            if (axa && axb && axa !== axb) return;
            const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
            const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
            if (w > 2 && h > 2 && !ta.includes(tb) && !tb.includes(ta)) out.push(ta + ' | ' + tb);
        }));
        return out; })""", charts)
    assert not clashes, f"chart texts overlap: {sorted(set(clashes))}"


def assert_fits_small_projector(pg, name: str) -> None:  # noqa: ANN001
    """The page as it stands, on a 1024-pixel projector with the sidebar open: the main column was 564 pixels,
    where two charts side by side got ~280 each (their titles, legends and tree labels cut or run together) and
    tables of eight columns scrolled sideways, until its margins narrowed (690 pixels) and rows holding a chart
    or a table stacked below 780 pixels of page (app/presentation.py). Resized in place, no rerun: then back to
    the size it had."""
    before = pg.viewport_size
    pg.set_viewport_size(SMALL_PROJECTOR)
    settle_charts(pg)  # Plotly lays out again at the new width
    assert_chart_text_fits(pg)
    assert_chart_text_apart(pg)
    assert_metrics_fit(pg)
    assert_buttons_fit(pg)
    assert_tables_fit(pg)
    shoot(pg, f"{name}_1024")
    pg.set_viewport_size(before)
    settle_charts(pg)


def plotly_count(pg) -> int:  # noqa: ANN001
    """Charts that actually drew (a Plotly SVG inside the element)."""
    return pg.locator('[data-testid="stPlotlyChart"] .main-svg').count()


def shoot(pg, name: str) -> Path:  # noqa: ANN001
    """The whole page: Streamlit scrolls inside stMain, so grow the viewport to its height first."""
    before = pg.viewport_size
    pg.mouse.move(0, 0)  # no hover tooltip of the last button clicked in the picture
    height = pg.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    pg.set_viewport_size({"width": before["width"], "height": min(int(height), 9000)})
    settle_charts(pg)  # Plotly re-lays out on resize
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    pg.set_viewport_size(before)
    return path


def _plotly_page(pg, width: int, height: int) -> None:  # noqa: ANN001
    """A blank page with plotly.js and the app's font (Source Sans, which Streamlit serves), and an empty
    chart of the given size: `_draw` puts figures in it without a Streamlit server."""
    import base64
    import glob

    import plotly
    import streamlit

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    font = glob.glob(str(Path(streamlit.__file__).parent / "static" / "static" / "media" / "SourceSansVF-Upright*.woff2"))
    face = (f"@font-face {{ font-family: 'Source Sans'; src: url(data:font/woff2;base64,"
            f"{base64.b64encode(Path(font[0]).read_bytes()).decode()}) format('woff2'); }}") if font else ""
    ARTIFACTS.mkdir(exist_ok=True)  # a fresh clone has none until a Streamlit server starts, and this runs first
    html = ARTIFACTS / "plotly_page.html"
    html.write_text(f"<html><head><style>{face}</style><script src='{js.as_uri()}'></script></head>"
                    f"<body><div class='chart' id='chart' style='width:{width}px;height:{height}px'></div></body></html>")
    pg.goto(html.as_uri())
    pg.wait_for_function("() => typeof Plotly !== 'undefined'")
    pg.evaluate("() => document.fonts.ready")


def _draw(pg, fig) -> None:  # noqa: ANN001 - a page from _plotly_page, a plotly Figure
    pg.evaluate("f => Plotly.newPlot('chart', f.data, f.layout)", json.loads(fig.to_json()))
    pg.wait_for_timeout(50)


# The roofline chart on the narrowest page, a 1024-pixel projector with the sidebar open (its height is the page's).
ROOFLINE_CHART_PX = (692, 640)


def test_roofline_labels_stay_apart_for_any_measured_ceilings(browser, random_weights) -> None:  # noqa: ANN001
    """The roofline's labels are placed from the measured ceilings, which move with the machine and its load: one
    CI run measured π = 82.7 GFLOP/s, and the summed "linear layers" label ran into the compute roof's label at
    1280 pixels (its boxes were estimated for a 780-pixel plot; the plot was 509 there). The chart for a sweep of
    ceilings, with a prefill step and a decode step of the real shapes selected in turn, drawn at its size on the
    narrowest page (a 1024-pixel projector with the sidebar open): no two texts overlap."""
    from app.analysis.roofline_math import family_points, kernel_points, phase_points
    from app.charts.roofline import roofline_chart
    from app.theme import TEMPLATE
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from kernels.ceilings import Ceilings

    engine = LLMEngine(EngineConfig(num_blocks=32, max_model_len=256, weights="random"), random_weights)
    engine.add_request("Explain in two sentences why a KV cache makes decoding faster.", SamplingParams(max_tokens=5))
    records = [engine.step() for _ in range(5)]
    steps = [family_points(kernel_points(r)) for r in records]
    ctx = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    pg = ctx.new_page()
    _plotly_page(pg, *ROOFLINE_CHART_PX)
    try:
        for flops in (2e10, 8.27e10, 3e11, 3.75e11, 2e12):
            for bandwidth in (5e9, 2e10, 8e10):
                c = Ceilings(flops, bandwidth, "a sweep", "float32")
                for i, now in enumerate(steps):  # each step selected as the page shows it: the earlier ones faded
                    others = phase_points([p for s in steps[:i] for p in s])
                    fig = roofline_chart(c, now, others, "Step on the roofline")
                    fig.update_layout(template=TEMPLATE, width=ROOFLINE_CHART_PX[0], height=ROOFLINE_CHART_PX[1])
                    _draw(pg, fig)
                    assert_chart_text_apart(pg, ".chart")
    finally:
        ctx.close()


# The gap, in px, between a marker's centre and the rotated bandwidth label's text box (in the label's own frame,
# so the rotation is exact), and the marker's radius. The roof line and ridge point are the only other markers.
_SLOPE_GAP_JS = """() => {
    const label = [...document.querySelectorAll('.annotation-text')].find(e => e.textContent.startsWith('bandwidth'));
    const box = label.getBBox();
    const marker = [...document.querySelectorAll('.scatterlayer .points path')]
        .find(p => p.style.fill !== 'rgb(255, 255, 255)').getBoundingClientRect();
    const c = new DOMPoint(marker.x + marker.width / 2, marker.y + marker.height / 2)
        .matrixTransform(label.getScreenCTM().inverse());
    const gx = Math.max(box.x - c.x, 0, c.x - box.x - box.width), gy = Math.max(box.y - c.y, 0, c.y - box.y - box.height);
    return [Math.hypot(gx, gy), marker.width / 2];
}"""


def test_roofline_slope_label_clears_a_kernel_on_the_slope(browser) -> None:  # noqa: ANN001
    """A memory-bound kernel that reaches the bandwidth roof sits on the slope, under the label that names it: on
    the CPU the LM head's marker covered "bandwidth β = 35 GB/s". A kernel exactly on the roof at intensities all
    along the label, drawn in Chromium at the page's size: the marker stays clear of the rotated text."""
    from app.analysis.roofline_math import KernelPoint
    from app.charts.roofline import roofline_chart
    from app.theme import TEMPLATE
    from kernels.ceilings import Ceilings

    ctx = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    pg = ctx.new_page()
    _plotly_page(pg, *ROOFLINE_CHART_PX)
    try:
        for flops, bandwidth in ((3.42e11, 3.5e10), (9.9e14, 4.8e12)):  # this CPU's ceilings; an H200's
            c = Ceilings(flops, bandwidth, "a sweep", "float32")
            for intensity in (c.ridge / k for k in (25, 12, 8, 6, 4.5, 3.5, 2.5, 1.8)):
                nbytes = 1e8
                on_roof = KernelPoint(step=0, phase="decode", name="lm_head", family="lm_head", backend="torch",
                                      calls=1, seconds=nbytes / bandwidth, flops=intensity * nbytes, bytes=nbytes)
                fig = roofline_chart(c, [on_roof], [], "Step on the roofline")
                fig.update_layout(template=TEMPLATE, width=ROOFLINE_CHART_PX[0], height=ROOFLINE_CHART_PX[1])
                _draw(pg, fig)
                gap, radius = pg.evaluate(_SLOPE_GAP_JS)
                assert gap >= radius, (flops, bandwidth, intensity, gap, radius)
    finally:
        ctx.close()


def test_roofline_label_boxes_are_where_plotly_draws_them(browser) -> None:  # noqa: ANN001
    """The roofline places its labels from estimated boxes. Plotly sets a marker's text off by the marker's radius
    (plotly.js Drawing.textPointPosition); an estimate that put every label 9 px sideways and 3 px up or down let
    the summed "linear layers" run into "lm_head" at 1280 pixels on a CI run. Each textposition beside both marker
    sizes the chart uses, drawn in Chromium: the estimated box is within 3 px of the drawn text at its top, bottom
    and the edge beside the marker, and reaches at least as far as the text on the other side."""
    import plotly.graph_objects as go

    from app.charts.roofline import CURRENT_MARKER, EARLIER_MARKER, _label_box

    ctx = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    pg = ctx.new_page()
    _plotly_page(pg, 820, 560)
    plot_w, plot_h = 620, 460  # 820 x 560 less the margins below
    dx, dy = 2 / plot_w, 2 / plot_h  # decades per pixel: both axes span 1 to 100
    try:
        for marker_px, font_px in (CURRENT_MARKER, EARLIER_MARKER):
            for pos in ("top left", "middle left", "bottom left", "top right", "middle right", "bottom right"):
                fig = go.Figure(go.Scatter(x=[10], y=[10], mode="markers+text", text=["linear layers"],
                                           textposition=pos, textfont=dict(size=font_px), marker=dict(size=marker_px)))
                fig.update_layout(width=820, height=560, margin=dict(l=100, r=100, t=50, b=50), showlegend=False,
                                  font=dict(family="Source Sans"), xaxis=dict(type="log", range=[0, 2]),
                                  yaxis=dict(type="log", range=[0, 2]))
                _draw(pg, fig)
                drawn = pg.evaluate("""() => { const t = document.querySelector('.scatterlayer text').getBoundingClientRect();
                    const a = document.querySelector('.nsewdrag').getBoundingClientRect();
                    return [t.left - a.left, t.right - a.left, a.bottom - t.bottom, a.bottom - t.top]; }""")
                x0, x1, y0, y1 = _label_box(1.0, 1.0, pos, "linear layers", marker_px, font_px, dx, dy)
                est = [x0 / dx, x1 / dx, y0 / dy, y1 / dy]  # px from the plot's left and bottom edges
                near, far = (0, 1) if pos.endswith("right") else (1, 0)  # the edge beside the marker, the other
                assert abs(est[near] - drawn[near]) <= 3, (marker_px, pos, est, drawn)
                # The width is a generous 0.56 em a character, so the far edge may reach past the text, not short.
                assert (est[far] - drawn[far]) * (1 if far else -1) >= -1, (marker_px, pos, est, drawn)
                assert abs(est[2] - drawn[2]) <= 3 and abs(est[3] - drawn[3]) <= 3, (marker_px, pos, est, drawn)
    finally:
        ctx.close()


def test_home(server, page) -> None:  # noqa: ANN001
    open_page(page, server, "")
    page.wait_for_selector('[data-testid="stPageLink"]')
    text = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
    assert "InferScope" in text and "SmolLM2" in text or "random weights" in text
    if "CPU" in text:
        assert "torch reference path on the CPU" in text
    assert page.locator('[data-testid="stPageLink"]').count() >= 3
    assert_clean(page)
    assert_metrics_fit(page)
    assert_tables_fit(page)
    shoot(page, "00_home")


def test_home_path_opens_the_home_page(server, page) -> None:  # noqa: ANN001
    """`/home` (the home page's name in the registry) sends the visitor to the home page at `/`; Streamlit serves a
    default page only at the root and used to answer `/home` with its "Page not found" dialog."""
    page.goto(f"{server}/home")
    page.wait_for_selector('[data-testid="stPageLink"]')
    wait_idle(page, settle=False)
    assert page.locator('[role="dialog"]').count() == 0, page.locator('[role="dialog"]').all_inner_texts()
    assert page.url.rstrip("/") == server.rstrip("/")
    assert "InferScope" in page.locator("h1").first.inner_text()
    nav = page.locator('[data-testid="stSidebarNav"]').inner_text()
    assert nav.count("Home") == 1, nav  # the alias page is hidden from the navigation
    assert_clean(page)


ENGINE_PAGES = [
    ("kv-cache", "01_kv_cache", 3),
    ("attention-roofline", "02_attention_roofline", 4),
    ("paged-attention", "03_paged_attention", 4),
    ("continuous-batching", "04_continuous_batching", 3),
    ("radix-prefix-cache", "06_radix_prefix_cache", 2),
    ("chunked-prefill", "09_chunked_prefill", 3),
    ("speculative-decoding", "07_speculative_decoding", 4),
    ("medusa-eagle", "08_medusa_eagle", 3),
    ("disaggregated-prefill-decode", "10_disaggregated", 4),
]


@pytest.mark.parametrize("path,name,min_charts", ENGINE_PAGES, ids=[p[1] for p in ENGINE_PAGES])
def test_engine_page_steps(server, page, path: str, name: str, min_charts: int) -> None:  # noqa: ANN001
    """Each engine page on a projector (1280 pixels, sidebar open; after the fourth step also at 1024), stepped
    four times and scrubbed back.
    At that width the explanation panel's column is ~335 pixels: display-mode formulas of up to 650 pixels
    were cut off there (the inline ones wrap), and so were eleven chart titles, axis titles and annotations
    written for a 1600-pixel window (long titles now keep their details in a subtitle). Chart text is checked
    after the third step (the radix tree has two leaves from then on) and the fourth."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, path)
    assert_clean(page)
    assert assert_formulas_fit(page) >= 2, path
    for i in range(1, 5):
        step(page, i, settle=i >= 3)  # only the steps whose charts are measured wait for Plotly to draw
        assert_clean(page)
        if i >= 3:
            assert_chart_text_fits(page)
            assert_chart_text_apart(page)
    assert plotly_count(page) >= min_charts
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, f"{name}_step4")
    assert_fits_small_projector(page, f"{name}_step4")
    scrub_to_first_step(page)  # redrawn from records, still clean
    assert_clean(page)
    assert plotly_count(page) >= min_charts
    assert_tables_fit(page)
    shoot(page, f"{name}_scrubbed")


def test_roofline_page_decode_prefill_and_kernel_paths(server, page) -> None:  # noqa: ANN001
    """The roofline page stepped past the prompt: step 5 is a decode; scrubbed back, step 0 is the prefill,
    redrawn from its record; "Run the scenario on every kernel path" adds the kernel-path chart (on the CPU
    the torch reference kernels)."""
    open_page(page, server, "attention-roofline")
    assert_clean(page)
    for i in range(1, 7):
        step(page, i, settle=i == 6)
        assert_clean(page)
    assert plotly_count(page) >= 4
    selected = page.locator('[data-testid="stMetric"]', has_text="Selected step")
    assert "5 (decode)" in selected.inner_text()
    assert_tables_fit(page)
    shoot(page, "02_attention_roofline_decode_step5")
    scrub_to_first_step(page)
    assert_clean(page)
    assert "0 (prefill)" in selected.inner_text()
    assert_tables_fit(page)
    shoot(page, "02_attention_roofline_prefill_step0")
    plots = page.locator('[data-testid="stPlotlyChart"]')
    before = plots.count()
    page.get_by_role("button", name="Run the scenario on every kernel path").click()
    wait_idle(page)
    assert_clean(page)
    assert plots.count() == before + 1  # the kernel-path chart joins the page
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="Every decode step of the scenario")
    assert chart.count() == 1 and "torch reference kernels" in chart.inner_text()
    assert_tables_fit(page)
    shoot(page, "02_attention_roofline_kernel_paths")
    # Decoding in parallel: real passes over 1 to 128 rows timed, drawn as crosses among the predicted lines.
    before = plots.count()
    click_button(page, "Time passes over 1 to 128 rows")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("measured: ")')
    assert_clean(page)
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="K positions per pass")
    assert plots.count() == before and chart.count() == 1 and "measured: 4 per pass" in chart.inner_text()
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    shoot(page, "02_attention_roofline_parallel_decoding")


def test_kv_cache_measurement(server, page) -> None:  # noqa: ANN001
    open_page(page, server, "kv-cache")
    # 16 tokens instead of the default 48 keeps the test short on a shared CPU.
    tokens = page.locator('input[type="range"][aria-label="Tokens to generate"]').first
    tokens.focus()
    tokens.press("Home")
    tokens.press("ArrowRight")
    wait_idle(page)
    assert tokens.get_attribute("aria-valuetext") == "16"
    click_button(page, "Measure both ways")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("Speed-up from the cache")')
    assert_clean(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "01_kv_cache_measured")


def test_kv_cache_latent_section(server, page) -> None:  # noqa: ANN001
    """MLA on the KV page, on a projector: released models' caches in arithmetic, then the live model's K and V
    factored through a latent (about 30 s here): three answers, the quality-vs-cache chart, the spectra."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "kv-cache")
    assert page.locator('[data-testid="stPlotlyChart"]', has_text="Released models").count() == 1
    charts = page.locator('[data-testid="stPlotlyChart"]')
    before = charts.count()
    page.locator(".st-key-kv-mla-tokens input").fill("8")  # the answers are the part of the run that scales
    click_button(page, "Factor, score and answer")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("Numbers per token")')
    settle_charts(page)
    assert_clean(page)
    assert page.locator(".kvl-row").count() == 3
    assert charts.count() == before + 2 and plotly_count(page) >= 1
    assert page.get_by_text("At the same cache size", exact=False).count() == 1
    assert_formulas_fit(page)
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "01_kv_cache_latent")
    # On a projector in presentation mode (larger type), the run stays and everything still fits.
    page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"], [data-testid="stSidebar"] label',
                 has_text="Presentation mode").first.click()
    wait_idle(page)
    assert_clean(page)
    assert page.locator(".kvl-row").count() == 3
    assert_formulas_fit(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "01_kv_cache_latent_presentation")


def test_speculative_self_spec_section(server, page) -> None:  # noqa: ANN001
    """QuantSpec on the speculative page, on a projector: the model drafting for itself from a low-bit copy of its
    cache in four formats, with its own and with INT4 weights, every format's text the target's own, the rounds and
    the model."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "speculative-decoding")
    charts = page.locator('[data-testid="stPlotlyChart"]')
    before = charts.count()
    page.locator(".st-key-spec-qs-tokens input").fill("16")  # 16 tokens instead of 48 keeps the test short
    click_button(page, "Self-speculate with every cache format")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("Same text as the target alone")')
    settle_charts(page)
    assert_clean(page)
    assert page.locator('[data-testid="stMetric"]', has_text="Same text as the target alone").inner_text().endswith("yes")
    assert charts.count() == before + 2 and plotly_count(page) >= 1
    assert page.locator('[data-testid="stPlotlyChart"]', has_text="Every round: INT4").count() == 1
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "07_speculative_self_spec")


def test_continuous_batching_compare(server, page) -> None:  # noqa: ANN001
    open_page(page, server, "continuous-batching")
    click_button(page, "Run to end")
    click_button(page, "Run both policies")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("continuous: throughput")')
    assert_clean(page)
    assert_chart_text_apart(page)
    assert plotly_count(page) >= 6
    assert_tables_fit(page)
    shoot(page, "04_continuous_batching_compared")


def test_disaggregated_compare(server, page) -> None:  # noqa: ANN001
    """Run to the end, then the three ways of serving: the charts draw, their text stays apart at a
    projector's width, and the tokens are the same all three ways."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "disaggregated-prefill-decode")
    click_button(page, "Run to end")
    click_button(page, "Run three ways")
    same = page.locator('[data-testid="stMetric"]:has-text("Same tokens all three ways") [data-testid="stMetricValue"]')
    same.first.wait_for()
    assert same.first.inner_text() == "yes"
    assert_clean(page)
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert plotly_count(page) >= 6
    assert_tables_fit(page)
    shoot(page, "10_disaggregated_compared")


def test_flashattention_page(server, page) -> None:  # noqa: ANN001
    """No engine steps here: the page replays FA2 on one layer's real Q, K, V for the prompt in its form.
    All four charts (tile grid, one row's online softmax, the N x N matrix, the timing comparison) draw,
    and a new prompt submitted through the form redraws them."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "flashattention")
    page.get_by_text("Same inputs, several implementations", exact=False).first.wait_for()
    assert_clean(page)
    assert assert_formulas_fit(page) >= 2
    assert plotly_count(page) >= 4  # tile grid, online softmax, heatmap, time/error
    text = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
    assert "re-enactment" in text and ("torch reference path on the CPU" in text or "Triton kernels on" in text)
    assert_metrics_fit(page)
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "05_flashattention")
    pairs = page.locator('[data-testid="stMetric"]:has-text("Tile pairs") [data-testid="stMetricValue"]').first
    before = int(pairs.inner_text())
    prompt = page.locator('[data-testid="stTextArea"] textarea').first
    prompt.fill("Why is the sky blue?")
    click_button(page, "Use this prompt")
    playwright_sync.expect(pairs).not_to_have_text(str(before), timeout=SCRIPT_TIMEOUT_MS)
    wait_idle(page)
    assert int(pairs.inner_text()) < before  # a shorter prompt: fewer tile pairs
    assert_clean(page)
    assert plotly_count(page) >= 4
    assert_tables_fit(page)
    shoot(page, "05_flashattention_short_prompt")
    assert_fits_small_projector(page, "05_flashattention_short_prompt")


def test_test_time_compute_page(server, page) -> None:  # noqa: ANN001
    """Best-of-N on a projector: eight samples stepped (their token strips, the block tables with the shared
    prompt blocks, the answer votes), then the accuracy-vs-N measurement's scaling curve; chart text fits and
    stays apart at 1280 pixels, and the page can be scrubbed back."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "test-time-compute")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 2
    for i in range(1, 4):
        step(page, i, settle=i == 3)
        assert_clean(page)
    assert page.locator(".tt-strip").count() == 8
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert plotly_count(page) >= 2
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "11_test_time_compute_step3")
    click_button(page, "Measure accuracy vs N")
    page.get_by_text("Measured in this session", exact=False).first.wait_for()
    wait_idle(page)
    assert_clean(page)
    assert plotly_count(page) >= 3
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "11_test_time_compute_measured")
    # Budget forcing run to the end: forced " Wait," and answer cues in the strips, the thinking-budget chart
    # (its budget labels over the plot ran into the legend at this width).
    page.get_by_text("Budget forcing (s1)", exact=True).click()
    click_button(page, "Apply and restart")
    click_button(page, "Run to end")
    assert_clean(page)
    assert page.locator(".tt-cue").count() >= 8
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "11_test_time_compute_budget_forcing")
    assert_fits_small_projector(page, "11_test_time_compute_budget_forcing")


def test_constrained_decoding_page(server, page) -> None:  # noqa: ANN001
    """The person-record preset on a projector, run to its end: one token strip with jump-forward tokens, the
    mask chart whose token labels stay apart, a valid result; then the free-vs-masked comparison, whose
    free run is judged invalid and masked runs valid; a bad hand-written grammar is a message that keeps
    the run."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "constrained-decoding")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 2
    step(page, 1, settle=False)
    click_button(page, "Run to end")
    assert_clean(page)
    assert page.locator(".cd-strip").count() == 1 and page.locator(".cd-forced").count() >= 1
    assert "valid ✓" in page.locator(".cd-head").first.inner_text()
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "12_constrained_decoding_end")
    click_button(page, "Run the comparison")
    assert_clean(page)
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="with and without the grammar")
    chart.wait_for()
    text = chart.inner_text()
    assert "not valid ✗" in text and text.count("valid ✓") >= 3
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "12_constrained_decoding_compared")
    page.locator('[data-testid="stExpander"] summary', has_text="Benchmark on this machine").first.click()
    wait_idle(page, settle=False)
    assert page.locator('[data-testid="stCode"]').count() >= 4 + 4  # the live modes' answers, then a preset's
    assert_tables_fit(page)  # the benchmark's tables, its answers below them
    records = page.get_by_text("steps recorded", exact=False).first.inner_text()
    page.get_by_text("Regular expression", exact=True).click()
    page.get_by_label("JSON schema, regular expression, or choices (one per line)").fill("([a-z")
    click_button(page, "Apply and restart")
    error = page.locator('[data-testid="stAlertContentError"]')
    assert error.count() == 1 and "regular expression is not usable" in error.inner_text()
    assert page.get_by_text("steps recorded", exact=False).first.inner_text() == records  # the run is still there


def test_kv_compression_page(server, page) -> None:  # noqa: ANN001
    """The storage-format comparison on a projector: the table, the trade-off chart whose labels stay apart,
    each variant's own text with its divergence highlighted; then the eviction preset run, with the kept-token
    map; chart text fits and stays apart at 1280 pixels."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "kv-quantization-eviction")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 3
    assert page.locator(".kvq-row").count() == 7  # the reference and six formats
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_buttons_fit(page)
    assert plotly_count(page) >= 8  # the lab's five and the fused kernel's three (measured on an H200)
    assert_tables_fit(page)
    shoot(page, "13_kv_compression_formats")
    choose(page, "Compare", "Eviction")
    click_button(page, "Run on the model")
    page.locator('[data-testid="stPlotlyChart"]', has_text="the cache after generated token").wait_for()
    assert_clean(page)
    assert page.locator(".kvq-row").count() == 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "13_kv_compression_eviction")
    assert_fits_small_projector(page, "13_kv_compression_eviction")


def test_slo_goodput_page(server, page) -> None:  # noqa: ANN001
    """The default load test on a projector (every configuration at every rate on the real engine, ~30-45 s
    here): goodput per configuration, the four charts with text that fits and stays apart; then a tighter
    TTFT target re-reads the runs (no new run) and the charts redraw clean."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "latency-slo-goodput")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 4
    assert plotly_count(page) >= 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "14_slo_goodput")
    assert_fits_small_projector(page, "14_slo_goodput")
    box = page.get_by_label("TTFT target (s)")
    box.fill("0.01")
    box.press("Enter")
    wait_idle(page)
    assert_clean(page)
    assert page.get_by_text("No configuration reaches").count() == 1
    assert plotly_count(page) >= 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)


def test_weight_quantization_page(server, page) -> None:  # noqa: ANN001
    """The default run on a projector (the real model's linears rounded three ways, ~50 s here): the distance
    chart, each checkpoint's answer, the layer-by-layer errors, AWQ's alphas and one input's channels, with chart
    text that fits and stays apart; another layer input redraws the channel chart from the run."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "weight-quantization")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 4
    assert page.locator(".wq-row").count() == 4  # the full model and three checkpoints
    assert plotly_count(page) >= 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "15_weight_quantization")
    choose(page, "Layer input", "down")
    assert_clean(page)
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="mean |x| per input channel")
    assert "down (SwiGLU output)" in chart.inner_text()
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_fits_small_projector(page, "15_weight_quantization")


def test_presentation_mode(server, page) -> None:  # noqa: ANN001
    # A projector's width, where presentation mode's large metric values used to be cut off.
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "attention-roofline")
    page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"], [data-testid="stSidebar"] label',
                 has_text="Presentation mode").first.click()
    wait_idle(page)
    step(page, 1)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_chart_text_apart(page)
    # At 1024 pixels, text a third larger: the roofline's ridge label ran into the compute roof's label while its
    # legend took a third of the chart's width beside the plot.
    assert_fits_small_projector(page, "02_attention_roofline_presentation")
    for path in ("speculative-decoding", "medusa-eagle", "flashattention"):  # forms with a button in a knob row
        open_page(page, server, path)  # a new session: presentation mode is off again
        page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"], [data-testid="stSidebar"] label',
                     has_text="Presentation mode").first.click()
        wait_idle(page)
        assert_buttons_fit(page)
    open_page(page, server, "paged-attention")
    page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"], [data-testid="stSidebar"] label',
                 has_text="Presentation mode").first.click()
    wait_idle(page)
    step(page, 1)
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    assert_clean(page)
    assert_tables_fit(page)
    shoot(page, "03_paged_attention_presentation")
    # The page picker beside the exit button changes topic without leaving presentation mode (the sidebar, the
    # only navigation, is hidden in it).
    page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name="Chunked prefill").first.click()
    wait_idle(page)
    assert page.url.rstrip("/").endswith("/chunked-prefill")
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    assert_clean(page)
    click_button(page, "Exit presentation mode")
    assert page.locator('[data-testid="stSidebar"]').is_visible()
    # A small projector with the sidebar open: the engine controls keep their labels ("S.", "P.", "Ru…" once).
    page.set_viewport_size(SMALL_PROJECTOR)
    open_page(page, server, "kv-cache")
    assert_buttons_fit(page)


def test_editor_and_kernel_panels(server, page) -> None:  # noqa: ANN001
    """The request editor and the kernel table on a projector."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "paged-attention")
    step(page, 1)
    for label in ("Scenario and requests", "Kernel timings for the selected step"):
        page.locator('[data-testid="stExpander"] summary', has_text=label).first.click()
        wait_idle(page)
    page.wait_for_selector('[data-testid="stDataFrame"]')
    assert page.locator('[data-testid="stPlotlyChart"]:has-text("Kernel time in step 0")').count() == 1
    assert_clean(page)
    assert_tables_fit(page)
    shoot(page, "03_paged_attention_panels")


def test_play_then_pause(server, page) -> None:  # noqa: ANN001
    """Play steps the engine on a timer (st.fragment run_every); Pause stops it."""
    open_page(page, server, "kv-cache")
    page.locator('[data-testid="stMainBlockContainer"] button', has_text="Play").first.click()
    page.get_by_text("3 steps recorded", exact=False).first.wait_for()
    page.locator('[data-testid="stMainBlockContainer"] button', has_text="Pause").first.click()
    wait_idle(page)


    def recorded() -> int:
        m = re.search(r"(\d+) steps? recorded", page.locator('[data-testid="stMainBlockContainer"]').inner_text())
        return int(m.group(1)) if m else 0

    paused_at = recorded()
    page.wait_for_timeout(4000)
    assert recorded() == paused_at >= 3
    assert_clean(page)


def test_lora_merge_page(server, page) -> None:  # noqa: ANN001
    """The default run on a projector (the pirate adapter merged and served, ~30 s here): the three answers, the
    same-tokens check, the step times, the adapter's anatomy and the memory chart, with chart text that fits."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "lora-merge-or-serve")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 2
    assert page.get_by_text("Merged and unmerged wrote the same").count() >= 1
    assert plotly_count(page) >= 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "16_lora_merge")
    assert_fits_small_projector(page, "16_lora_merge")


def test_multi_lora_page(server, page) -> None:  # noqa: ANN001
    """Three fine-tunes and the base model in one engine with two adapter slots, run to the end on a projector:
    the packed batch, the slots, every request by adapter (someone waited for a slot), then both set-ups
    compared on the same requests."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "multi-lora")
    assert_clean(page)
    click_button(page, "Run to end")
    assert_clean(page)
    assert plotly_count(page) >= 3
    waiting = page.locator('[data-testid="stPlotlyChart"]', has_text="waiting for a slot")
    assert waiting.count() == 1
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_tables_fit(page)
    shoot(page, "17_multi_lora")
    click_button(page, "Run both set-ups")
    page.wait_for_selector('[data-testid="stMetric"]:has-text("multi-LoRA: throughput")')
    assert_clean(page)
    assert plotly_count(page) >= 4
    assert_chart_text_apart(page)
    assert_tables_fit(page)
    shoot(page, "17_multi_lora_compared")


def test_activation_quantization_page(server, page) -> None:  # noqa: ANN001
    """The default run on a projector (the real model's weights and activations fake-quantized in eight formats, an
    α sweep): the channel chart before and after smoothing, the outlier ratios, the distance chart, the sweep and
    each format's answer, with chart text that fits and stays apart; another layer input redraws from the run."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "activation-quantization")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 4
    assert page.locator(".aq-row").count() == 9  # the full model and eight formats
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 4 and plotly_count(page) >= 4
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "18_activation_quantization")
    choose(page, "Layer input", "down")
    assert_clean(page)
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="per input channel")
    assert "down (SwiGLU output)" in chart.inner_text()
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_fits_small_projector(page, "18_activation_quantization")


def test_parallelism_page(server, page) -> None:  # noqa: ANN001
    """The default run on a projector (the real model on one rank and on three, four requests through three
    pipeline stages, ~4 s here): the degree table, the same-tokens check, the layer split, memory, the passes, the
    Gantt and the expert arithmetic, with chart text that fits and stays apart; a degree that does not split is a
    message, and the last run stays on screen."""
    page.set_viewport_size(PROJECTOR)
    open_page(page, server, "parallelism")
    assert_clean(page)
    assert assert_formulas_fit(page) >= 4
    assert page.get_by_text("The same").count() >= 1 and page.locator(".par-row").count() == 2
    assert page.locator(".pp-row").count() == 4
    assert plotly_count(page) >= 6
    assert_chart_text_fits(page)
    assert_chart_text_apart(page)
    assert_metrics_fit(page)
    assert_buttons_fit(page)
    assert_tables_fit(page)
    shoot(page, "19_parallelism")
    assert_fits_small_projector(page, "19_parallelism")
    choose(page, "Tensor-parallel degree", "2")
    click_button(page, "Shard, pipeline and measure")
    error = page.locator('[data-testid="stAlertContentError"]')
    assert error.count() == 1 and "Degrees that work for it: 1, 3" in error.inner_text()
    assert page.locator('[data-testid="stException"]').count() == 0 and plotly_count(page) >= 6
