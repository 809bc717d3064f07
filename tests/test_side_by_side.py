"""Serving the same requests on several engines: they arrive at the same moments everywhere (the
baseline's step starts), nobody computes a request before it arrived, and the tokens agree."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.disaggregated import DisaggregatedEngine
from engine.disaggregated.side_by_side import RequestInput, serve_side_by_side
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams

CFG = EngineConfig(block_size=8, num_blocks=64, max_model_len=256, max_num_batched_tokens=256, weights="random")


def test_arrivals_are_the_same_moments_on_every_engine(tiny_weights) -> None:  # noqa: ANN001
    requests = [RequestInput("chat", [{"role": "user", "content": "Tell me a story."}],
                             SamplingParams(max_tokens=16, ignore_eos=True)),
                RequestInput("long", "word " * 150, SamplingParams(max_tokens=4, ignore_eos=True), arrival_step=3),
                RequestInput("late", "Hi", SamplingParams(max_tokens=4, ignore_eos=True), arrival_step=9),
                RequestInput("bad", "Hi", SamplingParams(max_tokens=400))]  # longer than max_model_len: refused
    runs = serve_side_by_side(("one", LLMEngine(CFG, tiny_weights)),
                              {"chunked": LLMEngine(EngineConfig(**{**CFG.to_dict(), "max_num_batched_tokens": 32}),
                                                    tiny_weights),
                               "split": DisaggregatedEngine(CFG, tiny_weights)}, requests)
    base = runs["one"]
    assert base.arrival_times["chat"] == 0.0 and base.arrival_times["late"] > base.arrival_times["long"] > 0
    for run in runs.values():
        assert run.arrival_times == base.arrival_times
        assert any("bad" in e and "max_model_len" in e for e in run.errors)
        assert run.outputs == base.outputs
        for rid, times in run.token_times.items():
            assert len(times) == len(run.outputs[rid]) and times[0] >= run.arrival_times[rid]
            assert run.ttft(rid) > 0
    # The time-fed engine's steps never include a request before its moment: its prompt's first step starts
    # at or after it.
    chunked = runs["chunked"]
    first = next(i for i, r in enumerate(chunked.records) if any(s.request_id == "late" for s in r.batch))
    assert chunked.spans[first].start >= base.arrival_times["late"]


def test_a_warm_up_changes_no_time_and_no_token(tiny_weights) -> None:  # noqa: ANN001
    """After untimed warm-up requests the measured run counts steps and times from where each engine stood:
    arrivals come at the same relative step, and the tokens are those of cold engines."""
    requests = [RequestInput("a", "Tell me a story.", SamplingParams(max_tokens=6, ignore_eos=True)),
                RequestInput("b", "Hi there", SamplingParams(max_tokens=4, ignore_eos=True), arrival_step=2)]
    cold = serve_side_by_side(("one", LLMEngine(CFG, tiny_weights)), {"split": DisaggregatedEngine(CFG, tiny_weights)},
                              requests)
    warm = serve_side_by_side(("one", LLMEngine(CFG, tiny_weights)), {"split": DisaggregatedEngine(CFG, tiny_weights)},
                              requests, warmup_passes=2)
    for k in ("one", "split"):
        assert warm[k].outputs == cold[k].outputs
        assert set(warm[k].arrival_times) == {"a", "b"}
        assert warm[k].arrival_times["a"] == 0.0 < warm[k].arrival_times["b"]
        assert all(t[0] >= warm[k].arrival_times[rid] for rid, t in warm[k].token_times.items())
    assert len(warm["one"].records) == len(cold["one"].records)
