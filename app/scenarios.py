"""Scenarios: a list of requests plus the engine knobs to run them with.

A scenario is what a lecturer saves, uploads and shares, so parsing is strict and every problem is
reported as one readable `ScenarioError` (never a traceback). Device, dtype and weights are not
part of a scenario: the server decides those.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Sequence

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

# Engine knobs a scenario may set; everything else in EngineConfig belongs to the server.
ENGINE_KEYS: tuple[str, ...] = (
    "block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "policy",
    "chunked_prefill", "enable_prefix_cache", "kernel_backend", "cuda_graphs", "overlap_decode", "seed",
    "spec_drafter", "spec_gamma", "spec_draft_layers", "spec_tree_nodes", "spec_tree_depth", "spec_tree_topk",
    "spec_draft_vocab", "max_loras", "max_lora_rank",
)
MAX_UPLOAD_BYTES = 256 * 1024
MAX_REQUESTS = 64


class ScenarioError(ValueError):
    """A scenario file or edit that cannot be used; the message says what and where."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    prompt: str
    max_tokens: int = 16
    arrival_step: int = 0
    chat: bool = True  # wrap the prompt as a user turn of the chat template
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    request_id: str | None = None
    adapter: str | None = None  # a LoRA adapter the page's engine serves (multi-LoRA page); None: the base model

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, seed=self.seed, n=self.n, stop=self.stop,
                              ignore_eos=self.ignore_eos)

    def engine_prompt(self) -> str | list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}] if self.chat else self.prompt

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        if d["adapter"] is None:
            del d["adapter"]  # scenarios of the other pages stay as they were
        return d


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    requests: tuple[RequestSpec, ...]
    engine: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def engine_config(self, **server: Any) -> EngineConfig:
        """The EngineConfig for this scenario; `server` adds device/dtype/weights."""
        return EngineConfig(**{**self.engine, **server})

    def with_requests(self, requests: list[RequestSpec]) -> "Scenario":
        return replace(self, requests=tuple(requests))

    def with_engine(self, **changes: Any) -> "Scenario":
        return replace(self, engine={**self.engine, **changes})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "engine": dict(self.engine),
                "requests": [r.to_dict() for r in self.requests]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---- parsing ------------------------------------------------------------------------------------

_REQUEST_TYPES: dict[str, tuple[type, ...]] = {
    "prompt": (str,), "max_tokens": (int,), "arrival_step": (int,), "chat": (bool,),
    "temperature": (int, float), "top_k": (int,), "top_p": (int, float), "seed": (int, type(None)),
    "n": (int,), "stop": (list, str), "ignore_eos": (bool,), "request_id": (str, type(None)),
    "adapter": (str, type(None)),
}
_ENGINE_TYPES: dict[str, tuple[type, ...]] = {
    "block_size": (int,), "num_blocks": (int,), "max_num_seqs": (int,), "max_num_batched_tokens": (int,),
    "max_model_len": (int,), "policy": (str,), "chunked_prefill": (bool,), "enable_prefix_cache": (bool,),
    "kernel_backend": (str,), "cuda_graphs": (bool,), "overlap_decode": (bool,), "seed": (int,),
    "spec_drafter": (str,), "spec_gamma": (int,), "spec_draft_layers": (int,),
    "spec_tree_nodes": (int,), "spec_tree_depth": (int,), "spec_tree_topk": (int,), "spec_draft_vocab": (int,),
    "max_loras": (int,), "max_lora_rank": (int,),
}


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _check_type(where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int in Python; a JSON `true` must not pass as max_tokens.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ScenarioError(f"{where}: '{key}' must be {_type_name(types)}, got {json.dumps(value)}")


def parse_request(raw: Any, index: int) -> RequestSpec:
    where = f"request {index + 1}"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be an object like {{\"prompt\": \"...\", \"max_tokens\": 16}}")
    unknown = sorted(set(raw) - set(_REQUEST_TYPES))
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_REQUEST_TYPES)}")
    if "prompt" not in raw:
        raise ScenarioError(f"{where}: 'prompt' is required")
    for key, value in raw.items():
        _check_type(where, key, value, _REQUEST_TYPES[key])
    data = dict(raw)
    if isinstance(data.get("stop"), str):
        data["stop"] = [data["stop"]]
    if "stop" in data:
        if not all(isinstance(s, str) for s in data["stop"]):
            raise ScenarioError(f"{where}: 'stop' must be a list of strings")
        data["stop"] = tuple(data["stop"])
    if "temperature" in data:
        data["temperature"] = float(data["temperature"])
    if "top_p" in data:
        data["top_p"] = float(data["top_p"])
    if not data["prompt"].strip():
        raise ScenarioError(f"{where}: 'prompt' must not be empty")
    if isinstance(data.get("adapter"), str):
        data["adapter"] = data["adapter"].strip() or None  # an empty cell: the base model
    if data.get("arrival_step", 0) < 0:
        raise ScenarioError(f"{where}: 'arrival_step' must be >= 0")
    spec = RequestSpec(**data)
    try:
        spec.sampling_params()
    except ValueError as e:  # SamplingParams names the field; we add which request
        raise ScenarioError(f"{where}: {e}") from None
    return spec


def parse_engine(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ScenarioError("'engine' must be an object of engine settings, e.g. {\"block_size\": 16}")
    unknown = sorted(set(raw) - set(ENGINE_KEYS))
    if unknown:
        raise ScenarioError(f"engine: unknown or server-only setting(s) {unknown}; allowed: {list(ENGINE_KEYS)}")
    for key, value in raw.items():
        _check_type("engine", key, value, _ENGINE_TYPES[key])
    try:
        EngineConfig(**raw)
    except (ValueError, TypeError) as e:
        raise ScenarioError(f"engine: {e}") from None
    return dict(raw)


def scenario_from_dict(raw: Any) -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError("a scenario must be a JSON object with 'requests' (and optionally 'engine', 'name')")
    unknown = sorted(set(raw) - {"name", "description", "engine", "requests"})
    if unknown:
        raise ScenarioError(f"unknown top-level field(s) {unknown}; allowed: name, description, engine, requests")
    reqs = raw.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise ScenarioError("'requests' must be a non-empty list of request objects")
    if len(reqs) > MAX_REQUESTS:
        raise ScenarioError(f"at most {MAX_REQUESTS} requests per scenario (got {len(reqs)})")
    name = raw.get("name", "Uploaded scenario")
    if not isinstance(name, str):
        raise ScenarioError("'name' must be a string")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError("'description' must be a string")
    engine = parse_engine(raw.get("engine", {}))
    requests = tuple(parse_request(r, i) for i, r in enumerate(reqs))
    require_unique_ids(requests)
    return Scenario(name=name, requests=requests, engine=engine, description=description)


def require_unique_ids(requests: Sequence[RequestSpec], what: str = "request_id values", hint: str = "") -> None:
    """Two requests of one scenario may not share a name (unnamed ones are named by position)."""
    ids = [r.request_id for r in requests if r.request_id]
    if len(ids) != len(set(ids)):
        raise ScenarioError(f"{what} must be unique{hint}")


def scenario_from_json(text: str | bytes) -> Scenario:
    if isinstance(text, bytes):
        if len(text) > MAX_UPLOAD_BYTES:
            raise ScenarioError(f"file is {len(text) // 1024} KiB; scenarios are small (limit {MAX_UPLOAD_BYTES // 1024} KiB)")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ScenarioError("file is not UTF-8 text; upload a .json scenario") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    return scenario_from_dict(raw)


def request_field_names() -> list[str]:
    return [f.name for f in fields(RequestSpec)]
