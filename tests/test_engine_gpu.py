"""On a CUDA machine: the engine's greedy output with random weights is the same with our Triton
kernels as with the torch reference path, and with CUDA graphs on and off. (Skipped without CUDA.)"""
from __future__ import annotations

import pytest
import torch

from bench.workload import mixed_requests
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


def _outputs(weights, num_requests: int = 12, decode_batches: list[int] | None = None,
             **cfg) -> list[tuple[int, ...]]:
    """Greedy tokens of mixed requests; `decode_batches` collects the size of every decode-only step."""
    cfg = {"num_blocks": 512, "max_num_batched_tokens": 256, "max_model_len": 1024, **cfg}
    engine = LLMEngine(EngineConfig(weights="random", device="cuda", **cfg), weights)
    rids = [engine.add_request(list(r.prompt_ids), SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                               arrival_step=i % 5)
            for i, r in enumerate(mixed_requests(num_requests, seed=5, output_range=(4, 40)))]
    while engine.has_work():
        record = engine.step()
        if decode_batches is not None and record.num_prefill_tokens == 0 and record.num_decode_tokens:
            decode_batches.append(record.num_decode_tokens)
    return [engine.result(r).token_ids for r in rids]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_graphs_and_reference_agree(random_weights, dtype) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _outputs(random_weights, kernel_backend="torch", dtype=dtype)
    tri = _outputs(random_weights, kernel_backend="triton", dtype=dtype)
    graphs = _outputs(random_weights, kernel_backend="triton", dtype=dtype, cuda_graphs=True)
    assert graphs == tri
    # Unprofiled, prefill steps run as piecewise CUDA graphs (engine/piecewise_graphs.py); with the
    # decode graphs only, they run eagerly.
    piecewise = _outputs(random_weights, kernel_backend="triton", dtype=dtype, cuda_graphs=True, profile_kernels=False)
    decode_only = _outputs(random_weights, kernel_backend="triton", dtype=dtype, cuda_graphs=True,
                           profile_kernels=False, prefill_graphs=False)
    assert piecewise == decode_only == tri
    if dtype == "float32":
        assert tri == ref
    else:
        # bf16: another summation order can flip a near-tie argmax, after which the two runs see
        # different contexts. Demand a long common prefix in most sequences (exactness is fp32's test).
        def common(x, y):
            return next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
        agree = sum(common(x, y) for x, y in zip(tri, ref)) / sum(len(x) for x in ref)
        assert agree > 0.8, f"only {agree:.0%} of tokens before the first divergence"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_layers_replaying_attention_launches_change_nothing(random_weights, dtype) -> None:
    """Piecewise prefill steps in which layers 1.. replay layer 0's attention launches on their own
    tensors (kernels/launch_tape.py): fresh prompts (FA2; TMA loads in bf16), continuing chunks and
    decodes beside them (paged, split) give the same greedy tokens and, bitwise, the same KV pool
    as every layer launching through the wrappers, and the replays really happened."""
    def run(replay: bool):
        engine = LLMEngine(EngineConfig(weights="random", device="cuda", dtype=dtype, num_blocks=512,
                                        max_num_batched_tokens=256, max_model_len=1024, cuda_graphs=True,
                                        profile_kernels=False, replay_attention_launches=replay), random_weights)
        rids = [engine.add_request(list(r.prompt_ids), SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                                   arrival_step=i % 5)
                for i, r in enumerate(mixed_requests(12, seed=5, output_range=(4, 40)))]
        while engine.has_work():
            engine.step()
        return engine, [engine.result(r).token_ids for r in rids]

    replayed, tokens = run(True)
    launched, want = run(False)
    assert tokens == want
    assert torch.equal(replayed.pool.data, launched.pool.data)
    steps = replayed.counters["forward_passes"]
    assert replayed.model.piecewise.replayed_layers >= 29 * 3, steps
    assert launched.model.piecewise.replayed_layers == 0


def test_large_decode_batches_agree(random_weights) -> None:
    """64 requests under a 2,048-token bucket: as they finish, decode batches pass through the paged
    kernel's unsplit launch (B >= 55), its two-split launch merged in the kernel (B = 45-54) and
    many-split launches below (kernels/paged_attention_triton.py, v14). fp32 greedy tokens equal the
    torch reference path's, eager and with CUDA graphs and overlapped decode."""
    torch.backends.cuda.matmul.allow_tf32 = False
    # Every prompt prefilled within the first steps (a large token budget), so decode starts wide.
    kw = dict(num_requests=64, max_model_len=2048, num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=16384,
              dtype="float32")
    ref = _outputs(random_weights, kernel_backend="torch", **kw)
    sizes: list[int] = []
    tri = _outputs(random_weights, kernel_backend="triton", decode_batches=sizes, **kw)
    graphs = _outputs(random_weights, kernel_backend="triton", cuda_graphs=True, profile_kernels=False,
                      overlap_decode=True, **kw)
    assert any(b >= 55 for b in sizes) and any(45 <= b <= 54 for b in sizes) and any(b < 45 for b in sizes), sizes
    assert tri == ref
    assert graphs == tri


