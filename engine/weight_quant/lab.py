"""Quantize the live model's weights three ways and measure what each keeps.

For each method (round-to-nearest, AWQ, GPTQ) at one grid (bits, group size), the decoder layers are
quantized in order on calibration windows that flow through the layers already quantized, as GPTQ and
AWQ do. Every linear of every layer is quantized; the embedding (tied to the LM head) and the norms stay
in 16 bits, as GPTQ and AWQ checkpoints keep them.

The quantized weights are dequantized into the engine's precision for the matmuls: on the page the text is
what the quantized model really writes and the errors are real, while the bytes are what a W4A16 kernel
would stream (codes packed, scales and zero points counted), not what the CPU reads here.

Measured against the full-precision model on held-out text of two kinds (engine/weight_quant/texts.py):
chat answers the full-precision model wrote itself (the fine-tune's behaviour) and ordinary prose.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from engine.config import EngineConfig
from engine.disk_memo import disk_memo
from engine.engine import LLMEngine
from engine.kv_compression.lab import first_difference
from engine.model import release_prepared
from engine.prompt_checks import check_new_tokens, check_prompt
from engine.result_store import StoredResult, stored_run, weights_fingerprint
from engine.sampling_params import SamplingParams
from engine.state_memo import StateDictMemo
from engine.weight_quant.awq import awq_quantize
from engine.weight_quant.dense import LINEAR_INPUTS, ActTransform, embed, layer_forward, rope_tables, sequence_logits, weight_key
from engine.weight_quant.grid import Grid, round_to_nearest
from engine.weight_quant.gptq import gptq_quantize, hessian
from engine.weight_quant.texts import (CALIBRATION_SETS, CHAT_ANSWER_TOKENS, CHAT_CALIBRATION, CHAT_EVAL,
                                       PROSE_CALIBRATION, PROSE_CONTINUATION_TOKENS, PROSE_EVAL, PROSE_OPENINGS,
                                       WINDOW, CalibrationSet, random_token_ids)
from engine.weights import LoadedWeights

Method = Literal["rtn", "awq", "gptq", "gptq_act"]
METHODS: tuple[Method, ...] = ("rtn", "awq", "gptq", "gptq_act")
# GPTQ with act-order (columns in order of decreasing Hessian diagonal) is a choice, not a default: it adds a
# fourth quantization (~20 s on 2 cores) to the page's first run.
DEFAULT_METHODS: tuple[Method, ...] = ("rtn", "awq", "gptq")
METHOD_LABELS: dict[Method, str] = {"rtn": "Round-to-nearest", "awq": "AWQ", "gptq": "GPTQ",
                                    "gptq_act": "GPTQ act-order"}
GROUPS = (0, 32, 64)  # 128, GPTQ's and AWQ's usual group, does not divide this model's 576 hidden channels
MAX_CALIBRATION_TOKENS = 4096
MAX_NEW_TOKENS = 128
MAX_PROMPT_CHARS = 2000
AWQ_TOKENS = 256  # calibration rows AWQ's alpha search multiplies through (the search is 10 matmuls per input)
FULL_BYTES = 2  # the reference is counted as a 16-bit checkpoint, what a GPU serves

Progress = Callable[[str, float], None]


def check_run_inputs(calibration_tokens: int, prompt: str, max_new_tokens: int, max_calibration_tokens: int,
                     max_prompt_chars: int, max_new: int) -> None:
    """The checks a calibrate-score-answer lab shares (this one and engine/act_quant): ValueError with a message
    the page shows as is."""
    if not WINDOW <= calibration_tokens <= max_calibration_tokens or calibration_tokens % WINDOW:
        raise ValueError(f"calibration tokens must be a multiple of {WINDOW} from {WINDOW} to {max_calibration_tokens}")
    check_prompt(prompt, max_prompt_chars, answered_by="the models")
    check_new_tokens(max_new_tokens, max_new)


@dataclass(frozen=True, slots=True)
class LabSettings:
    methods: tuple[Method, ...] = DEFAULT_METHODS
    bits: int = 4
    group: int = 64
    calibration: CalibrationSet = "chat"
    calibration_tokens: int = 2048
    prompt: str = "Explain in two sentences why the sky is blue."
    max_new_tokens: int = 32

    def check(self) -> None:
        """Raises ValueError with a message the page shows as is."""
        if not self.methods:
            raise ValueError("pick at least one quantization method")
        if unknown := [m for m in self.methods if m not in METHODS]:
            raise ValueError(f"unknown method {unknown[0]!r}: choose from {', '.join(METHODS)}")
        Grid(self.bits, self.group)  # its own checks on bits
        if self.group not in GROUPS:
            raise ValueError(f"group size must be one of {GROUPS} (0: one scale per output row)")
        if self.calibration not in CALIBRATION_SETS:
            raise ValueError(f"calibration set must be one of {', '.join(CALIBRATION_SETS)}")
        check_run_inputs(self.calibration_tokens, self.prompt, self.max_new_tokens, MAX_CALIBRATION_TOKENS,
                         MAX_PROMPT_CHARS, MAX_NEW_TOKENS)

    @property
    def grid(self) -> Grid:
        return Grid(self.bits, self.group)


@dataclass(frozen=True, slots=True)
class LinearReport:
    """One layer input's linears after quantization: the relative error of their output on the calibration
    inputs, ||X (W_hat - W)^T|| / ||X W^T||, and AWQ's chosen alpha."""

    layer: int
    input: str
    rel_error: float
    alpha: float | None = None


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedModel:
    method: Method
    grid: Grid
    state_dict: dict[str, torch.Tensor]
    reports: tuple[LinearReport, ...]
    seconds: float


