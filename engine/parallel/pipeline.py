"""Pipeline parallelism: the layers in stages, requests (micro-batches) flowing through them.

Every stage of every step of every micro-batch really runs here, in turn, and is timed. On `pp` GPUs the
stages would run at once, each on a different micro-batch: `schedule` lays the measured stage times out on
`pp` timelines with the dependencies a pipeline has (a stage waits for the previous stage's activations, the
first stage of a decode step waits for the token the last stage of the step before produced) and one
device per stage. Where no micro-batch is ready a stage idles: the bubble.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.parallel.collectives import SERVING_BYTES
from engine.parallel.plan import stage_layers
from engine.parallel.tensor_parallel import TensorParallelModel


@dataclass(frozen=True, slots=True)
class StageTask:
    micro: int
    step: int  # 0: the prefill
    stage: int
    seconds: float  # measured (per segment the slowest tensor-parallel rank, summed)
    activation_bytes: int  # what this stage hands to the next, at bf16


@dataclass(frozen=True, slots=True)
class PipelineRun:
    pp: int
    stages: tuple[tuple[int, int], ...]  # (first layer, last layer + 1) per stage
    tasks: tuple[StageTask, ...]
    tokens: tuple[tuple[int, ...], ...]  # per micro-batch (one request each)


@dataclass(frozen=True, slots=True)
class Placed:
    micro: int
    step: int
    stage: int
    start: float
    end: float


def run_pipeline(model: TensorParallelModel, prompts: list[list[int]], max_new_tokens: int, pp: int,
                 stop_ids: tuple[int, ...] = ()) -> PipelineRun:
    """Each prompt is one micro-batch; greedy. The logits count as part of the last stage, the embedding of
    the first."""
    stages = stage_layers(model.cfg.num_layers, pp)
    tasks: list[StageTask] = []
    outs = []
    for m, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > model.max_len:
            raise ValueError(f"request {m + 1}: {len(prompt)} prompt tokens + {max_new_tokens} new ones exceed "
                             f"{model.max_len} positions")
        caches = model.new_caches(1)
        ids, start, out = torch.tensor([prompt], device=model.device), 0, []
        for step in range(max_new_tokens):
            h = None
            for s, layers in enumerate(stages):
                model.trace.segments.clear()
                with torch.inference_mode():
                    if s == 0:
                        h = model.embed(ids)
                    h = model.layers(h, start, caches, layers)
                    if s == pp - 1:
                        logits = model.logits(h[:, -1])
                secs = sum(max(seg.rank_seconds) for seg in model.trace.segments)
                handed = h.numel() * SERVING_BYTES if s < pp - 1 else 0
                tasks.append(StageTask(m, step, s, secs, handed))
            start += ids.shape[1]
            token = int(logits.argmax(-1)[0])
            out.append(token)
            if token in stop_ids:
                break
            ids = torch.tensor([[token]], device=model.device)
        outs.append(tuple(out))
    return PipelineRun(pp, tuple((r.start, r.stop) for r in stages), tuple(tasks), tuple(outs))


def schedule(run: PipelineRun, hop_seconds: float = 0.0) -> list[Placed]:
    """The measured tasks on one device per stage. `hop_seconds`: the stage-to-stage send (and the sampled
    token's way back to stage 0). Each device takes the ready task that became ready first."""
    by_key = {(t.micro, t.step, t.stage): t for t in run.tasks}
    last_step = {}
    for t in run.tasks:
        last_step[t.micro] = max(last_step.get(t.micro, 0), t.step)
    free = [0.0] * run.pp
    done: dict[tuple[int, int, int], Placed] = {}
    pending = {(m, 0, 0): 0.0 for m in last_step}  # task key -> time its input is ready
    placed: list[Placed] = []
    while pending:
        key = min(pending, key=lambda k: (pending[k], k[0]))
        ready = pending.pop(key)
        m, step, s = key
        start = max(ready, free[s])
        end = start + by_key[key].seconds
        free[s] = end
        p = Placed(m, step, s, start, end)
        done[key] = p
        placed.append(p)
        if s + 1 < run.pp:
            pending[(m, step, s + 1)] = end + hop_seconds
        elif step < last_step[m]:
            pending[(m, step + 1, 0)] = end + (hop_seconds if run.pp > 1 else 0.0)
    return placed


@dataclass(frozen=True, slots=True)
class PipelineSummary:
    makespan: float  # on pp devices
    one_device: float  # every task one after another: the same work on one GPU
    busy_fraction: tuple[float, ...]  # per stage
    bubble: float  # 1 - busy time / (stages x makespan)
    textbook_bubble: float  # (pp - 1) / (m + pp - 1), one forward of m equal micro-batches


def summarize(run: PipelineRun, placed: list[Placed]) -> PipelineSummary:
    makespan = max(p.end for p in placed)
    busy = [sum(p.end - p.start for p in placed if p.stage == s) for s in range(run.pp)]
    m = len(run.tokens)
    return PipelineSummary(makespan, sum(t.seconds for t in run.tasks),
                           tuple(b / makespan for b in busy), 1 - sum(busy) / (run.pp * makespan),
                           (run.pp - 1) / (m + run.pp - 1))
