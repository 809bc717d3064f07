"""What every page's AppTest needs: the entry point, a generous timeout, opening a page through the
real navigation, and the no-exception / no-error check."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
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


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