_FP32: StateDictMemo[dict[str, torch.Tensor]] = StateDictMemo()


def fp32_state(weights: LoadedWeights) -> dict[str, torch.Tensor]:
    """The weights in fp32 on the CPU, where quantization and scoring run (a GPU server holds them in bf16 on
    the GPU): the state dict itself when it already is, else one remembered copy."""
    sd = weights.state_dict
    if all(t.dtype == torch.float32 and t.device.type == "cpu" for t in sd.values()):
        return sd
    return _FP32.get(sd, lambda: {k: v.detach().float().cpu() for k, v in sd.items()})


def linear_names() -> list[str]:
    return [name for names in LINEAR_INPUTS.values() for name in names]


def _linear_shapes(weights: LoadedWeights) -> list[tuple[int, int]]:
    """(out, in) of every linear the methods quantize."""
    return [tuple(weights.state_dict[weight_key(i, n)].shape) for i in range(weights.config.num_layers)
            for n in linear_names()]


def weight_bytes(weights: LoadedWeights, grid: Grid | None) -> int:
    """A checkpoint's bytes: the linears on `grid` (None: 16-bit) and everything else in 16 bits."""
    total = sum(t.numel() for t in weights.state_dict.values()) * FULL_BYTES
    if grid is None:
        return total
    return total + sum(grid.bytes_for(o, i) - o * i * FULL_BYTES for o, i in _linear_shapes(weights))


def linear_bits_per_weight(weights: LoadedWeights, grid: Grid) -> float:
    """Bits per weight over all the decoder's linears, scales and zero points included."""
    shapes = _linear_shapes(weights)
    return 8 * sum(grid.bytes_for(o, i) for o, i in shapes) / sum(o * i for o, i in shapes)


@dataclass(frozen=True, slots=True, eq=False)
class ReferenceTexts:
    """What the full model wrote once per server: its greedy answers to the chat calibration and evaluation
    questions, and its continuations of the prose openings. Settings change; these do not."""

    chat_calibration: tuple[tuple[int, ...], ...]  # question + answer, ChatML
    chat_eval: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (question, answer)
    prose_calibration: tuple[int, ...]  # the corpus, then each opening and its continuation


_REFERENCE_TEXTS: StateDictMemo[ReferenceTexts] = StateDictMemo()


def reference_texts(weights: LoadedWeights, device: str = "cpu", dtype: str = "float32") -> ReferenceTexts:
    """The full model's text for calibration and evaluation, generated in one batch (~20 s on a 2-core CPU)
    the first time for these weights, then remembered (in this process, and on disk for CPU weights)."""
    return _REFERENCE_TEXTS.get(weights.state_dict, lambda: _write_reference_texts(weights, device, dtype),
                                device, dtype)


def _write_reference_texts(weights: LoadedWeights, device: str, dtype: str) -> ReferenceTexts:
    tok = weights.tokenizer
    questions = [weights.tokenizer.chat_prompt_ids(q) for q in (*CHAT_CALIBRATION, *CHAT_EVAL)]
    openings = [tok.encode(o) for o in PROSE_OPENINGS]
    prompts, new_tokens = questions + openings, max(CHAT_ANSWER_TOKENS, PROSE_CONTINUATION_TOKENS)
    generate = lambda: greedy_answers(weights, prompts, new_tokens, device, dtype)  # noqa: E731
    # The same weights write the same text every time: kept on disk, a restarted app or a second process
    # reads it instead of generating it again.
    fingerprint = weights_fingerprint(weights)  # hashed once per state dict, shared with the stored lab runs
    out = generate() if fingerprint is None else disk_memo(
        "reference-texts", {"weights": fingerprint, "prompts": prompts, "max_new_tokens": new_tokens,
                            "device": device, "dtype": dtype}, generate)
    answers, continuations = out[:len(questions)], out[len(questions):]
    n = len(CHAT_CALIBRATION)
    return ReferenceTexts(
        tuple(tuple(q + a[:CHAT_ANSWER_TOKENS]) for q, a in zip(questions[:n], answers[:n])),
        tuple((tuple(q), tuple(a[:CHAT_ANSWER_TOKENS])) for q, a in zip(questions[n:], answers[n:])),
        tuple(tok.encode(PROSE_CALIBRATION) + [t for o, c in zip(openings, continuations)
                                               for t in o + c[:PROSE_CONTINUATION_TOKENS]]))


