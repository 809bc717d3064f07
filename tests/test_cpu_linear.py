"""The CPU path's oneDNN linear on packed weights: the same products as F.linear, up to summation order."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu_linear import ONEDNN_LINEAR, cpu_linear, pack_linear_weight


@pytest.mark.parametrize("rows", [1, 3, 16, 100])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (5000, 576)])
def test_packed_linear_matches_f_linear(rows, shape):
    gen = torch.Generator().manual_seed(rows * 7 + shape[0])
    w = torch.randn(*shape, generator=gen)
    x = torch.randn(rows, shape[1], generator=gen)
    packed = pack_linear_weight(w)
    assert tuple(packed.shape) == shape
    torch.testing.assert_close(cpu_linear(x, packed), F.linear(x, w), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(cpu_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_packing_is_skipped_where_it_does_not_apply():
    ints = torch.ones(4, 3, dtype=torch.int32)
    vec = torch.randn(5)
    assert pack_linear_weight(ints) is ints and pack_linear_weight(vec) is vec
    half = torch.randn(4, 3, dtype=torch.float16)
    assert pack_linear_weight(half) is half
    x = torch.randn(2, 3, dtype=torch.float16)
    torch.testing.assert_close(cpu_linear(x, half), F.linear(x, half))


@pytest.mark.skipif(not ONEDNN_LINEAR, reason="torch built without oneDNN")
def test_cpu_engine_holds_packed_projection_weights():
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.weights import load_weights

    w = load_weights("random")
    eng = LLMEngine(EngineConfig(num_blocks=8, max_model_len=64), w)
    assert eng.model.layers[0]["gate_up"].is_mkldnn and eng.model.lm_head.is_mkldnn
    assert not eng.model.embed.is_mkldnn  # the embedding lookup and the draft heads read it plain
