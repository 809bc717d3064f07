"""Bad input gets a ValueError naming the field, and the engine keeps serving everyone else."""
from __future__ import annotations

import math

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams


@pytest.fixture()
def engine(random_weights) -> LLMEngine:
    return LLMEngine(EngineConfig(weights="random", num_blocks=16, max_model_len=192), random_weights)


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=math.nan), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(n=0), "n"),
])
def test_invalid_sampling_params_name_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("prompt, field", [
    ("", "prompt"),
    ("   ", "prompt"),
    ([], "prompt"),
    ([5, 49152], "token ids"),
    ([-1, 3], "token ids"),
])
def test_invalid_prompts_name_the_field(engine, prompt, field) -> None:
    with pytest.raises(ValueError, match=field):
        engine.add_request(prompt)


def test_prompt_longer_than_context_or_pool(engine) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(10, 210)), SamplingParams(max_tokens=4))
    small = LLMEngine(EngineConfig(weights="random", num_blocks=4, block_size=16), engine.weights)
    with pytest.raises(ValueError, match="pool"):
        small.add_request(list(range(10, 70)), SamplingParams(max_tokens=8))


def test_engine_keeps_serving_after_bad_requests(engine) -> None:
    good = engine.add_request("Hello there", SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()  # the good request is mid-flight when bad ones arrive
    for bad in ("", [99999], list(range(10, 300))):
        with pytest.raises(ValueError):
            engine.add_request(bad, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError):
        engine.add_request("ok", SamplingParams(max_tokens=4), arrival_step=-2)
    other = engine.add_request("Another prompt", SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert len(engine.result(good).token_ids) == 5
    assert len(engine.result(other).token_ids) == 3
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == 16


def test_engine_config_names_what_a_knob_needs() -> None:
    with pytest.raises(ValueError, match="overlap_decode needs cuda_graphs"):
        EngineConfig(overlap_decode=True)
    with pytest.raises(ValueError, match="num_blocks"):
        EngineConfig(num_blocks=0)
