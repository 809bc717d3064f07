"""On a CUDA machine: the load generator drives the engine with Triton kernels and CUDA graphs, and the
tokens under load are the tokens of plain generation on the same engine settings. (Skipped without CUDA.)"""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving_load import SLO, LoadConfig, WorkloadSpec, make_requests, run_load, run_sweep
from engine.serving_load.prompts import prompt_ids

pytestmark = pytest.mark.gpu
GPU = {"device": "cuda", "dtype": "bfloat16", "weights": "random"}


def test_load_on_the_gpu_keeps_the_tokens_of_plain_generation(random_weights) -> None:  # noqa: ANN001
    """In fp32: in bf16 another batch composition sums in another order and may flip a near-tie (the engine's
    own GPU tests accept that there; exactness is fp32's test)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    reqs = make_requests(WorkloadSpec("mixed", 16, (24, 512), (6, 40), seed=3), 200.0)
    run = run_load(random_weights, {**GPU, "dtype": "float32"}, LoadConfig("cap 8, budget 128", 8, 128), reqs, 200.0)
    assert "triton" in run.backend.lower()
    engine = LLMEngine(EngineConfig(device="cuda", dtype="float32", weights="random", num_blocks=1024,
                                    max_num_seqs=16), random_weights)
    alone = engine.generate([prompt_ids(random_weights.tokenizer, r.prompt_len, r.index) for r in reqs],
                            [SamplingParams(max_tokens=r.output_len, ignore_eos=True) for r in reqs])
    assert list(run.outputs) == [g.samples[0].token_ids for g in alone]
    for t in run.timings:
        assert t.arrival_s <= t.admitted_s < t.first_token_s <= t.finish_s


def test_a_gpu_sweep_has_millisecond_steps(random_weights) -> None:  # noqa: ANN001
    configs = [LoadConfig("batch cap 2", 2, 256), LoadConfig("batch cap 16", 16, 256)]
    result = run_sweep(random_weights, GPU, configs, WorkloadSpec("chat", 32, (24, 96), (12, 32), seed=0),
                       [20.0, 200.0])
    decode = sorted(s.seconds for r in result.runs for s in r.steps if s.prefill_tokens == 0)
    assert decode[len(decode) // 2] < 0.01  # CUDA graphs: a decode step is milliseconds, not the CPU's ~50
    slo = SLO(ttft_s=0.1, tpot_s=0.01)
    # At 200 req/s a batch cap of 2 queues far more than 16 does.
    queue = {c.label: sum(t.queue_s for t in result.run(c.label, 200.0).timings) for c in configs}
    assert queue["batch cap 2"] > 3 * queue["batch cap 16"]
    assert result.run("batch cap 16", 20.0).attainment(slo) >= result.run("batch cap 2", 200.0).attainment(slo)