@pytest.mark.parametrize("drafter", ["draft_model", "medusa", "eagle"])
def test_trained_drafters_are_lossless_on_cuda(random_weights, drafter) -> None:
    """fp32 on the GPU with the Triton kernels (tree rounds use the torch tree-masked attention): a
    drafter changes how many passes run, never the greedy tokens."""
    from engine.speculative.heads import head_available

    if not head_available(drafter):
        pytest.skip(f"{drafter} weights not trained")
    torch.backends.cuda.matmul.allow_tf32 = False
    plain = _outputs(random_weights, kernel_backend="triton", dtype="float32")
    spec = _outputs(random_weights, kernel_backend="triton", dtype="float32", spec_drafter=drafter, spec_gamma=3,
                    spec_tree_nodes=16)
    assert spec == plain
    # Verification passes (tree or chain rows beside prefill chunks) through the piecewise prefill graphs.
    graphs = _outputs(random_weights, kernel_backend="triton", dtype="float32", spec_drafter=drafter, spec_gamma=3,
                      spec_tree_nodes=16, cuda_graphs=True, profile_kernels=False)
    assert graphs == plain


def _overlap_run(weights, reqs, params_for, **cfg):
    engine = LLMEngine(EngineConfig(weights="random", device="cuda", dtype="float32", max_num_batched_tokens=256,
                                    max_model_len=1024, cuda_graphs=True, profile_kernels=False, **cfg), weights)
    rids = [engine.add_request(list(r.prompt_ids), params_for(i, r), arrival_step=i % 5) for i, r in enumerate(reqs)]
    records = []
    while engine.has_work():
        records.append(engine.step())
    results = [engine.result(r) for r in rids]
    return [(r.token_ids, r.samples[0].finish_reason, r.text) for r in results], records, engine


@pytest.mark.parametrize("num_blocks", [512, 40])
def test_overlapped_decode_matches_synchronous(random_weights, num_blocks) -> None:
    """The same tokens, finish reasons and texts with overlap_decode on and off, for requests that
    stop on length, on an EOS the model really produces, on a stop string, or sample with a
    temperature (those steps run synchronously); 40 blocks force preemptions."""
    import dataclasses

    torch.backends.cuda.matmul.allow_tf32 = False
    reqs = mixed_requests(12, seed=5, output_range=(4, 40))
    base, _, _ = _overlap_run(random_weights, reqs, lambda i, r: SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                              num_blocks=512)
    eos = base[0][0][3]  # a token request 0 produces mid-answer becomes the end-of-sequence token
    weights = dataclasses.replace(random_weights, config=dataclasses.replace(random_weights.config, eos_token_ids=(eos,)))
    text = base[2][2]
    stop = text[len(text) // 2: len(text) // 2 + 2] or "e"

    def params(i: int, r) -> SamplingParams:
        if i % 4 == 1:
            return SamplingParams(max_tokens=r.max_tokens, temperature=0.8, seed=i)
        if i % 4 == 2:
            return SamplingParams(max_tokens=r.max_tokens, stop=(stop,))
        return SamplingParams(max_tokens=r.max_tokens)

    sync, sync_records, _ = _overlap_run(weights, reqs, params, num_blocks=num_blocks)
    over, over_records, engine = _overlap_run(weights, reqs, params, num_blocks=num_blocks, overlap_decode=True)
    assert over == sync
    assert any(reason == "eos" for _, reason, _ in over)
    assert [r.step for r in over_records] == list(range(len(over_records)))  # every step once, in order
    assert sum(len(r.emitted) for r in over_records) == sum(len(t) for t, _, _ in over)
    if num_blocks == 40:
        assert any(r.preempted for r in over_records)
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == num_blocks


def test_graph_replay_from_host_rows_matches_device_batch(random_weights) -> None:
    """The overlapped decode's fast path (`DecodeGraphRunner.replay_rows`: host lists through pinned
    staging) gives bitwise the logits of the general path (`run` on a ForwardBatch), with the input
    ids from the host, from a prefix of the previous argmax (the steady state) or gathered from it
    in another order beside host tokens (rows joined or left), for 5 rows (a padded bucket of 8)
    whose contexts cross block boundaries; repeated past the staging ring's length."""
    from engine.forward_batch import build_forward_batch

    engine = LLMEngine(EngineConfig(weights="random", device="cuda", dtype="float32", num_blocks=512,
                                    max_num_batched_tokens=2048, max_model_len=1024, cuda_graphs=True,
                                    profile_kernels=False), random_weights)
    for r in mixed_requests(5, seed=3):
        engine.add_request(list(r.prompt_ids), SamplingParams(max_tokens=64, ignore_eos=True))
    runner, bm = engine.graph_runner, engine.block_manager
    for _ in range(4):
        engine.step()  # the prompts, then a few decode steps
        # Each row recomputes its last stored token: the same KV rewritten, so every call agrees.
        seqs = list(engine.scheduler.running)
        assert len(seqs) == 5 and not any(s.in_prefill for s in seqs)
        pos = [s.num_computed_tokens - 1 for s in seqs]
        toks = [s.token_ids[p] for s, p in zip(seqs, pos)]
        slots = [bm.slots(s.seq_id, p, 1)[0] for s, p in zip(seqs, pos)]
        tables = [bm.tables[s.seq_id] for s in seqs]
        batch = build_forward_batch([], [([t], p, [sl], tb) for t, p, sl, tb in zip(toks, pos, slots, tables)],
                                    list(range(5)), engine.device)
        general = runner.run(batch).clone()
        host = runner.replay_rows(toks, pos, slots, tables).clone()
        prefix = runner.replay_rows([0] * 5, pos, slots, tables, gather=(batch.input_ids, list(range(5)))).clone()
        reversed_prev = batch.input_ids.flip(0)  # previous[4 - i] is row i's token
        gathered = runner.replay_rows([0, 0, toks[2], 0, 0], pos, slots, tables,
                                      gather=(reversed_prev, [4, 3, -1, 1, 0])).clone()
        assert torch.equal(host, general) and torch.equal(prefix, general) and torch.equal(gathered, general)
