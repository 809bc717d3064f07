"""The load generator and SLO arithmetic (engine/serving_load): arrivals, lengths, TTFT/TPOT, attainment
and goodput, configuration checks; then real runs of the engine under load: the same tokens as plain
generation, no request served before it arrives, idle time skipped, queueing where the batch cap is small."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving_load import (SLO, WORKLOADS, LoadConfig, LoadRequest, LoadRun, RequestTiming, WorkloadSpec,
                                 arrivals, attainment, check_sweep, goodput_rate, make_requests, passes_after_miss,
                                 percentile, run_load, run_sweep)
from engine.serving_load.prompts import prompt_ids
from engine.serving_load.runner import engine_config

CPU = {"device": "cpu", "dtype": "float32", "weights": "random"}


# ---- workload ------------------------------------------------------------------------------------

def test_arrivals_are_poisson_shaped_and_scale_with_the_rate() -> None:
    one = arrivals(200, 1.0, seed=3)
    assert one[0] == 0.0 and np.all(np.diff(one) >= 0)
    assert np.allclose(arrivals(200, 4.0, seed=3), one / 4)  # the same draw, four times closer
    assert not np.allclose(arrivals(200, 1.0, seed=4), one)
    gaps = np.diff(arrivals(4000, 2.0, seed=0))
    assert gaps.mean() == pytest.approx(0.5, rel=0.06)  # exponential gaps of mean 1 / rate
    assert gaps.std() == pytest.approx(0.5, rel=0.1)  # ... whose spread equals their mean
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive number of requests per second"):
            arrivals(3, bad, seed=0)


def test_every_rate_sees_the_same_requests() -> None:
    spec = WORKLOADS["Chat (short prompts, longer answers)"]
    slow, fast = make_requests(spec, 0.5), make_requests(spec, 8.0)
    assert [(r.prompt_len, r.output_len) for r in slow] == [(r.prompt_len, r.output_len) for r in fast]
    assert [r.arrival_s for r in slow] == pytest.approx([16 * r.arrival_s for r in fast])
    assert all(spec.prompt_tokens[0] <= r.prompt_len <= spec.prompt_tokens[1] for r in slow)
    assert all(spec.output_tokens[0] <= r.output_len <= spec.output_tokens[1] for r in slow)
    assert make_requests(spec.with_requests(16, seed=1), 1.0) != make_requests(spec, 1.0)
    assert [r.request_id for r in slow[:3]] == ["q00", "q01", "q02"]


def test_the_mixed_workload_alternates_chat_and_rag() -> None:
    reqs = make_requests(WORKLOADS["Mixed (chat and RAG interleaved)"].with_requests(12), 1.0)
    chat, rag = reqs[0::2], reqs[1::2]
    assert max(r.prompt_len for r in chat) < min(r.prompt_len for r in rag)
    assert min(r.output_len for r in chat) >= max(r.output_len for r in rag)


def test_workload_spec_rejects_impossible_ranges() -> None:
    with pytest.raises(ValueError, match="number of requests"):
        WorkloadSpec("x", 0, (1, 2), (1, 2))
    with pytest.raises(ValueError, match="prompt lengths"):
        WorkloadSpec("x", 2, (5, 2), (1, 2))
    with pytest.raises(ValueError, match="output lengths"):
        WorkloadSpec("x", 2, (1, 2), (0, 2))


def test_prompts_have_the_asked_length_and_different_starts(random_weights) -> None:  # noqa: ANN001
    tok = random_weights.tokenizer
    a, b = prompt_ids(tok, 300, 0), prompt_ids(tok, 300, 1)
    assert len(a) == len(b) == 300 and a[:8] != b[:8]
    assert len(prompt_ids(tok, 5000, 2)) == 5000  # longer than the corpus: it wraps around
    with pytest.raises(ValueError):
        prompt_ids(tok, 0, 0)


# ---- SLO arithmetic ------------------------------------------------------------------------------

def _timing(arrival: float, admitted: float, first: float, finish: float, tokens: int) -> RequestTiming:
    return RequestTiming("q", arrival, admitted, first, finish, 10, tokens)


def test_ttft_counts_the_queue_and_tpot_the_gaps_after_the_first_token() -> None:
    t = _timing(1.0, 1.5, 1.75, 2.75, 11)
    assert (t.queue_s, t.ttft_s, t.e2e_s) == (0.5, 0.75, 1.75)
    assert t.tpot_s == pytest.approx(0.1)
    assert _timing(0, 0, 1, 1, 1).tpot_s == 0.0  # one token: no pace to keep
    slo = SLO(ttft_s=0.8, tpot_s=0.1)
    assert t.meets(slo) and not t.meets(SLO(0.7, 0.1)) and not t.meets(SLO(0.8, 0.09))
    assert attainment([t, _timing(0, 0, 2, 3, 2)], slo) == 0.5 and attainment([], slo) == 0.0


def test_goodput_is_the_last_rate_before_the_first_miss() -> None:
    assert goodput_rate([(1, 1.0), (2, 0.95), (4, 0.5)], 0.9) == 2
    assert goodput_rate([(4, 0.5), (1, 1.0), (2, 0.95)], 0.9) == 2  # order of the input does not matter
    assert goodput_rate([(1, 1.0), (2, 0.8), (4, 0.95)], 0.9) == 1  # a lucky pass above a miss is not capacity
    assert goodput_rate([(1, 0.5)], 0.9) is None
    assert goodput_rate([(1, 0.9)], 0.9) == 1
    # The passes the rule does not count, which the page names.
    assert passes_after_miss([(4, 0.95), (1, 1.0), (2, 0.8), (8, 1.0)], 0.9) == [4, 8]
    assert passes_after_miss([(1, 1.0), (2, 0.95), (4, 0.5)], 0.9) == [] == passes_after_miss([], 0.9)


@pytest.mark.parametrize("kwargs, match", [(dict(ttft_s=0, tpot_s=1), "TTFT target"),
                                           (dict(ttft_s=1, tpot_s=float("nan")), "TPOT target"),
                                           (dict(ttft_s=1, tpot_s=1, goal=0), "attainment goal"),
                                           (dict(ttft_s=1, tpot_s=1, goal=1.5), "attainment goal")])
def test_slo_rejects_meaningless_targets(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SLO(**kwargs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40), st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50))


# ---- configurations ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(label=" "), "needs a name"), (dict(label="a", max_num_seqs=0), "batch cap"),
    (dict(label="a", max_num_seqs=True), "batch cap"), (dict(label="a", max_num_batched_tokens=8), "token budget"),
    (dict(label="a", output_cap=-1), "output cap"), (dict(label="a", chunked_prefill=1), "chunked prefill")])
def test_load_config_rejects_bad_knobs(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoadConfig(**kwargs)


def test_unchunked_configs_must_hold_the_longest_prompt_in_one_step() -> None:
    reqs = (LoadRequest(0, 0.0, 300, 20), LoadRequest(1, 0.1, 40, 50))
    LoadConfig("chunked", 4, 64).check_fits(reqs)
    LoadConfig("whole", 4, 320, chunked_prefill=False).check_fits(reqs)
    with pytest.raises(ValueError, match=r"longest prompt and its answer \(320 tokens\), but it is 256"):
        LoadConfig("small", 4, 256, chunked_prefill=False).check_fits(reqs)
    capped = LoadConfig("capped", 4, 310, chunked_prefill=False, output_cap=10)
    capped.check_fits(reqs)  # the cap shortens what must fit
    assert [capped.max_tokens(r) for r in reqs] == [10, 10]


def test_the_pool_holds_a_full_batch_of_the_longest_requests() -> None:
    reqs = (LoadRequest(0, 0.0, 100, 30), LoadRequest(1, 0.0, 20, 10))
    cfg = engine_config(LoadConfig("a", 3, 64), reqs, CPU)
    assert cfg.num_blocks >= 3 * math.ceil(130 / cfg.block_size)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.profile_kernels) == (3, 64, False)
    assert not cfg.cuda_graphs and cfg.device == "cpu"


def test_sweep_settings_are_checked_before_any_compute() -> None:
    a = LoadConfig("a")
    assert check_sweep([a], [4, 1, 2, 2]) == (1.0, 2.0, 4.0)
    for configs, rates, match in (([], [1], "at least one configuration"), ([a] * 2, [1], "different"),
                                  ([a], [], "at least one request rate"), ([a], [0], r"\(0, 1000\]"),
                                  ([a], range(1, 8), "at most 6"),
                                  ([LoadConfig(str(i)) for i in range(5)], [1], "at most 4")):
        with pytest.raises(ValueError, match=match):
            check_sweep(configs, rates)


# ---- the engine under load -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat(tiny_weights):  # noqa: ANN001, ANN201
    spec = WorkloadSpec("chat", 8, (8, 40), (3, 9), seed=5)
    return tiny_weights, spec


def test_tokens_under_load_are_the_tokens_of_plain_generation(chat) -> None:  # noqa: ANN001
    weights, spec = chat
    reqs = make_requests(spec, 50.0)
    run = run_load(weights, CPU, LoadConfig("cap 3, budget 16", 3, 16), reqs, 50.0)
    engine = LLMEngine(EngineConfig(num_blocks=128), weights)
    for r, out in zip(reqs, run.outputs):
        ref = engine.generate([prompt_ids(weights.tokenizer, r.prompt_len, r.index)],
                              SamplingParams(max_tokens=r.output_len, ignore_eos=True))[0]
        assert out == ref.samples[0].token_ids, r.request_id
    assert run.output_tokens == sum(r.output_len for r in reqs)


def test_no_request_is_served_before_it_arrives_and_steps_do_not_overlap(chat) -> None:  # noqa: ANN001
    weights, spec = chat
    run = run_load(weights, CPU, LoadConfig("a", 2, 32), make_requests(spec, 20.0), 20.0)
    for t in run.timings:
        assert t.arrival_s <= t.admitted_s < t.first_token_s <= t.finish_s
    for a, b in zip(run.steps, run.steps[1:]):
        assert b.start_s >= a.start_s + a.seconds - 1e-9
    assert max(s.num_seqs for s in run.steps) <= 2
    assert all(s.prefill_tokens + s.decode_tokens <= 32 for s in run.steps)


def test_idle_time_is_skipped_not_waited(chat) -> None:  # noqa: ANN001
    """At 0.01 requests per second the requests are minutes apart on engine time, yet the run takes
    only its steps' time, and the engine is busy a sliver of the span."""
    weights, spec = chat
    reqs = make_requests(spec.with_requests(3, seed=5), 0.01)
    import time
    t0 = time.perf_counter()
    run = run_load(weights, CPU, LoadConfig("a", 4, 64), reqs, 0.01)
    wall = time.perf_counter() - t0
    assert run.makespan_s > 60 and wall < 30
    assert run.busy_share < 0.05
    assert all(t.queue_s < 1e-9 for t in run.timings)  # each found an idle engine