def calibration_windows(weights: LoadedWeights, which: CalibrationSet, tokens: int,
                        texts: ReferenceTexts) -> list[list[int]]:
    """`tokens` calibration tokens as windows of WINDOW, from the chosen set (wrapping round if it is short)."""
    if which == "chat":
        stream = [t for conv in texts.chat_calibration for t in conv]
    elif which == "prose":
        stream = list(texts.prose_calibration)
    else:
        stream = random_token_ids(weights.config.vocab_size, tokens)
    stream = [stream[i % len(stream)] for i in range(tokens)]
    return [stream[i:i + WINDOW] for i in range(0, tokens, WINDOW)]


def output_error(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """||X (W_hat - W)^T|| / ||X W^T|| over the calibration inputs x [tokens, in]."""
    return float((x @ (w_hat - w).T).norm() / (x @ w.T).norm().clamp(min=1e-12))


def output_error_from_hessian(h: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """The same ratio from GPTQ's H = 2 X^T X / n (its scale cancels): ||X D^T||^2 = sum((D H) * D), out x in^2
    multiply-adds instead of tokens x in x out (in / tokens of the work: 0.28 for 2,048 tokens of a 576-wide input)."""
    h = h.float()
    d = w_hat - w
    return float((((d @ h) * d).sum() / ((w @ h) * w).sum().clamp(min=1e-30)).sqrt())


def layer_output_error(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """`output_error` by whichever route does fewer multiply-adds: through H when tokens x in^2 (forming it) plus
    2 out x in^2 is less than the direct 2 tokens x in x out. At 2,048 tokens that is q/k/v, o and gate/up (the
    wide ones 3x faster on a CPU) but not down (in = 1,536); with a few calibration tokens, never."""
    tokens, (out_f, in_f) = x.shape[0], w.shape
    if in_f * (tokens + 2 * out_f) < 2 * tokens * out_f:
        return output_error_from_hessian(hessian(x), w, w_hat)
    return output_error(x, w, w_hat)


@torch.inference_mode()
def quantize_model(weights: LoadedWeights, method: Method, grid: Grid, windows: list[list[int]],
                   progress: Progress | None = None) -> QuantizedModel:
    """Every decoder layer's linears quantized in order, each from the inputs it sees once the layers
    before it are quantized. Returns a new state dict (the others' tensors are shared, not copied)."""
    t0 = time.perf_counter()
    cfg = weights.config
    sd = dict(fp32_state(weights))
    cos, sin = rope_tables(cfg, WINDOW)
    h = embed(sd, torch.tensor(windows)).float()
    reports = []
    for i in range(cfg.num_layers):
        if progress:
            progress(f"{METHOD_LABELS[method]}: layer {i + 1} of {cfg.num_layers}", i / cfg.num_layers)
        captured: dict[str, torch.Tensor] = {}
        layer_forward(cfg, sd, i, h, cos, sin, hook=captured.__setitem__)
        for inp, names in LINEAR_INPUTS.items():
            x = captured[inp]
            parts = [sd[weight_key(i, n)].float() for n in names]
            w = torch.cat(parts)
            alpha, h_x = None, None
            if method == "rtn":
                w_hat = round_to_nearest(w, grid)
            elif method == "awq":
                rows = torch.linspace(0, x.shape[0] - 1, min(AWQ_TOKENS, x.shape[0])).long()  # spread over windows
                w_hat, choice = awq_quantize(w, x[rows], grid)
                alpha = choice.alpha
            else:
                h_x = hessian(x)
                w_hat = gptq_quantize(w, h_x, grid, act_order=method == "gptq_act")
            error = layer_output_error(x, w, w_hat) if h_x is None else output_error_from_hessian(h_x, w, w_hat)
            reports.append(LinearReport(i, inp, error, alpha))
            for n, piece in zip(names, torch.split(w_hat, [p.shape[0] for p in parts])):
                sd[weight_key(i, n)] = piece.contiguous()
        h = layer_forward(cfg, sd, i, h, cos, sin)  # what the next layer sees from the quantized one
    return QuantizedModel(method, grid, sd, tuple(reports), time.perf_counter() - t0)


@torch.inference_mode()
def activation_profile(weights: LoadedWeights, windows: list[list[int]]) -> dict[tuple[int, str], np.ndarray]:
    """Mean |x| of every input channel of every layer input on the calibration windows, full precision:
    the few channels far above the rest are the ones AWQ protects."""
    cfg, sd = weights.config, fp32_state(weights)
    cos, sin = rope_tables(cfg, WINDOW)
    h = embed(sd, torch.tensor(windows)).float()
    out: dict[tuple[int, str], np.ndarray] = {}
    for i in range(cfg.num_layers):
        h = layer_forward(cfg, sd, i, h, cos, sin,
                          hook=lambda name, x, i=i: out.__setitem__((i, name), x.abs().mean(0).numpy()))
    return out


# ----------------------------------------------------------------------------------------- measuring

@dataclass(frozen=True, slots=True)
class EvalText:
    """A held-out text; the tokens from `first_scored` on are the ones each model is asked to predict."""

    domain: Literal["chat", "prose"]
    token_ids: tuple[int, ...]
    first_scored: int


@dataclass(frozen=True, slots=True)
class DomainScore:
    """Per scored token, against the full-precision model: mean KL(full || quantized) in nats, how often the
    two agree on the most likely token, and the text's mean negative log-likelihood."""

    domain: str
    kl: float
    top1: float
    nll: float
    tokens: int

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nll))


@dataclass(frozen=True, slots=True, eq=False)
class EvalSet:
    texts: tuple[EvalText, ...]
    reference_logprobs: tuple[torch.Tensor, ...]  # [scored, vocab] log-softmax of the full model
    reference_state: dict[str, torch.Tensor]  # the full model's weights (scored without running it again)


def _scored_logprobs(weights: LoadedWeights, sd: dict[str, torch.Tensor], text: EvalText,
                     act: ActTransform | None = None) -> torch.Tensor:
    logits = sequence_logits(weights.config, sd, list(text.token_ids), act)
    # The logits at position p predict token p + 1.
    return torch.log_softmax(logits[text.first_scored - 1:-1].float(), dim=-1)


def build_eval_set(weights: LoadedWeights, chat_conversations: list[tuple[list[int], list[int]]]) -> EvalSet:
    """Chat: (prompt ids, the full model's answer ids) pairs, scored on the answer. Prose: PROSE_EVAL, scored
    from its second token."""
    texts = [EvalText("chat", tuple(p + a), len(p)) for p, a in chat_conversations if a]
    texts.append(EvalText("prose", tuple(weights.tokenizer.encode(PROSE_EVAL)), 1))
    refs = tuple(_scored_logprobs(weights, fp32_state(weights), t) for t in texts)
    return EvalSet(tuple(texts), refs, weights.state_dict)


def score(weights: LoadedWeights, eval_set: EvalSet, act: ActTransform | None = None) -> dict[str, DomainScore]:
    """`weights` (the full model or a quantized one) measured against the full model on the held-out texts;
    `act` transforms each linear's input in the dense pass (activation quantization; None: unchanged)."""
    sums: dict[str, list[float]] = {}
    sd = weights.state_dict
    for text, ref in zip(eval_set.texts, eval_set.reference_logprobs):
        lp = ref if sd is eval_set.reference_state and act is None else _scored_logprobs(weights, sd, text, act)
        targets = torch.tensor(text.token_ids[text.first_scored:])
        kl = (ref.exp() * (ref - lp)).sum(-1)
        agree = (ref.argmax(-1) == lp.argmax(-1)).float()
        nll = -lp.gather(1, targets[:, None])[:, 0]
        acc = sums.setdefault(text.domain, [0.0, 0.0, 0.0, 0])
        acc[0] += float(kl.sum()); acc[1] += float(agree.sum()); acc[2] += float(nll.sum()); acc[3] += len(targets)
    return {d: DomainScore(d, k / n, a / n, l / n, int(n)) for d, (k, a, l, n) in sums.items()}


# ----------------------------------------------------------------------------------------- generating

def greedy_answers(weights: LoadedWeights, prompts: list[list[int]], max_new_tokens: int,
                   device: str = "cpu", dtype: str = "float32", release: bool = False) -> list[list[int]]:
    """Each prompt's greedy answer from the real engine running these weights (end-of-turn token dropped).
    `release`: these weights will not run again (a quantized variant), so drop the engine's prepared copy."""
    longest = max(len(p) for p in prompts) + max_new_tokens
    blocks = len(prompts) * (-(-longest // 16) + 1)
    engine = LLMEngine(EngineConfig(device=device, dtype=dtype, num_blocks=blocks, block_size=16,
                                    max_num_seqs=len(prompts), max_num_batched_tokens=max(512, longest),
                                    max_model_len=longest + 16, profile_kernels=False,
                                    trace_detail="light"), weights)
    try:
        results = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_new_tokens))
    finally:
        if release:
            release_prepared(weights.state_dict)
    eos = set(weights.tokenizer.eos_token_ids)
    return [[t for t in r.token_ids if t not in eos] for r in results]


# ----------------------------------------------------------------------------------------- the whole run

@dataclass(frozen=True, slots=True, eq=False)
class VariantOutcome:
    """The full-precision reference (method None) or one quantized model, measured."""

    method: Method | None
    label: str
    weight_bytes: int
    bits_per_weight: float  # of the linears, scales and zero points included
    scores: dict[str, DomainScore]
    answer_ids: tuple[int, ...]
    answer_text: str
    first_difference: int | None  # first answer token that differs from the reference's (None: same answer)
    reports: tuple[LinearReport, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, eq=False)
class LabResult:
    settings: LabSettings
    reference: VariantOutcome
    variants: tuple[VariantOutcome, ...]
    profile: dict[tuple[int, str], np.ndarray] = field(repr=False)
    calibration_windows: int
    device: str

    @property
    def outcomes(self) -> tuple[VariantOutcome, ...]:
        return (self.reference, *self.variants)


def run_lab(weights: LoadedWeights, settings: LabSettings, device: str = "cpu", dtype: str = "float32",
            progress: Progress | None = None) -> LabResult:
    """The whole comparison: the full model's chat answers (calibration and evaluation text), calibration
    windows, each method's quantized model, its scores on held-out text and its answer to the prompt.
    Quantization and scoring run on the CPU in fp32; the answers come from the engine on `device`."""
    settings.check()
    say = progress or (lambda _msg, _frac: None)
    grid = settings.grid
    say("The full-precision model writes the calibration and evaluation text (once per server)", 0.0)
    texts = reference_texts(weights, device, dtype)
    user_prompt = weights.tokenizer.chat_prompt_ids(settings.prompt)
    reference_answer = tuple(greedy_answers(weights, [user_prompt], settings.max_new_tokens, device, dtype)[0])
    calib = calibration_windows(weights, settings.calibration, settings.calibration_tokens, texts)
    eval_set = build_eval_set(weights, [(list(q), list(a)) for q, a in texts.chat_eval])
    decode = weights.tokenizer.decode
    reference = VariantOutcome(None, "Full precision (16-bit)", weight_bytes(weights, None), 8.0 * FULL_BYTES,
                               score(weights, eval_set), reference_answer,
                               decode(list(reference_answer)), None)
    variants = []
    for k, method in enumerate(settings.methods):
        sub = lambda msg, frac, k=k: say(msg, (k + frac) / len(settings.methods))  # noqa: E731
        q = quantize_model(weights, method, grid, calib, sub)
        qweights = LoadedWeights(weights.config, q.state_dict, f"{weights.source}, {METHOD_LABELS[method]} {grid.label}",
                                 weights.tokenizer)
        sub(f"{METHOD_LABELS[method]}: scoring and answering", 1.0)
        scores = score(qweights, eval_set)
        answer = tuple(greedy_answers(qweights, [user_prompt], settings.max_new_tokens, device, dtype,
                                      release=True)[0])
        variants.append(VariantOutcome(
            method, f"{METHOD_LABELS[method]} · {grid.label}", weight_bytes(weights, grid),
            linear_bits_per_weight(weights, grid), scores, answer, decode(list(answer)),
            first_difference(answer, reference_answer), q.reports, q.seconds))
        del q, qweights
    say("Activation profile", 1.0)
    return LabResult(settings, reference, tuple(variants), activation_profile(weights, calib), len(calib), device)


def stored_lab(weights: LoadedWeights, settings: LabSettings, device: str = "cpu", dtype: str = "float32",
               progress: Progress | None = None) -> StoredResult[LabResult]:
    """`run_lab`'s result, kept on disk for CPU weights (engine/result_store.py): the same weights, settings and
    code give it back at once, with when it was computed and how long that took."""
    settings.check()
    return stored_run("weight-quant-lab", weights, settings,
                      lambda: run_lab(weights, settings, device, dtype, progress), device=device, dtype=dtype)
