"""Quantize the live model's weights and activations in several formats and measure what each keeps.

Every linear of every decoder layer gets its weights on the format's grid and its input (the activations) on
it too, right before the matmul, in the dense fp32 pass of engine/weight_quant/dense.py. The embedding (tied to
the LM head), the norms, attention's softmax and the KV cache stay in full precision, as FP8 and W8A8 recipes
keep them. This is fake quantization: the values are what the format can hold, the matmuls run in fp32 (a
low-precision GEMM's accumulator gives the same products up to its own rounding). There is no FP8 or FP4 GEMM
here, and the CPU has no tensor cores for one.

Activation scales: per tensor they are static, from the calibration text's largest |x| (what static-scale FP8
and W8A8 deployments ship; text beyond the calibrated range clips); per token they are computed on the fly;
FP4 formats carry their own block scales, computed on the fly, and NVFP4's per-tensor scale above them is static
too (calibrated, as NVIDIA's checkpoints ship it). So every token's activations are quantized without looking
at the other tokens', and decoding with a KV cache computes what rerunning the whole sequence would. SmoothQuant's
s_j comes from the same calibration text.

Scored with the weight-only lab's machinery (engine/weight_quant/lab.py): KL from the full model, top-1
agreement and NLL on held-out chat answers the full model wrote, and on prose.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.act_quant.formats import FORMATS, FormatName, Granularity, fake_quant
from engine.act_quant.smoothquant import smooth_scales
from engine.kv_compression.lab import first_difference
from engine.result_store import StoredResult, stored_run
from engine.weight_quant.dense import (LINEAR_INPUTS, ActTransform, embed, greedy_answer, layer_forward, rope_tables,
                                       weight_key)
from engine.weight_quant.lab import (DomainScore, EvalSet, activation_profile, build_eval_set, calibration_windows,
                                     check_run_inputs, fp32_state, reference_texts, score)
from engine.weight_quant.texts import WINDOW
from engine.weights import LoadedWeights

Progress = Callable[[str, float], None]
Key = tuple[int, str]  # (layer, layer input)

MAX_CALIBRATION_TOKENS = 2048
MAX_NEW_TOKENS = 64
MAX_PROMPT_CHARS = 1000
EVAL_CHAT = 3  # held-out chat answers scored (of the weight page's six: the dense pass runs once per variant)
ALPHAS = tuple(round(0.1 * i, 1) for i in range(10))  # the sweep: 0 .. 0.9
FULL_BITS = 16.0  # the reference counted as what a GPU serves: BF16 weights and activations


@dataclass(frozen=True, slots=True)
class Variant:
    """A checkpoint recipe: the weights' format and scale granularity (INT8/FP8: per tensor or per output
    channel; FP4: block scales), the activations' (None: weight-only, activations stay 16-bit), and whether
    SmoothQuant moves the activations' outliers into the weights first."""

    key: str
    label: str
    weight_format: FormatName
    weight_granularity: Granularity
    act_format: FormatName | None
    act_granularity: Granularity = "tensor"
    smooth: bool = False

    @property
    def bits_per_weight(self) -> float:
        return FORMATS[self.weight_format].bits

    @property
    def bits_per_activation(self) -> float:
        return FULL_BITS if self.act_format is None else FORMATS[self.act_format].bits

    @property
    def short(self) -> str:
        """A chart label: the format and what differs."""
        return self.label.replace("SmoothQuant", "SQ")


VARIANTS: dict[str, Variant] = {v.key: v for v in (
    Variant("w8", "INT8 weights only (W8A16)", "int8", "row", None),
    Variant("int8-tensor", "W8A8 INT8 per-tensor", "int8", "row", "int8", "tensor"),
    Variant("int8-token", "W8A8 INT8 per-token", "int8", "row", "int8", "row"),
    Variant("int8-sq", "W8A8 INT8 per-tensor + SmoothQuant", "int8", "row", "int8", "tensor", True),
    Variant("fp8-tensor", "FP8 E4M3 per-tensor", "fp8", "tensor", "fp8", "tensor"),
    Variant("fp8-token", "FP8 E4M3 per-channel/token", "fp8", "row", "fp8", "row"),
    Variant("nvfp4", "W4A4 NVFP4", "nvfp4", "row", "nvfp4"),
    Variant("nvfp4-sq", "W4A4 NVFP4 + SmoothQuant", "nvfp4", "row", "nvfp4", smooth=True),
    Variant("mxfp4", "W4A4 MXFP4", "mxfp4", "row", "mxfp4"),
    Variant("mxfp4-sq", "W4A4 MXFP4 + SmoothQuant", "mxfp4", "row", "mxfp4", smooth=True),
)}
# The formats an alpha sweep can run on: every variant that quantizes activations, without its own smoothing.
SWEEPABLE = tuple(k for k, v in VARIANTS.items() if v.act_format is not None and not v.smooth)
DEFAULT_VARIANTS = ("w8", "int8-tensor", "int8-token", "int8-sq", "fp8-tensor", "nvfp4", "nvfp4-sq", "mxfp4")


