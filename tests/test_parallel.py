"""Tensor and pipeline parallelism on the real model: the sharded model writes the single model's tokens, the
shards hold exactly the weights, a step's collectives are the ones counted, the pipeline schedule keeps its
dependencies; and the expert-parallel arithmetic."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.parallel.collectives import all_gather_bytes, ring_all_reduce_bytes
from engine.parallel.expert_math import MOE_MODELS, ep_cost, routing_imbalance
from engine.parallel.generate import generate
from engine.parallel import lab as parallel_lab
from engine.parallel.lab import ParallelSettings, run_parallel_lab
from engine.parallel.pipeline import PipelineRun, StageTask, run_pipeline, schedule, summarize
from engine.parallel.plan import check_degrees, stage_layers, tp_options
from engine.parallel.tensor_parallel import TensorParallelModel, shard_weights
from engine.sampling_params import SamplingParams


# ---- which degrees ---------------------------------------------------------------------------------

def test_smollm2_splits_over_one_or_three_ranks_only(random_weights) -> None:  # noqa: ANN001
    cfg = random_weights.config
    assert [c.degree for c in tp_options(cfg) if c.ok] == [1, 3]
    with pytest.raises(ValueError, match="9 query heads do not split evenly over 2 ranks.*3 KV heads.*work for it: 1, 3"):
        check_degrees(cfg, 2, 1)
    with pytest.raises(ValueError, match="pipeline-parallel degree must be 1 to 6"):
        check_degrees(cfg, 1, 7)


@given(st.integers(1, 60), st.integers(1, 6))
def test_stages_cover_the_layers_in_order_and_differ_by_at_most_one(layers: int, pp: int) -> None:
    pp = min(pp, layers)
    stages = stage_layers(layers, pp)
    assert [i for r in stages for i in r] == list(range(layers))
    assert max(map(len, stages)) - min(map(len, stages)) <= 1 and all(len(r) for r in stages)


# ---- shards -----------------------------------------------------------------------------------------

def test_shards_hold_exactly_the_weights(tiny_weights) -> None:  # noqa: ANN001
    cfg, sd = tiny_weights.config, tiny_weights.state_dict
    shards = shard_weights(cfg, sd, 2)
    for i in range(cfg.num_layers):
        w = lambda name: sd[f"model.layers.{i}.{name}.weight"]  # noqa: E731
        layer = [s.layers[i] for s in shards]
        for name, key, dim in (("q", "self_attn.q_proj", 0), ("k", "self_attn.k_proj", 0), ("v", "self_attn.v_proj", 0),
                               ("o", "self_attn.o_proj", 1), ("gate", "mlp.gate_proj", 0), ("up", "mlp.up_proj", 0),
                               ("down", "mlp.down_proj", 1)):
            assert torch.equal(torch.cat([x[name] for x in layer], dim), w(key)), name
    assert torch.equal(torch.cat([s.embed for s in shards]), sd["model.embed_tokens.weight"])
    # heads travel whole: rank r has query heads r*H/tp.. and the KV heads they read
    assert [list(s.heads) for s in shards] == [[0, 1], [2, 3]] and [list(s.kv_heads) for s in shards] == [[0], [1]]


def test_each_rank_holds_a_third_of_the_weights_and_cache(random_weights) -> None:  # noqa: ANN001
    cfg = random_weights.config
    full = TensorParallelModel(cfg, random_weights.state_dict, 1, 64)
    tp3 = TensorParallelModel(cfg, random_weights.state_dict, 3, 64)
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size * 4  # replicated on every rank
    assert tp3.shards[0].nbytes * 3 == pytest.approx(full.shards[0].nbytes + 2 * norms)
    assert all(c.nbytes * 3 == full.new_caches(2)[0].nbytes for c in tp3.new_caches(2))


# ---- the sharded model writes the same tokens ------------------------------------------------------------

def test_three_ranks_write_the_single_models_and_the_engines_tokens(real_weights, one_torch_thread) -> None:  # noqa: ANN001
    """Greedy, the real model: 3 ranks with their all-reduces = 1 rank = the paged engine (itself checked against
    Hugging Face in test_engine_exactness.py). The logits agree, compared in fp64: the partial sums add in
    another order, and in fp32 that rounding reaches a third of a 1e-4 tolerance on one CPU (and more on another,
    as it did for the latent cache's twin check); in fp64 it is far below 1e-8."""
    w = real_weights
    ids = w.tokenizer.chat_prompt_ids("Name two planets and one fact about each.")
    one, three = (TensorParallelModel(w.config, w.state_dict, tp, 256) for tp in (1, 3))
    g1 = generate(one, [ids], 24, w.config.eos_token_ids)
    g3 = generate(three, [ids], 24, w.config.eos_token_ids)
    assert g1.tokens == g3.tokens
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    engine = LLMEngine(EngineConfig(), weights=w)
    [res] = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=24))
    assert tuple(res.token_ids) == g1.tokens[0][:len(res.token_ids)]
    one, three = (TensorParallelModel(w.config, w.state_dict, tp, 256, dtype=torch.float64) for tp in (1, 3))
    x = torch.tensor([ids])
    logits = [m.forward(x, 0, m.new_caches(1)) for m in (one, three)]
    assert logits[0].dtype == torch.float64 and torch.allclose(*logits, rtol=1e-8, atol=1e-8)


