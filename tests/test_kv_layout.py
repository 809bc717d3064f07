"""The KV pool's two memory layouts (engine/kv_pool.py) hold the same cache.

Token-major is the CPU default and head-major the CUDA default; both hand every layer out as
[num_blocks, block_size, Hkv, D] views. The pool operations must act on those views identically, and
the engine must produce the same greedy tokens on either layout, with the features that move KV
around (a prefix cache, a chunked mixed batch, tree speculation compacting accepted slots) on.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import BlockCopy
from engine.config import EngineConfig, ModelConfig
from engine.engine import LLMEngine
from engine.kv_pool import KVPool
from engine.sampling_params import SamplingParams
from engine.speculative.heads import head_available
from kernels.kv_store_ref import store_kv_ref

CFG = ModelConfig(num_layers=2, num_heads=6, num_kv_heads=3, head_dim=8, hidden_size=48, intermediate_size=64,
                  vocab_size=32)
NB, BS = 6, 4
SLOTS = NB * BS


def _pool(head_major: bool) -> KVPool:
    pool = KVPool(CFG, NB, BS, torch.float32, torch.device("cpu"), head_major=head_major)
    pool.data.zero_()
    return pool


def _same(a: KVPool, b: KVPool) -> bool:
    return all(torch.equal(x, y) for i in range(CFG.num_layers) for x, y in zip(a.layer(i), b.layer(i)))


ops = st.one_of(
    st.tuples(st.just("store"), st.lists(st.integers(-1, SLOTS - 1), min_size=1, max_size=8, unique=True)),
    st.tuples(st.just("blocks"), st.lists(st.tuples(st.integers(0, NB - 1), st.integers(0, NB - 1)),
                                          min_size=1, max_size=3)),
    st.tuples(st.just("slots"), st.lists(st.tuples(st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1)),
                                         min_size=1, max_size=5)),
)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(ops, min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_layouts_hold_the_same_cache(steps, seed):
    """Stores by slot mapping (with padding slots), copy-on-write block copies and slot compaction
    leave the token-major and the head-major pool with equal [block, slot, head, dim] views."""
    gen = torch.Generator().manual_seed(seed)
    tok, head = _pool(False), _pool(True)
    assert not head.layer(0)[0].is_contiguous() and tok.layer(0)[0].is_contiguous()
    for kind, arg in steps:
        if kind == "store":
            slots = torch.tensor(arg)
            for i in range(CFG.num_layers):
                k = torch.randn(len(arg), CFG.num_kv_heads, CFG.head_dim, generator=gen)
                v = torch.randn(len(arg), CFG.num_kv_heads, CFG.head_dim, generator=gen)
                store_kv_ref(k, v, *tok.layer(i), slots)
                store_kv_ref(k, v, *head.layer(i), slots)
                kept = slots >= 0
                # The row landed where the view says slot s lives: block s // BS, offset s % BS.
                assert torch.equal(head.layer(i)[0][slots[kept] // BS, slots[kept] % BS], k[kept])
        elif kind == "blocks":
            dst = {d: s for s, d in arg}  # one source per destination, as the block manager makes them
            copies = [BlockCopy(s, d) for d, s in dst.items()]
            tok.copy_blocks(copies)
            head.copy_blocks(copies)
        else:
            dst = {d: s for s, d in arg}
            src, dsts = list(dst.values()), list(dst)
            tok.copy_slots(src, dsts)
            head.copy_slots(src, dsts)
        assert _same(tok, head), (kind, arg)


PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "What is the capital of Italy?"}],  # shares the chat prefix: a cache hit
    "The three primary colours are",
]


def _tokens(weights, **kw) -> list[list[int]]:
    engine = LLMEngine(EngineConfig(num_blocks=64, max_num_batched_tokens=32, enable_prefix_cache=True,
                                    profile_kernels=False, **kw), weights)
    rids = [engine.add_request(p, SamplingParams(max_tokens=12), arrival_step=a) for p, a in zip(PROMPTS, (0, 2, 3))]
    while engine.has_work():
        engine.step()
    assert engine.pool.head_major == (kw.get("kv_layout") == "head_major")
    return [list(engine.result(r).token_ids) for r in rids]


@pytest.mark.slow
def test_head_major_engine_gives_the_same_tokens(real_weights):
    """The CPU engine on a head-major pool (the CUDA layout, through the torch reference) emits the
    token-major engine's greedy tokens: with prefix caching and chunked mixed batches, and with
    EAGLE tree rounds, which compact accepted slots with copy_slots."""
    assert _tokens(real_weights, kv_layout="head_major") == _tokens(real_weights, kv_layout="token_major")
    if head_available("eagle"):
        tree = dict(spec_drafter="eagle", spec_gamma=1, spec_tree_nodes=6, spec_tree_depth=3, spec_tree_topk=2)
        assert _tokens(real_weights, kv_layout="head_major", **tree) == _tokens(real_weights, kv_layout="token_major")


def test_kv_layout_is_checked():
    with pytest.raises(ValueError, match="kv_layout"):
        EngineConfig(kv_layout="nhd")
    assert EngineConfig(device="cuda").kv_head_major and not EngineConfig(device="cpu").kv_head_major
    assert EngineConfig(kv_layout="head_major").kv_head_major
