"""What every page's AppTest needs: the entry point, a generous timeout, opening a page through the
real navigation, and the no-exception / no-error check."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.state import session_key

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
# Every page with a live engine: page file -> its session key prefix (PAGE in the file).
ENGINE_PAGES = {
    "01_kv_cache.py": "kv",
    "02_attention_roofline.py": "roofline",
    "03_paged_attention.py": "paged",
    "04_continuous_batching.py": "cb",
    "06_radix_prefix_cache.py": "radix",
    "07_speculative_decoding.py": "spec",
    "08_medusa_eagle.py": "tree",
    "09_chunked_prefill.py": "chunked",
    "10_disaggregated.py": "disagg",
    "11_test_time_compute.py": "ttc",
    "12_constrained_decoding.py": "cd",
    "17_multi_lora.py": "ml",
}
TIMEOUT = 600  # seconds per script run: a step is 0.1-0.3 s on an idle 2-core CPU, far more when shared


def new_app() -> AppTest:
    return AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)


@pytest.fixture()
def random_app(monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The app on random weights (no GGUF needed), on the CPU."""
    monkeypatch.setenv("INFERSCOPE_WEIGHTS", "random")
    monkeypatch.setenv("INFERSCOPE_DEVICE", "cpu")
    return new_app()


def open_page(at: AppTest, page_file: str) -> AppTest:
    at.run()
    at.switch_page(f"../pages/{page_file}").run()
    assert not at.exception, at.exception
    return at


# A small valid scenario to upload: another name, block size and pool than any page's default.
TINY_SCENARIO = {"name": "Tiny", "engine": {"block_size": 4, "num_blocks": 32},
                 "requests": [{"prompt": "Hi", "max_tokens": 3}]}


def upload_scenario(at: AppTest, prefix: str, data: bytes, filename: str = "scenario.json") -> AppTest:
    """Hand the page's scenario uploader a file and run the page."""
    at.file_uploader(key=f"{prefix}-upload").set_value((filename, data, "application/json"))
    return at.run()


def session_of(at: AppTest, prefix: str):  # noqa: ANN201 (an app.session.EngineSession)
    return at.session_state[session_key(prefix)]


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert_no_none_cells(at)


def assert_no_none_cells(at: AppTest) -> None:
    """A table with missing values names what to print for them (a dash, or nothing in an editor): without a
    placeholder the grid prints a grey "None", which reads as a bug on a projector."""
    for d in at.dataframe:
        frame = d.value
        missing = [str(c) for c in frame.columns if frame[c].isna().any()]
        assert not missing or d.proto.HasField("placeholder"), f"table with columns {list(frame.columns)} shows None in {missing}"


def submit_blank_prompt(at: AppTest, prompt_key: str, submit_key: str, answered_by: str = "the model") -> AppTest:
    """Submit a lab's form with an all-space prompt: the run is refused with its one message above the last
    results, and nothing raises (the caller checks that its results stayed)."""
    at.text_input(key=prompt_key).set_value("   ")
    at.button(key=submit_key).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"The prompt is empty: type something for {answered_by} to answer. "
                                           "The results below are the last run's."]
    return at