def _steps_waited(run: LoadRun) -> int:
    return sum(sum(1 for s in run.steps if t.arrival_s <= s.start_s < t.admitted_s) for t in run.timings)


def test_a_small_batch_cap_makes_requests_queue(chat) -> None:  # noqa: ANN001
    weights, spec = chat
    burst = make_requests(spec, 1000.0)
    one = run_load(weights, CPU, LoadConfig("one", 1, 64), burst, 1000.0)
    eight = run_load(weights, CPU, LoadConfig("eight", 8, 512), burst, 1000.0)
    # Queueing counted in engine steps each request waited between arrival and admission: the seconds of a
    # tiny model's steps on a shared CI box are noise (a slow first step of the batch-8 run once made its
    # queue seconds half of the batch-1 run's), the steps it waited are the scheduler's doing.
    assert _steps_waited(one) > 3 * _steps_waited(eight)
    assert sum(t.queue_s for t in one.timings) > sum(t.queue_s for t in eight.timings)
    assert len(one.steps) > len(eight.steps)
    assert one.outputs == eight.outputs


def test_output_cap_shortens_answers(chat) -> None:  # noqa: ANN001
    weights, spec = chat
    reqs = make_requests(spec, 5.0)
    run = run_load(weights, CPU, LoadConfig("cap", 4, 64, output_cap=2), reqs, 5.0)
    assert [t.output_tokens for t in run.timings] == [min(2, r.output_len) for r in reqs]


