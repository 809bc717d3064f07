"""On a CUDA machine: constrained decoding on our Triton kernels. The grammar's mask is applied to logits on
the GPU, jump-forward text is computed as chunks among decode rows, and a batch of constrained and free
requests gives the same tokens with the Triton kernels, the torch reference and CUDA graphs (fp32); every
finished constrained sample is valid and every block comes back. (Skipped without CUDA.)"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import EngineConfig
from engine.constrained import ConstrainedEngine, accepts
from engine.constrained.presets import PRESETS
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


def _run(weights, **cfg):  # noqa: ANN001, ANN202
    engine = ConstrainedEngine(EngineConfig(weights="random", device="cuda", dtype="float32", num_blocks=256,
                                            max_num_batched_tokens=256, max_model_len=512, **cfg), weights)
    rids = []
    for i, p in enumerate(PRESETS):
        rids.append(engine.add_request(p.prompt, SamplingParams(max_tokens=24), arrival_step=i, constraint=p.constraint))
        compact = dataclasses.replace(p.constraint, json_layout="compact")
        rids.append(engine.add_request(p.prompt, SamplingParams(max_tokens=24, temperature=0.9, seed=i, n=2),
                                       arrival_step=i, constraint=compact))
    rids.append(engine.add_request("Free text beside them.", SamplingParams(max_tokens=16), constraint=None))
    while engine.has_work():
        engine.step()
    assert engine.engine.block_manager.num_free_blocks == 256
    return engine, [[s.token_ids for s in engine.engine.result(r).samples] for r in rids]


def test_constrained_batches_on_triton_kernels_and_graphs(random_weights) -> None:  # noqa: ANN001
    torch.backends.cuda.matmul.allow_tf32 = False
    engine, tri = _run(random_weights, kernel_backend="triton")
    _, ref = _run(random_weights, kernel_backend="torch")
    _, graphs = _run(random_weights, kernel_backend="triton", cuda_graphs=True)
    assert tri == ref == graphs
    forced = sum(e.kind == "forced" for events in engine.events.values() for e in events)
    assert forced > 0  # jump-forward chunks ran among the decode rows
    for seq in engine.engine.sequences:
        constraint = engine.constraints[seq.request_id]
        if constraint is not None and seq.finish_reason == "eos":
            text = engine.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
            assert accepts(constraint, text, engine.tokenizer), (seq.label, text)
