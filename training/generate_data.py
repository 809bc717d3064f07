"""Self-distillation data: the target answers `prompts.training_prompts()` greedily, then one
prefill pass over every (prompt + answer) records the target's final-normed hidden state at each
position (the "feature" Medusa heads and the EAGLE layer read).

Output: `<cache>/distill/<name>.pt` with, per conversation, the token ids (int32), the prompt length
and the features (fp16, [tokens, 576]); plus `meta.json` (counts and timings, copied into every
training log).  `python -m training.generate_data [--count 480] [--max-tokens 160]`, then
`python -m training.generate_data --count 756 --skip 480 --name data2` for the remaining prompts;
`python -m training.generate_data --source second --count 920 --name data3` for the second set (other
topics and kinds, and copy-style tasks over the answers in data.pt), and
`python -m training.generate_data --source third --count 520 --name data4` (the two sets crossed).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.forward_batch import build_forward_batch
from engine.kv_pool import KVPool
from engine.sampling_params import SamplingParams
from engine.weights import cache_dir, load_weights
from training.prompts import training_prompts, training_prompts_2, training_prompts_3


def data_dir() -> Path:
    return cache_dir().parent / "distill"


def extract_features(engine: LLMEngine, sequences: list[list[int]], max_batch_tokens: int = 2048) -> list[torch.Tensor]:
    """The target's final-normed hidden state for every position of every sequence (fresh prefills)."""
    cfg = engine.model_config
    bs = engine.config.block_size
    pool = KVPool(cfg, max_batch_tokens // bs + 8, bs, engine.dtype, engine.device,
                  head_major=engine.pool.head_major)
    out: list[torch.Tensor] = [None] * len(sequences)  # type: ignore[list-item]
    i = 0
    while i < len(sequences):
        group, used = [], 0
        while i < len(sequences) and (not group or used + len(sequences[i]) <= max_batch_tokens):
            group.append(i)
            used += len(sequences[i])
            i += 1
        fresh, slot = [], 0
        for j in group:
            n = len(sequences[j])
            fresh.append((sequences[j], 0, list(range(slot, slot + n))))
            slot += n
        batch = build_forward_batch(fresh, [], [], engine.device)
        with torch.inference_mode():
            hidden = engine.model.hidden_states(batch, pool)
        engine.kernels.timer.drain()
        start = 0
        for j in group:
            n = len(sequences[j])
            out[j] = hidden[start:start + n].to(torch.float16).cpu()
            start += n
    return out


def earlier_answers(name: str = "data") -> list[str]:
    """The answers of an earlier data file as text (the passages of the copy-style prompts)."""
    from engine.tokenizer import default_tokenizer

    tok = default_tokenizer()
    raw = torch.load(data_dir() / f"{name}.pt")
    return [tok.decode(t[p:].tolist(), skip_special_tokens=True) for t, p in zip(raw["tokens"], raw["prompt_lens"])]


def answer_all(engine: LLMEngine, prompts: list[str], params: SamplingParams) -> tuple[list, int, float]:
    """Every prompt as a user turn, all queued at once and answered together: (results in prompt order, steps,
    seconds). Prints progress every 50 steps."""
    t0 = time.perf_counter()
    rids = [engine.add_request([{"role": "user", "content": p}], params) for p in prompts]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        if steps % 50 == 0:
            done = sum(engine.result(r).samples[0].finish_reason != "" for r in rids)
            print(f"step {steps}: {done}/{len(rids)} done, {time.perf_counter() - t0:.0f} s", flush=True)
    return [engine.result(r) for r in rids], steps, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=480)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N prompts (made by an earlier run)")
    ap.add_argument("--source", choices=("first", "second", "third"), default="first",
                    help="first: training_prompts(); second: training_prompts_2() over data.pt's answers; "
                         "third: training_prompts_3()")
    ap.add_argument("--name", default="data", help="file stem: training reads every <cache>/distill/data*.pt")
    args = ap.parse_args()
    weights = load_weights("real")
    engine = LLMEngine(EngineConfig(num_blocks=1600, max_num_seqs=64, max_num_batched_tokens=1024,
                                    trace_detail="light", profile_kernels=False), weights)
    if args.source == "first":
        make, prompts = training_prompts, training_prompts(args.count)[args.skip:]
    elif args.source == "second":
        make, prompts = training_prompts_2, training_prompts_2(earlier_answers())[args.skip:args.count]
    else:
        make, prompts = training_prompts_3, training_prompts_3(args.count)[args.skip:]
    results, _, gen_seconds = answer_all(engine, prompts, SamplingParams(max_tokens=args.max_tokens))
    seqs = [list(r.prompt_token_ids) + list(r.token_ids) for r in results]
    t1 = time.perf_counter()
    feats = extract_features(engine, seqs)
    feat_seconds = time.perf_counter() - t1
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"tokens": [torch.tensor(s, dtype=torch.int32) for s in seqs],
                "prompt_lens": [len(r.prompt_token_ids) for r in results],
                "features": feats}, out / f"{args.name}.pt")
    meta = {"conversations": len(seqs), "prompt_tokens": sum(len(r.prompt_token_ids) for r in results),
            "generated_tokens": sum(len(r.token_ids) for r in results), "max_tokens": args.max_tokens,
            "decoding": "greedy", "generation_seconds": round(gen_seconds, 1),
            "feature_seconds": round(feat_seconds, 1), "source": f"training.prompts.{make.__name__}"}
    (out / f"{args.name}.meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
