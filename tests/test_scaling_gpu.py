"""On a CUDA machine: test-time compute on our Triton kernels. Budget forcing writes the answer cue into
sequences that are decoding beside others, so the next step computes it as a small chunk among decode
rows; the tokens are the same with the Triton kernels, the torch reference and CUDA graphs (fp32), the
log-probs agree, forced positions carry none, and every block comes back. (Skipped without CUDA.)"""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.test_time import BudgetForcing, TestTimeEngine

pytestmark = pytest.mark.gpu

BUDGET = BudgetForcing(min_thinking=0, max_thinking=20, answer_tokens=4)


def _run(weights, **cfg):  # noqa: ANN001, ANN202
    engine = TestTimeEngine(EngineConfig(weights="random", device="cuda", dtype="float32", num_blocks=256,
                                         max_num_batched_tokens=256, max_model_len=512, **cfg), weights, budget=BUDGET)
    rids = [engine.add_request(f"Question {i}: what is {i} plus {2 * i}?", SamplingParams(max_tokens=8),
                               arrival_step=i) for i in range(6)]
    sampled = engine.add_request("Pick a number.", SamplingParams(max_tokens=8, temperature=0.9, seed=3, n=3),
                                 arrival_step=2)
    while engine.has_work():
        engine.step()
    assert engine.engine.block_manager.num_free_blocks == 256
    greedy = [engine.engine.result(r).samples[0] for r in rids]
    return engine, greedy, engine.engine.result(sampled).samples


def test_budget_forcing_on_triton_kernels_and_graphs(random_weights) -> None:  # noqa: ANN001
    torch.backends.cuda.matmul.allow_tf32 = False
    engine, tri, tri_sampled = _run(random_weights, kernel_backend="triton")
    _, ref, _ = _run(random_weights, kernel_backend="torch")
    _, graphs, graphs_sampled = _run(random_weights, kernel_backend="triton", cuda_graphs=True)
    cue = tuple(engine.tokenizer.encode(BUDGET.cue_text))
    for t, r, g in zip(tri, ref, graphs):
        assert t.token_ids == r.token_ids == g.token_ids
        # The cue was forced at the thinking cap (random weights never end a turn by themselves).
        assert t.token_ids[BUDGET.max_thinking:BUDGET.max_thinking + len(cue)] == cue
        forced = [i for i, lp in enumerate(t.logprobs) if lp is None]
        assert forced == [i for i, lp in enumerate(r.logprobs) if lp is None] and len(forced) >= len(cue)
        assert [lp for lp in t.logprobs if lp is not None] == pytest.approx(
            [lp for lp in r.logprobs if lp is not None], abs=1e-3)
    assert [s.token_ids for s in tri_sampled] == [s.token_ids for s in graphs_sampled]
    assert len({s.token_ids for s in tri_sampled}) > 1  # three different samples of one prompt
