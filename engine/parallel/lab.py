"""One run for the parallelism page: the prompt answered on one rank and on `tp` ranks (same tokens, a third
of the weights and cache each, 62 collectives a step), and a few requests through a `pp`-stage pipeline."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.parallel.generate import Generation, generate
from engine.parallel.pipeline import Placed, PipelineRun, PipelineSummary, run_pipeline, schedule, summarize
from engine.parallel.plan import check_degrees
from engine.parallel.tensor_parallel import TensorParallelModel
from engine.prompt_checks import check_new_tokens, check_prompt
from engine.weights import LoadedWeights

MAX_PROMPT_CHARS = 2000
MAX_NEW_TOKENS = 96
MAX_MICRO_BATCHES = 8
MAX_PIPELINE_TOKENS = 32
MAX_LEN = 1024
# The prefill bars are the median of this many passes, as the decode bars are the median of their steps: a single
# pass of a 40-token prompt on a busy 2-core CPU once read 337 ms for one rank against 174 ms for the three ranks'
# shares together.
PREFILL_TIMINGS = 3
# The other requests of the pipeline run (the first is the user's prompt).
PIPELINE_PROMPTS = (
    "Name three uses of a paper clip.",
    "What is the capital of Portugal?",
    "Write one sentence about autumn.",
    "Why do cats purr?",
    "Give me a tip for learning to cook.",
    "What does a compiler do?",
    "Describe the moon in five words.",
)

Progress = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class ParallelSettings:
    prompt: str = "Explain in two sentences why the sky is blue."
    max_new_tokens: int = 32
    tp: int = 3
    pp: int = 3
    micro_batches: int = 4  # requests in the pipeline at once
    pipeline_tokens: int = 12  # tokens each pipeline request generates

    def check(self, cfg: ModelConfig) -> None:
        """ValueError with a message the page shows as is."""
        check_prompt(self.prompt, MAX_PROMPT_CHARS)
        check_new_tokens(self.max_new_tokens, MAX_NEW_TOKENS)
        if not 1 <= self.micro_batches <= MAX_MICRO_BATCHES:
            raise ValueError(f"requests in the pipeline must be 1 to {MAX_MICRO_BATCHES}")
        if not 1 <= self.pipeline_tokens <= MAX_PIPELINE_TOKENS:
            raise ValueError(f"tokens per pipeline request must be 1 to {MAX_PIPELINE_TOKENS}")
        check_degrees(cfg, self.tp, self.pp)


@dataclass(frozen=True, slots=True)
class ParallelResult:
    settings: ParallelSettings
    prompt_tokens: int
    single: Generation  # tp = 1
    sharded: Generation  # tp = settings.tp
    single_text: str
    sharded_text: str
    pipeline: PipelineRun
    pipeline_prompts: tuple[str, ...]
    pipeline_texts: tuple[str, ...]

    @property
    def same_tokens(self) -> bool:
        return self.single.tokens == self.sharded.tokens

    def placed(self, hop_seconds: float = 0.0) -> list[Placed]:
        return schedule(self.pipeline, hop_seconds)

    def pipeline_summary(self, hop_seconds: float = 0.0) -> PipelineSummary:
        return summarize(self.pipeline, self.placed(hop_seconds))


def run_parallel_lab(weights: LoadedWeights, settings: ParallelSettings, progress: Progress | None = None) -> ParallelResult:
    cfg, tok = weights.config, weights.tokenizer
    settings.check(cfg)
    say = progress or (lambda _msg, _frac: None)
    ids = tok.chat_prompt_ids(settings.prompt)
    if len(ids) + max(settings.max_new_tokens, settings.pipeline_tokens) > MAX_LEN:
        raise ValueError(f"the prompt is {len(ids)} tokens; with the tokens to generate it must fit in {MAX_LEN}")
    stop = cfg.eos_token_ids
    say("one rank: the whole model", 0.05)
    one_rank = TensorParallelModel(cfg, weights.state_dict, 1, MAX_LEN)
    # A first pass pays one-off costs (the CPU's matmul kernels picked and warmed for these shapes) that would
    # otherwise land on the one-rank prefill and flatter tensor parallelism; run one untimed.
    generate(one_rank, [ids], 1)
    single = _median_prefill(one_rank, ids, generate(one_rank, [ids], settings.max_new_tokens, stop))
    say(f"{settings.tp} ranks: the model sharded", 0.35)
    tp_ranks = TensorParallelModel(cfg, weights.state_dict, settings.tp, MAX_LEN)
    sharded = _median_prefill(tp_ranks, ids, generate(tp_ranks, [ids], settings.max_new_tokens, stop))
    say(f"{settings.micro_batches} request{'s' if settings.micro_batches != 1 else ''} through {settings.pp} "
        f"pipeline stage{'s' if settings.pp != 1 else ''}", 0.65)
    prompts = (settings.prompt,) + PIPELINE_PROMPTS[:settings.micro_batches - 1]
    run = run_pipeline(one_rank, [tok.chat_prompt_ids(p) for p in prompts],
                       settings.pipeline_tokens, settings.pp, stop)
    say("done", 1.0)
    text = lambda g: tok.decode(g.tokens[0], skip_special_tokens=True)  # noqa: E731
    return ParallelResult(settings, len(ids), single, sharded, text(single), text(sharded), run, prompts,
                          tuple(tok.decode(t, skip_special_tokens=True) for t in run.tokens))


def _median_prefill(model: TensorParallelModel, ids: list[int], gen: Generation) -> Generation:
    """`gen` with its prefill's cost replaced by the median pass of PREFILL_TIMINGS (its own and more prefills of
    the same prompt; the tokens are the same every time)."""
    passes = [gen.steps[0], *(generate(model, [ids], 1).steps[0] for _ in range(PREFILL_TIMINGS - 1))]
    median = sorted(passes, key=lambda c: c.serial_seconds)[len(passes) // 2]
    return dataclasses.replace(gen, steps=(median, *gen.steps[1:]))
