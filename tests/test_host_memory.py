"""The engine fixes glibc's allocator thresholds once per process (engine/host_memory.py)."""
from __future__ import annotations

import sys

import pytest

from engine.host_memory import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_thresholds_are_set_and_setting_again_is_harmless():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