def test_a_batch_and_a_tiny_model_on_two_ranks(tiny_weights) -> None:  # noqa: ANN001
    w = tiny_weights
    prompts = [w.tokenizer.encode("one two three"), w.tokenizer.encode("four five six")]
    prompts = [p[:3] for p in prompts]
    out = [generate(TensorParallelModel(w.config, w.state_dict, tp, 64), prompts, 10).tokens for tp in (1, 2)]
    assert out[0] == out[1] and len(out[0]) == 2


def test_a_decode_step_makes_two_all_reduces_per_layer_an_embedding_one_and_a_logits_gather(tiny_weights) -> None:  # noqa: ANN001
    w = tiny_weights
    g = generate(TensorParallelModel(w.config, w.state_dict, 2, 64), [[5, 6, 7]], 4)
    kinds = [k for k, _site, _b in g.collective_sites]
    assert kinds == ["all_reduce"] * (1 + 2 * w.config.num_layers) + ["all_gather"]
    hidden_bytes, vocab_bytes = w.config.hidden_size * 2, w.config.vocab_size * 2
    step = g.steps[1]
    assert step.collectives == 2 * w.config.num_layers + 2
    assert step.sent_bytes_per_rank == pytest.approx((1 + 2 * w.config.num_layers) * ring_all_reduce_bytes(hidden_bytes, 2)
                                                     + all_gather_bytes(vocab_bytes, 2))
    assert step.critical_seconds <= step.serial_seconds
    one = generate(TensorParallelModel(w.config, w.state_dict, 1, 64), [[5, 6, 7]], 4)
    assert one.steps[1].collectives == 0 and one.steps[1].sent_bytes_per_rank == 0


def test_ring_formulas() -> None:
    assert ring_all_reduce_bytes(1000, 1) == 0 and ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(900, 3) == pytest.approx(1200) and all_gather_bytes(900, 3) == pytest.approx(600)


# ---- pipeline -----------------------------------------------------------------------------------------

def test_the_pipeline_writes_each_requests_own_tokens(tiny_weights) -> None:  # noqa: ANN001
    w = tiny_weights
    cfg = dataclasses.replace(w.config)
    model = TensorParallelModel(cfg, w.state_dict, 1, 64)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    run = run_pipeline(model, prompts, 6, 2)
    alone = [generate(model, [p], 6).tokens[0] for p in prompts]
    assert list(run.tokens) == alone
    assert run.stages == ((0, 1), (1, 2))
    assert len(run.tasks) == 3 * 6 * 2 and all(t.seconds > 0 for t in run.tasks)


tasks_strategy = st.lists(st.lists(st.floats(1e-4, 1e-2), min_size=1, max_size=4), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), tasks_strategy, st.floats(0, 1e-3))
def test_the_schedule_keeps_every_dependency_and_one_task_per_device(pp: int, steps: list[list[float]],
                                                                     hop: float) -> None:
    """Request m's step t takes steps[m][t] on every stage. No device runs two tasks at once; a stage starts after
    the previous stage finished (plus the hop), a step after the request's previous step left the last stage."""
    tasks = tuple(StageTask(m, t, s, secs, 0) for m, row in enumerate(steps) for t, secs in enumerate(row)
                  for s in range(pp))
    run = PipelineRun(pp, tuple((s, s + 1) for s in range(pp)), tasks, tuple(() for _ in steps))
    placed = schedule(run, hop)
    at = {(p.micro, p.step, p.stage): p for p in placed}
    assert len(at) == len(tasks)
    for s in range(pp):
        mine = sorted((p for p in placed if p.stage == s), key=lambda p: p.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))
    for (m, t, s), p in at.items():
        if s:
            assert p.start >= at[(m, t, s - 1)].end + hop - 1e-12
        elif t:
            assert p.start >= at[(m, t - 1, pp - 1)].end - 1e-12
    summary = summarize(run, placed)
    assert summary.makespan <= summary.one_device + len(tasks) * hop + 1e-9
    assert 0 <= summary.bubble < 1
    if pp == 1:
        assert summary.makespan == pytest.approx(summary.one_device) and summary.bubble == pytest.approx(0, abs=1e-9)