def test_a_sweep_runs_every_configuration_at_every_rate(chat) -> None:  # noqa: ANN001
    weights, spec = chat
    configs = [LoadConfig("one", 1, 64), LoadConfig("four", 4, 64)]
    seen: list[float] = []
    result = run_sweep(weights, CPU, configs, spec.with_requests(4, seed=5), [200.0, 5.0],
                       progress=lambda share, what: seen.append(share))
    assert result.rates == (5.0, 200.0) and len(result.runs) == 4
    assert [(r.config.label, r.rate) for r in result.runs] == [("one", 5.0), ("four", 5.0), ("one", 200.0),
                                                               ("four", 200.0)]
    assert seen == sorted(seen) and seen[-1] == 1.0
    loose = SLO(ttft_s=1e6, tpot_s=1e6)
    # Both meet every target at every rate: a tie, named in the sweep's order.
    assert result.goodput("one", loose) == 200.0 and result.leaders(loose) == ("one", "four")
    assert result.goodput("one", SLO(ttft_s=1e-9, tpot_s=1e-9)) is None
    assert result.leaders(SLO(ttft_s=1e-9, tpot_s=1e-9)) == ()
    with pytest.raises(KeyError):
        result.run("two", 5.0)
    with pytest.raises(ValueError, match="longest prompt"):
        run_sweep(weights, CPU, [LoadConfig("x", 2, 16, chunked_prefill=False)], spec, [1.0])


