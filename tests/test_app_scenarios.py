"""Scenario parsing: every malformed file is one readable ScenarioError, never a traceback."""
from __future__ import annotations

import json

import pytest

from app.scenario_library import (CHUNKED_PREFILL, CONTINUOUS_BATCHING, KV_CACHE, PAGED_ATTENTION, RADIX_PREFIX_CACHE,
                                  SPECULATIVE, TREE_SPEC)
from app.scenarios import ScenarioError, scenario_from_dict, scenario_from_json
from app.widgets.request_editor import requests_frame, requests_from_frame


@pytest.mark.parametrize("scenario", KV_CACHE + PAGED_ATTENTION + CONTINUOUS_BATCHING, ids=lambda s: s.name)
def test_library_round_trips_through_json(scenario) -> None:  # noqa: ANN001
    again = scenario_from_json(scenario.to_json())
    assert again == scenario
    scenario.engine_config(device="cpu", dtype="float32", weights="random")  # valid engine knobs


@pytest.mark.parametrize("text,fragment", [
    ("", "not valid JSON"),
    ("{", "not valid JSON: Expecting property name"),
    ("[1, 2]", "must be a JSON object"),
    ('{"requests": []}', "non-empty list"),
    ('{"requests": [{"max_tokens": 4}]}', "request 1: 'prompt' is required"),
    ('{"requests": [{"prompt": 3}]}', "request 1: 'prompt' must be a string"),
    ('{"requests": [{"prompt": "  "}]}', "must not be empty"),
    ('{"requests": [{"prompt": "a", "max_tokens": true}]}', "'max_tokens' must be an integer"),
    ('{"requests": [{"prompt": "a", "max_tokens": 0}]}', "request 1: max_tokens must be a positive integer"),
    ('{"requests": [{"prompt": "a", "temperature": -1}]}', "temperature must be a finite number"),
    ('{"requests": [{"prompt": "a", "top_p": 0}]}', "top_p must be in (0, 1]"),
    ('{"requests": [{"prompt": "a", "arrival_step": -2}]}', "'arrival_step' must be >= 0"),
    ('{"requests": [{"prompt": "a", "colour": "red"}]}', "unknown field(s) ['colour']"),
    ('{"requests": [{"prompt": "a"}], "engine": {"device": "cuda"}}', "server-only setting(s) ['device']"),
    ('{"requests": [{"prompt": "a"}], "engine": {"block_size": 0}}', "block_size must be > 0"),
    ('{"requests": [{"prompt": "a"}], "engine": {"policy": "fifo"}}', "policy must be"),
    ('{"requests": [{"prompt": "a"}], "engine": []}', "'engine' must be an object"),
    ('{"requests": [{"prompt": "a", "request_id": "x"}, {"prompt": "b", "request_id": "x"}]}', "unique"),
    ('{"requests": [{"prompt": "a"}], "extra": 1}', "unknown top-level field(s) ['extra']"),
])
def test_malformed_scenarios_give_clear_messages(text: str, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_json(text)
    assert fragment in str(info.value)


def test_binary_and_oversized_uploads() -> None:
    with pytest.raises(ScenarioError, match="not UTF-8"):
        scenario_from_json(b"\xff\xfe\x00garbage")
    with pytest.raises(ScenarioError, match="KiB"):
        scenario_from_json(b" " * (300 * 1024))


def test_minimal_scenario_gets_defaults() -> None:
    s = scenario_from_dict({"requests": [{"prompt": "Hello", "stop": "."}]})
    (r,) = s.requests
    assert r.max_tokens == 16 and r.chat and r.stop == (".",) and s.engine == {}
    assert r.engine_prompt() == [{"role": "user", "content": "Hello"}]


ALL_SCENARIOS = (KV_CACHE + PAGED_ATTENTION + CONTINUOUS_BATCHING + RADIX_PREFIX_CACHE + CHUNKED_PREFILL + SPECULATIVE
                 + TREE_SPEC)


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=lambda s: s.name)
def test_every_library_scenario_round_trips_through_the_editor_table(scenario) -> None:  # noqa: ANN001
    """Apply-and-restart with nothing edited gives back the same requests, names ("shot3", "A-turn1") included."""
    assert requests_from_frame(requests_frame(scenario.requests)) == list(scenario.requests)


def test_editor_request_names() -> None:
    df = requests_frame(PAGED_ATTENTION[0].requests)
    df["request_id"] = ["first", "  "] + [None] * (len(df) - 2)
    specs = requests_from_frame(df)
    assert specs[0].request_id == "first" and all(r.request_id is None for r in specs[1:])
    df["request_id"] = ["same", "same"] + [None] * (len(df) - 2)
    with pytest.raises(ScenarioError, match="names must be unique"):
        requests_from_frame(df)


def test_editor_table_round_trip_and_validation() -> None:
    scenario = PAGED_ATTENTION[0]
    df = requests_frame(scenario.requests)
    assert requests_from_frame(df) == list(scenario.requests)
    df.loc[1, "max_tokens"] = 0
    with pytest.raises(ScenarioError, match="request 2: max_tokens"):
        requests_from_frame(df)
    blank = requests_frame(scenario.requests).iloc[:0]
    with pytest.raises(ScenarioError, match="at least one request"):
        requests_from_frame(blank)


def test_download_is_the_upload_format() -> None:
    data = json.loads(CONTINUOUS_BATCHING[1].to_json())
    assert set(data) == {"name", "description", "engine", "requests"}
    assert scenario_from_dict(data) == CONTINUOUS_BATCHING[1]
