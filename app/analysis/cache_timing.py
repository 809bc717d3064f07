"""Decoding with the KV cache versus recomputing the whole prefix for every token, timed live.

Both ways run on the same engine code and model. "With cache" is one request decoding normally:
each step pushes one new token through the model and reads the rest from the cache. "Without
cache" submits, for every new token, a fresh request holding the whole sequence so far with
max_tokens=1: a full prefill each time, which is exactly what a cache-less decoder does. The two
engines are stepped alternately so background load on a shared machine hits both equally, and
greedy decoding makes both produce the same tokens (checked).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.weights import LoadedWeights


@dataclass(frozen=True, slots=True)
class CacheTiming:
    prompt_len: int
    context_lens: tuple[int, ...]  # tokens the model had seen when producing output token i
    with_cache_ms: tuple[float, ...]
    without_cache_ms: tuple[float, ...]
    with_cache_tokens: tuple[int, ...]  # tokens pushed through the model to produce output token i
    without_cache_tokens: tuple[int, ...]
    same_tokens: bool
    text: str


def measure_cache_vs_recompute(
    weights: LoadedWeights, server: dict[str, str], prompt: str | list[dict[str, str]], num_tokens: int,
    on_progress: Callable[[float], None] | None = None,
) -> CacheTiming:
    tok = weights.tokenizer
    prompt_ids = tok.apply_chat_template(prompt) if isinstance(prompt, list) else tok.encode(prompt)
    total = len(prompt_ids) + num_tokens + 1
    blocks = -(-total // 16) + 2
    cfg = EngineConfig(block_size=16, num_blocks=blocks, max_model_len=total + 16,
                       max_num_batched_tokens=max(512, total + 16), **server)
    # One untimed prefill of the same prompt first: a process's first forward of a shape pays one-off costs
    # (oneDNN picks its kernels, buffers grow), which landed on the cached run's token 1 alone (258 ms against
    # the same prefill's 160 ms without the cache).
    warm = LLMEngine(cfg, weights)
    warm.add_request(list(prompt_ids), SamplingParams(max_tokens=1, ignore_eos=True))
    warm.step()
    del warm
    cached, fresh = LLMEngine(cfg, weights), LLMEngine(cfg, weights)
    cached.add_request(list(prompt_ids), SamplingParams(max_tokens=num_tokens, ignore_eos=True))

    ids = list(prompt_ids)
    with_ms: list[float] = []
    without_ms: list[float] = []
    with_tok: list[int] = []
    without_tok: list[int] = []
    ctx: list[int] = []
    cached_out: list[int] = []
    for i in range(num_tokens):
        rec = cached.step()
        with_ms.append(rec.wall_seconds * 1e3)
        with_tok.append(rec.num_batched_tokens)
        cached_out.extend(e.token_id for e in rec.emitted)

        fresh.add_request(list(ids), SamplingParams(max_tokens=1, ignore_eos=True))
        rec = fresh.step()
        without_ms.append(rec.wall_seconds * 1e3)
        without_tok.append(rec.num_batched_tokens)
        ctx.append(len(ids))
        ids.append(rec.emitted[0].token_id)
        if on_progress:
            on_progress((i + 1) / num_tokens)
    generated = ids[len(prompt_ids):]
    return CacheTiming(
        prompt_len=len(prompt_ids), context_lens=tuple(ctx), with_cache_ms=tuple(with_ms),
        without_cache_ms=tuple(without_ms), with_cache_tokens=tuple(with_tok),
        without_cache_tokens=tuple(without_tok), same_tokens=cached_out == generated,
        text=weights.tokenizer.decode(generated),
    )