def test_the_real_model_under_load_writes_what_it_writes_alone(real_weights) -> None:  # noqa: ANN001
    reqs = make_requests(WorkloadSpec("chat", 3, (12, 30), (4, 6), seed=1), 100.0)
    run = run_load(real_weights, {**CPU, "weights": "real"}, LoadConfig("a", 2, 24), reqs, 100.0)
    engine = LLMEngine(EngineConfig(num_blocks=64), real_weights)
    prompts = [prompt_ids(real_weights.tokenizer, r.prompt_len, r.index) for r in reqs]
    alone = engine.generate(prompts, [SamplingParams(max_tokens=r.output_len, ignore_eos=True) for r in reqs])
    assert list(run.outputs) == [g.samples[0].token_ids for g in alone]
    assert "CPU" in run.backend


def test_a_reused_engine_serves_run_after_run_on_its_own_clock(chat) -> None:  # noqa: ANN001
    from engine.serving_load.runner import new_engine
    weights, spec = chat
    config = LoadConfig("a", 3, 32)
    fast, slow = make_requests(spec, 100.0), make_requests(spec, 10.0)
    engine = new_engine(weights, CPU, config, fast)
    first = run_load(weights, CPU, config, fast, 100.0, engine=engine)
    assert engine.clock > 0
    second = run_load(weights, CPU, config, slow, 10.0, engine=engine)  # same ids, same engine: no clash
    assert first.outputs == second.outputs == run_load(weights, CPU, config, slow, 10.0).outputs
    assert second.timings[0].arrival_s == 0.0 and second.steps[0].start_s == pytest.approx(0.0, abs=1e-9)
    assert second.capture_s == 0.0  # no CUDA graphs on the CPU
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="still has requests"):
        run_load(weights, CPU, config, slow, 10.0, engine=engine)