@dataclass(frozen=True, slots=True)
class ActLabSettings:
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    alpha: float = 0.5
    sweep: str | None = "int8-tensor"  # a SWEEPABLE variant key, or None: no sweep
    calibration_tokens: int = 256
    prompt: str = "Explain in two sentences why the sky is blue."
    max_new_tokens: int = 24

    def check(self) -> None:
        """Raises ValueError with a message the page shows as is."""
        if not self.variants:
            raise ValueError("pick at least one format")
        if unknown := [k for k in self.variants if k not in VARIANTS]:
            raise ValueError(f"unknown format {unknown[0]!r}: choose from {', '.join(VARIANTS)}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"SmoothQuant's α must be from 0 to 1, not {self.alpha}")
        if self.sweep is not None and self.sweep not in SWEEPABLE:
            raise ValueError(f"the α sweep runs on one of {', '.join(SWEEPABLE)}")
        check_run_inputs(self.calibration_tokens, self.prompt, self.max_new_tokens, MAX_CALIBRATION_TOKENS,
                         MAX_PROMPT_CHARS, MAX_NEW_TOKENS)


# ----------------------------------------------------------------------------------------- calibration

@torch.inference_mode()
def channel_max(weights: LoadedWeights, windows: list[list[int]]) -> dict[Key, np.ndarray]:
    """max |x| of every input channel of every layer input on the calibration windows (full precision): what
    SmoothQuant's s_j and the static per-tensor scales are made of. (Mean |x| is the weight lab's
    `activation_profile`.)"""
    cfg, sd = weights.config, fp32_state(weights)
    cos, sin = rope_tables(cfg, WINDOW)
    h = embed(sd, torch.tensor(windows)).float()
    out: dict[Key, np.ndarray] = {}
    for i in range(cfg.num_layers):
        h = layer_forward(cfg, sd, i, h, cos, sin,
                          hook=lambda name, x, i=i: out.__setitem__((i, name), x.abs().amax(0).numpy()))
    return out


def input_weight(sd: dict[str, torch.Tensor], layer: int, inp: str) -> torch.Tensor:
    """The weights that read one layer input, concatenated along the output dimension [out, in]."""
    return torch.cat([sd[weight_key(layer, n)] for n in LINEAR_INPUTS[inp]])


def smoothing(weights: LoadedWeights, act_max: dict[Key, np.ndarray], alpha: float) -> dict[Key, torch.Tensor]:
    """SmoothQuant's s per layer input, one per input channel, shared by the linears that read it."""
    sd = fp32_state(weights)
    return {k: smooth_scales(torch.from_numpy(m), input_weight(sd, *k), alpha) for k, m in act_max.items()}


@dataclass(frozen=True, slots=True)
class OutlierRow:
    """One layer input's outliers: the largest channel over the median channel, of mean |x| and of max |x|,
    before and after dividing by SmoothQuant's s."""

    layer: int
    input: str
    mean_ratio: float
    max_ratio: float
    mean_ratio_smoothed: float
    max_ratio_smoothed: float


def _ratio(m: np.ndarray) -> float:
    return float(m.max() / max(float(np.median(m)), 1e-12))


def outlier_rows(mean: dict[Key, np.ndarray], amax: dict[Key, np.ndarray],
                 scales: dict[Key, torch.Tensor]) -> tuple[OutlierRow, ...]:
    rows = []
    for k in sorted(amax, key=lambda k: (k[0], list(LINEAR_INPUTS).index(k[1]))):
        s = scales[k].numpy()
        rows.append(OutlierRow(k[0], k[1], _ratio(mean[k]), _ratio(amax[k]), _ratio(mean[k] / s), _ratio(amax[k] / s)))
    return tuple(rows)


# ----------------------------------------------------------------------------------------- a quantized model

@dataclass(frozen=True, slots=True, eq=False)
class QuantizedRun:
    """A variant made runnable: its fake-quantized weights and the transform of each linear's input."""

    variant: Variant
    weights: LoadedWeights
    act: ActTransform | None


def quantize_weights(weights: LoadedWeights, variant: Variant,
                     scales: dict[Key, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """Every decoder linear's weights (times s when smoothing) on the variant's grid; the rest shared, not copied."""
    sd = dict(fp32_state(weights))
    for i in range(weights.config.num_layers):
        for inp, names in LINEAR_INPUTS.items():
            for n in names:
                w = sd[weight_key(i, n)]
                if scales is not None:
                    w = w * scales[(i, inp)]
                sd[weight_key(i, n)] = fake_quant(w, variant.weight_format, variant.weight_granularity)
    return sd


def activation_transform(variant: Variant, scales: dict[Key, torch.Tensor] | None,
                         act_max: dict[Key, np.ndarray]) -> ActTransform | None:
    """x ↦ Q(x / s): smoothing (if any), then the format, with static per-tensor scales from calibration."""
    fmt = variant.act_format
    if fmt is None:
        return None
    static: dict[Key, torch.Tensor] = {}
    if variant.act_granularity == "tensor" and fmt in ("int8", "fp8", "nvfp4"):
        for k, m in act_max.items():
            t = torch.from_numpy(m).float()
            static[k] = (t / scales[k] if scales is not None else t).amax().reshape(1, 1)

    def act(layer: int, inp: str, x: torch.Tensor) -> torch.Tensor:
        k = (layer, inp)
        if scales is not None:
            x = x / scales[k]
        return fake_quant(x, fmt, variant.act_granularity, static.get(k))

    return act


def prepare(weights: LoadedWeights, variant: Variant, act_max: dict[Key, np.ndarray],
            scales: dict[Key, torch.Tensor] | None) -> QuantizedRun:
    """`scales`: SmoothQuant's s (used only when the variant smooths)."""
    s = scales if variant.smooth else None
    sd = quantize_weights(weights, variant, s)
    return QuantizedRun(variant, LoadedWeights(weights.config, sd, f"{weights.source}, {variant.label}",
                                               weights.tokenizer), activation_transform(variant, s, act_max))


def dense_greedy(weights: LoadedWeights, prompt: list[int], max_new_tokens: int, act: ActTransform | None = None,
                 whole_sequence: bool = False) -> list[int]:
    """The greedy answer through the dense pass (a few dozen tokens: cheaper than an engine that could
    fake-quantize), with a KV cache. `whole_sequence`: no cache, each step runs the whole sequence again: what the
    cache must reproduce, since every variant quantizes each token's activations without the others'."""
    # A GPU server holds the full model in bf16 on the GPU; the dense pass runs in fp32.
    return greedy_answer(weights.config, fp32_state(weights), list(prompt), max_new_tokens,
                         set(weights.tokenizer.eos_token_ids), act, whole_sequence)


# ----------------------------------------------------------------------------------------- the whole run

@dataclass(frozen=True, slots=True, eq=False)
class VariantOutcome:
    """The full model (variant None) or one variant, measured."""

    variant: Variant | None
    label: str
    bits_per_weight: float
    bits_per_activation: float
    scores: dict[str, DomainScore]
    answer_ids: tuple[int, ...]
    answer_text: str
    first_difference: int | None  # first answer token that differs from the full model's (None: same answer)
    seconds: float = 0.0

    @property
    def key(self) -> str | None:
        return None if self.variant is None else self.variant.key


@dataclass(frozen=True, slots=True)
class SweepPoint:
    alpha: float
    chat_kl: float
    chat_top1: float


@dataclass(frozen=True, slots=True, eq=False)
class ActLabResult:
    settings: ActLabSettings
    reference: VariantOutcome
    variants: tuple[VariantOutcome, ...]
    mean_profile: dict[Key, np.ndarray] = field(repr=False)
    max_profile: dict[Key, np.ndarray] = field(repr=False)
    scales: dict[Key, torch.Tensor] = field(repr=False)  # SmoothQuant's s at the settings' alpha
    outliers: tuple[OutlierRow, ...]
    sweep: tuple[SweepPoint, ...]  # empty when the settings ask for none
    sweep_baseline: SweepPoint | None  # the swept format without smoothing (alpha field: nan)
    calibration_tokens: int
    seconds: float

    @property
    def outcomes(self) -> tuple[VariantOutcome, ...]:
        return (self.reference, *self.variants)

    @property
    def best_alpha(self) -> SweepPoint | None:
        return min(self.sweep, key=lambda p: p.chat_kl, default=None)


def chat_only(eval_set: EvalSet) -> EvalSet:
    """The eval set without its prose (the alpha sweep scores chat answers only: half the dense passes)."""
    keep = [i for i, t in enumerate(eval_set.texts) if t.domain == "chat"]
    return EvalSet(tuple(eval_set.texts[i] for i in keep), tuple(eval_set.reference_logprobs[i] for i in keep),
                   eval_set.reference_state)


def run_lab(weights: LoadedWeights, settings: ActLabSettings, progress: Progress | None = None) -> ActLabResult:
    """Calibrate (mean and max |x| per channel, SmoothQuant's s), then score each variant on held-out text and
    let it answer the prompt, then sweep alpha for one format. All on the CPU in fp32."""
    settings.check()
    t0 = time.perf_counter()
    say = progress or (lambda _msg, _frac: None)
    steps = len(settings.variants) + (1 if settings.sweep else 0) + 1
    say("The full model writes the calibration and evaluation text (once per server)", 0.0)
    texts = reference_texts(weights)
    windows = calibration_windows(weights, "chat", settings.calibration_tokens, texts)
    say("Calibrating: every channel's mean and largest |x|", 0.3 / steps)
    mean, amax = activation_profile(weights, windows), channel_max(weights, windows)
    scales = smoothing(weights, amax, settings.alpha)
    eval_set = build_eval_set(weights, [(list(q), list(a)) for q, a in texts.chat_eval[:EVAL_CHAT]])
    prompt = weights.tokenizer.chat_prompt_ids(settings.prompt)
    decode = weights.tokenizer.decode
    full_answer = tuple(dense_greedy(weights, prompt, settings.max_new_tokens))
    reference = VariantOutcome(None, "Full precision", FULL_BITS, FULL_BITS,
                               score(weights, eval_set), full_answer, decode(list(full_answer)), None)
    variants = []
    for n, key in enumerate(settings.variants, start=1):
        v = VARIANTS[key]
        say(f"{v.label}: quantizing, scoring and answering", n / steps)
        t = time.perf_counter()
        run = prepare(weights, v, amax, scales)
        answer = tuple(dense_greedy(run.weights, prompt, settings.max_new_tokens, run.act))
        variants.append(VariantOutcome(v, v.label, v.bits_per_weight, v.bits_per_activation,
                                       score(run.weights, eval_set, run.act), answer, decode(list(answer)),
                                       first_difference(answer, full_answer), time.perf_counter() - t))
    sweep: list[SweepPoint] = []
    baseline = None
    if settings.sweep:
        base = VARIANTS[settings.sweep]
        chat = chat_only(eval_set)
        say(f"α sweep on {base.label}", (steps - 1) / steps)
        done = next((o for o in variants if o.key == base.key), None)
        if done is not None:
            sc = done.scores["chat"]
        else:
            run = prepare(weights, base, amax, None)
            sc = score(run.weights, chat, run.act)["chat"]
        baseline = SweepPoint(float("nan"), sc.kl, sc.top1)
        smoothed = Variant(base.key + "-sweep", base.label + " + SmoothQuant", base.weight_format,
                           base.weight_granularity, base.act_format, base.act_granularity, True)
        for a in ALPHAS:
            say(f"α sweep on {base.label}: α = {a}", (steps - 1 + a) / steps)
            s = scales if a == settings.alpha else smoothing(weights, amax, a)
            run = prepare(weights, smoothed, amax, s)
            sc = score(run.weights, chat, run.act)["chat"]
            sweep.append(SweepPoint(a, sc.kl, sc.top1))
    return ActLabResult(settings, reference, tuple(variants), mean, amax, scales,
                        outlier_rows(mean, amax, scales), tuple(sweep), baseline, len(windows) * WINDOW,
                        time.perf_counter() - t0)


def stored_lab(weights: LoadedWeights, settings: ActLabSettings,
               progress: Progress | None = None) -> StoredResult[ActLabResult]:
    """`run_lab`'s result, kept on disk for CPU weights (engine/result_store.py): the same weights, settings and
    code give it back at once, with when it was computed and how long that took."""
    settings.check()
    return stored_run("act-quant-lab", weights, settings, lambda: run_lab(weights, settings, progress))
