"""On a CUDA machine: the KV compression lab on the GPU. In fp32 its reference greedy tokens are the paged
engine's; in bf16 every format and policy runs, stores the bytes its formula says and holds its budget.
(Skipped without CUDA.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv_compression import FORMATS, EvictionPolicy, KVLab, Variant
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3


def test_reference_is_the_paged_engine_on_the_gpu(random_weights) -> None:  # noqa: ANN001
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = random_weights.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    engine = LLMEngine(EngineConfig(weights="random", device="cuda", dtype="float32", kernel_backend="torch"),
                       random_weights)
    want = engine.generate(ids, SamplingParams(max_tokens=16))[0].token_ids
    result = KVLab(random_weights, device="cuda", dtype=torch.float32).run(ids, [Variant("bf16")], 16)
    assert tuple(want) == result.reference_tokens[:len(want)]
    assert result.device.startswith("cuda")


def test_every_format_and_policy_in_bf16(random_weights) -> None:  # noqa: ANN001
    ids = random_weights.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    lab = KVLab(random_weights, device="cuda", dtype=torch.bfloat16)
    formats = [Variant(f) for f in FORMATS if f not in ("bf16", "fp32")]
    policies = [Variant("bf16", EvictionPolicy(k, 32)) for k in ("window", "sinks", "h2o")]
    for variants in (formats[:6], [*formats[6:], *policies]):
        result = lab.run(ids, variants, 12)
        assert result.compute_dtype == "bfloat16"
        for r in result.variants[1:]:
            assert np.isfinite(r.kl).all() and np.isfinite(r.ref_logprob).all()
            fmt = r.variant.kv_format
            per_token = r.cache_bytes[-1] / r.cached_tokens[-1]
            if fmt.key_axis == "token":
                assert per_token == pytest.approx(fmt.bytes_per_token(30, 3, 64))
            if r.variant.policy.kind != "none":
                assert r.cached_tokens[-1] == 32 and r.kept[-1].sum(axis=2).max() == 32