# ---- the lab ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (dict(prompt="  "), "the prompt is empty"),
    (dict(prompt="x" * 2001), "at most 2000"),
    (dict(max_new_tokens=0), "tokens to generate must be 1 to"),
    (dict(tp=2), "cannot run tensor-parallel over 2 ranks"),
    (dict(pp=9), "pipeline-parallel degree"),
    (dict(micro_batches=0), "requests in the pipeline"),
])
def test_bad_settings_say_what_is_wrong(random_weights, bad: dict, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        ParallelSettings(**bad).check(random_weights.config)


def test_the_lab_on_random_weights(random_weights, one_torch_thread) -> None:  # noqa: ANN001
    r = run_parallel_lab(random_weights, ParallelSettings(max_new_tokens=4, micro_batches=3, pipeline_tokens=3))
    assert r.same_tokens and r.sharded.tp == 3 and len(r.pipeline.tokens) == 3
    assert r.pipeline_summary().makespan < r.pipeline_summary().one_device


def test_the_prefill_cost_is_the_median_of_several_passes(tiny_weights, monkeypatch) -> None:  # noqa: ANN001
    """One prefill pass on a shared CPU can take twice the others: the lab keeps the median pass's cost (and
    the generation's tokens and decode steps as they were)."""
    model = TensorParallelModel(tiny_weights.config, tiny_weights.state_dict, 2, 64)
    gen = generate(model, [[1, 2, 3]], 3)
    cost = lambda seconds: dataclasses.replace(gen.steps[0], rank_seconds=(seconds / 2, seconds / 2))  # noqa: E731
    extra = iter([cost(0.5), cost(0.2)])
    monkeypatch.setattr(parallel_lab, "generate", lambda *_a, **_k: dataclasses.replace(gen, steps=(next(extra),)))
    out = parallel_lab._median_prefill(model, [1, 2, 3], dataclasses.replace(gen, steps=(cost(0.9), *gen.steps[1:])))
    assert parallel_lab.PREFILL_TIMINGS == 3
    assert out.steps[0].serial_seconds == pytest.approx(0.5)
    assert out.steps[1:] == gen.steps[1:] and out.tokens == gen.tokens


# ---- expert parallelism (arithmetic) ------------------------------------------------------------------------

def test_expert_arithmetic() -> None:
    mixtral = MOE_MODELS[0]
    assert mixtral.expert_params == 32 * 8 * 3 * 4096 * 14336  # 45.1 B of the published 46.7 B
    c = ep_cost(mixtral, 8)
    assert c.weight_gb_per_gpu_tp == pytest.approx(46.7 / 8)
    assert c.weight_gb_per_gpu_ep > c.weight_gb_per_gpu_tp  # attention and embeddings replicated under EP
    assert c.a2a_bytes_per_token == pytest.approx(2 * 2 * 7 / 8 * 4096 * 2)
    even = routing_imbalance(64, 256, 8, 8)
    assert 1 < even.ratio < 1.5
    assert routing_imbalance(4096, 256, 8, 8).ratio < even.ratio  # more tokens average out
    assert routing_imbalance(64, 256, 8, 8, skew=1.0).ratio > 2 * even.ratio


def test_two_processes_over_gloo_write_the_in_process_tokens(tiny_weights) -> None:  # noqa: ANN001
    """Real processes, one rank each, the all-reduces through torch.distributed (gloo): the tokens of the ranks
    taking turns in one process, and every collective of a step timed on the wire."""
    from engine.parallel.distributed import run_distributed
    w = tiny_weights
    prompt = [5, 6, 7, 8]
    here = generate(TensorParallelModel(w.config, w.state_dict, 2, 64), [prompt], 8).tokens[0]
    run = run_distributed((w.config, w.state_dict), 2, prompt, 8, max_len=64)
    assert run.tokens == here and len(run.wire_seconds) == len(run.tokens)
    assert run.collectives_per_step == 2 * w.config.num_layers + 2
    assert all(s > 0 for s in run.wire_seconds) and all(s > 0 for s in run.compute_seconds)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tensor_and_pipeline_parallel_on_a_gpu(random_weights) -> None:  # noqa: ANN001
    """The shards on a GPU (the placement a process of an NCCL group uses, here all ranks on one GPU): fp32 gives the
    one-rank tokens; bf16 logits agree with one rank's to bf16 rounding; the pipeline on the GPU too."""
    w, ids = random_weights, list(range(5, 45))
    models = {(tp, dt): TensorParallelModel(w.config, w.state_dict, tp, 128, device="cuda", dtype=dt)
              for tp in (1, 3) for dt in (torch.float32, torch.bfloat16)}
    x = torch.tensor([ids], device="cuda")
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        one, three = models[(1, dt)], models[(3, dt)]
        l1, l3 = one.forward(x, 0, one.new_caches(1)).float(), three.forward(x, 0, three.new_caches(1)).float()
        assert l3.device.type == "cuda" and (l1 - l3).abs().max() <= tol * l1.abs().max(), (dt, (l1 - l3).abs().max())
    one, three = models[(1, torch.float32)], models[(3, torch.float32)]
    assert generate(one, [ids], 12).tokens == generate(three, [ids], 12).tokens
    run = run_pipeline(one, [ids, ids[:20]], 4, 3)
    assert list(run.tokens) == [generate(one, [p], 4).tokens[0] for p in (ids, ids[:20])]
