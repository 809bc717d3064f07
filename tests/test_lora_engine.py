"""LoRA on the live engine: served unmerged it gives the merged model's tokens; a mixed batch gives
every request the tokens it gets alone; the device slots pin, load and evict correctly; the prefix
cache never shares KV across adapters; bad adapters and requests are refused with a clear message."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.lora import load_adapter, merged_weights, random_adapter, save_adapter
from engine.lora.slots import AdapterSlots
from engine.sampling_params import SamplingParams
from tests.hf_reference import hf_greedy

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
PROMPTS = ["The cat sat on the", "Numbers: 1, 2, 3,", "Paris is the capital of", "Once upon a time"]


def tiny_adapters(cfg):
    # Strong enough (std 0.5 on a x10-scaled tiny model) that every adapter changes the greedy tokens.
    return [random_adapter(cfg, "a", 4, seed=1, std=0.5),
            random_adapter(cfg, "b", 2, targets=("q", "v", "down"), seed=2, std=0.5),
            random_adapter(cfg, "c", 4, targets=("o", "gate", "up"), seed=3, std=0.5)]


def lora_engine(weights, adapters, **kw) -> LLMEngine:
    e = LLMEngine(EngineConfig(max_loras=kw.pop("max_loras", 3), max_lora_rank=4, **kw), weights)
    for a in adapters:
        e.register_adapter(a)
    return e


def solo(weights, prompt, adapter=None, params=GREEDY) -> tuple[int, ...]:
    w = weights if adapter is None else merged_weights(weights, adapter)
    return LLMEngine(EngineConfig(), w).generate(prompt, params)[0].token_ids


def test_unmerged_equals_merged_and_changes_the_output(tiny_weights):
    adapters = tiny_adapters(tiny_weights.config)
    for a in adapters:
        e = lora_engine(tiny_weights, adapters)
        for p in PROMPTS[:2]:
            rid = e.add_request(p, GREEDY, adapter=a.name)
            while e.has_work():
                e.step()
            assert e.result(rid).token_ids == solo(tiny_weights, p, a)
    changed = [solo(tiny_weights, p, a) != solo(tiny_weights, p) for a in adapters for p in PROMPTS]
    assert sum(changed) >= len(changed) // 2  # the adapters really do something


def test_mixed_batch_gives_each_request_its_own_tokens(tiny_weights):
    adapters = tiny_adapters(tiny_weights.config)
    names = [None, "a", "b", "c", "a", None, "c", "b"]
    e = lora_engine(tiny_weights, adapters)
    rids = [e.add_request(PROMPTS[i % 4], GREEDY, adapter=n) for i, n in enumerate(names)]
    mixed_steps = 0
    while e.has_work():
        r = e.step()
        running = dict(r.extras)["lora"]["running"]
        mixed_steps += len(set(running.values())) > 1
    assert mixed_steps > 0  # several adapters really shared a batch
    by_name = {a.name: a for a in adapters}
    for i, (rid, n) in enumerate(zip(rids, names)):
        assert e.result(rid).token_ids == solo(tiny_weights, PROMPTS[i % 4], by_name.get(n))
    assert e.lora.slots.pins == [0, 0, 0]


def test_base_rows_are_bitwise_the_base_model(tiny_weights):
    """Rows without an adapter go through the LoRA-enabled pass untouched: the same logits bit for bit
    as in an engine without LoRA running the same batch shapes (the neighbour row runs the base model
    there, an adapter here)."""
    adapters = tiny_adapters(tiny_weights.config)
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True)
    e = lora_engine(tiny_weights, adapters)
    plain = LLMEngine(EngineConfig(), tiny_weights)
    for engine, neighbour in ((e, "a"), (plain, None)):
        engine.add_request(PROMPTS[0], params, request_id="base")
        engine.add_request(PROMPTS[1], params, adapter=neighbour)
        while engine.has_work():
            engine.step()
    assert e.result("base").samples[0].logprobs == plain.result("base").samples[0].logprobs


def test_too_few_slots_make_requests_wait_then_evict_lru(tiny_weights):
    adapters = tiny_adapters(tiny_weights.config)
    e = lora_engine(tiny_weights, adapters, max_loras=1)
    rids = [e.add_request(PROMPTS[0], GREEDY, adapter="a"), e.add_request(PROMPTS[1], GREEDY, adapter="b"),
            e.add_request(PROMPTS[2], GREEDY), e.add_request(PROMPTS[3], GREEDY, adapter="a")]
    waited, events = set(), []
    while e.has_work():
        lora = dict(e.step().extras)["lora"]
        waited |= set(lora["waiting_for_slot"])
        events += lora["events"]
        assert sum(p > 0 for p in lora["pins"]) <= 1
    assert "r1" in waited  # b waited while a held the only slot
    assert [(ev["kind"], ev["adapter"]) for ev in events] == [("load", "a"), ("evict", "a"), ("load", "b")]
    by_name = {a.name: a for a in adapters}
    for rid, (p, n) in zip(rids, [(0, "a"), (1, "b"), (2, None), (3, "a")]):
        assert e.result(rid).token_ids == solo(tiny_weights, PROMPTS[p], by_name.get(n))
    assert e.lora.slots.pins == [0]


def test_preemption_and_parallel_samples_keep_pins_balanced(tiny_weights):
    adapters = tiny_adapters(tiny_weights.config)
    e = lora_engine(tiny_weights, adapters, num_blocks=6, block_size=4, max_model_len=64)
    p = SamplingParams(max_tokens=10, ignore_eos=True)
    rids = [e.add_request(PROMPTS[i], p, adapter=n) for i, n in enumerate(["a", "b", "c"])]
    rid_n = e.add_request(PROMPTS[3], SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=3), adapter="a")
    preempted = 0
    while e.has_work():
        preempted += len(e.step().preempted)
    assert preempted > 0
    assert e.lora.slots.pins == [0, 0, 0]
    by_name = {a.name: a for a in adapters}
    for rid, (i, n) in zip(rids, [(0, "a"), (1, "b"), (2, "c")]):
        assert e.result(rid).token_ids == solo(tiny_weights, PROMPTS[i], by_name[n], p)
    assert len(e.result(rid_n).samples) == 2


def test_prefix_cache_never_shares_kv_across_adapters(tiny_weights):
    adapters = tiny_adapters(tiny_weights.config)
    e = lora_engine(tiny_weights, adapters, enable_prefix_cache=True, block_size=4)
    prompt = "A long shared system prompt that spans several blocks of tokens. Question one"
    p = SamplingParams(max_tokens=4, ignore_eos=True)
    runs = []
    for n in ["a", "a", "b", None, "b"]:
        rid = e.add_request(prompt, p, adapter=n)
        while e.has_work():
            e.step()
        runs.append((n, e.sequences[-1].num_cached_tokens, e.result(rid).token_ids))
        cache = e.scheduler.prefix_cache
        cache.check_invariants()
        e.block_manager.check_invariants(extra_refs=cache.block_refs())
    cached = [c for _, c, _ in runs]
    assert cached[0] == 0 and cached[1] > 0  # a hits a
    assert cached[2] == 0 and cached[3] == 0  # b and the base model start cold
    assert cached[4] > 0  # b hits b
    by_name = {a.name: a for a in adapters}
    for n, _, toks in runs:
        assert toks == solo(tiny_weights, prompt, by_name.get(n), p)
    namespaces = {node["namespace"] for node in e.scheduler.prefix_cache.snapshot()["nodes"][1:]}
    assert namespaces == {"a", "b", None}


def test_bad_adapters_and_requests_are_refused(tiny_weights, tmp_path):
    adapters = tiny_adapters(tiny_weights.config)
    e = lora_engine(tiny_weights, adapters[:1])
    with pytest.raises(ValueError, match="not registered"):
        e.add_request("hi", GREEDY, adapter="nope")
    with pytest.raises(ValueError, match="max_lora_rank"):
        e.register_adapter(random_adapter(tiny_weights.config, "big", 8))
    wrong = dataclasses.replace(tiny_weights.config, hidden_size=32, num_heads=2, head_dim=16, intermediate_size=64)
    with pytest.raises(ValueError, match="expected"):
        e.register_adapter(random_adapter(wrong, "other-model", 2))
    plain = LLMEngine(EngineConfig(), tiny_weights)
    with pytest.raises(ValueError, match="max_loras"):
        plain.add_request("hi", GREEDY, adapter="a")
    with pytest.raises(ValueError, match="max_loras"):
        EngineConfig(max_loras=2, spec_drafter="ngram")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="not a safetensors adapter"):
        load_adapter(bad)
    assert not e.sequences  # nothing was queued by the refused requests
    rid = e.add_request("hi", GREEDY, adapter="a")  # the engine still serves
    while e.has_work():
        e.step()
    assert len(e.result(rid).token_ids) == GREEDY.max_tokens


def test_adapter_file_round_trip(tiny_weights, tmp_path):
    a = random_adapter(tiny_weights.config, "round", 4, targets=("q", "down"), seed=5)
    save_adapter(a, tmp_path / "round.safetensors", dtype=torch.float32)
    b = load_adapter(tmp_path / "round.safetensors")
    assert (b.name, b.rank, b.alpha, b.targets) == (a.name, a.rank, a.alpha, a.targets)
    for key, (A, B) in a.weights.items():
        assert torch.equal(b.weights[key][0], A) and torch.equal(b.weights[key][1], B)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("acquire release".split()), st.sampled_from("abcde")), max_size=40))
def test_slots_never_evict_a_pinned_adapter(ops):
    from engine.weights import default_config
    from engine.tokenizer import default_tokenizer

    cfg = dataclasses.replace(default_config(default_tokenizer()), hidden_size=8, intermediate_size=16,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
    adapters = {n: random_adapter(cfg, n, 2, seed=i) for i, n in enumerate("abcde")}
    slots = AdapterSlots(cfg, 2, 2, torch.device("cpu"), torch.float32)
    held: dict[str, int] = {}
    for op, name in ops:
        if op == "acquire":
            before = {n: slots.slot_of(n) for n, k in held.items() if k > 0}
            got = slots.acquire(adapters[name])
            if got is None:
                assert name not in slots.resident and all(p > 0 for p in slots.pins)
                continue
            held[name] = held.get(name, 0) + 1
            assert slots.resident[got] == name
            assert all(slots.slot_of(n) == s for n, s in before.items())  # pinned adapters stayed put
        elif held.get(name):
            slots.release(name)
            held[name] -= 1
        assert sum(slots.pins) == sum(held.values())
        assert len([r for r in slots.resident if r is not None]) == len({r for r in slots.resident if r is not None})


def test_unmerged_real_model_matches_hugging_face_merged(real_weights, one_torch_thread):
    """The real model with a random rank-8 adapter on every linear, served unmerged by the engine next
    to base requests: the tokens Hugging Face generates from the merged checkpoint."""
    adapter = random_adapter(real_weights.config, "r8", 8, seed=4, std=0.03)
    e = LLMEngine(EngineConfig(max_loras=1, max_lora_rank=8), real_weights)
    e.register_adapter(adapter)
    msgs = [{"role": "user", "content": "Name three colours of the rainbow."}]
    params = SamplingParams(max_tokens=16)
    adapted = e.add_request(msgs, params, adapter="r8")
    base = e.add_request(msgs, params)
    while e.has_work():
        e.step()
    ids = e.tokenize(msgs)
    merged = merged_weights(real_weights, adapter)
    assert list(e.result(adapted).token_ids) == hf_greedy(merged, ids, 16)
    assert list(e.result(base).token_ids) == hf_greedy(real_weights, ids, 16)
    assert e.result(adapted).token_ids != e.result(base).token_ids
