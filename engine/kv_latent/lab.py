"""One run for the KV cache page's MLA section: the live model's K and V projections factored through a latent
of several ranks (plain and activation-aware SVD) and mean-pooled to one KV head (MQA), each scored on held-out
text against the full model, and the user's prompt answered with the cache holding only the latent.

Scored with the weight lab's machinery (engine/weight_quant/lab.py): KL from the full model, top-1 agreement and
NLL on chat answers the full model wrote and on prose; calibration is the same chat text. All fp32 on the CPU.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from engine.config import ModelConfig
from engine.kv_compression.lab import first_difference
from engine.kv_latent.decode import LatentRun, latent_greedy
from engine.kv_latent.factor import (LatentLayer, LayerSvd, decompose, equivalent_state, identity_layer,
                                     input_covariance, kv_weight, mean_pooled_layer)
from engine.prompt_checks import check_new_tokens, check_prompt
from engine.result_store import StoredResult, stored_run
from engine.weight_quant.dense import embed, layer_forward, rope_tables
from engine.weight_quant.lab import (DomainScore, build_eval_set, calibration_windows, fp32_state, reference_texts,
                                     score)
from engine.weight_quant.texts import WINDOW
from engine.weights import LoadedWeights

Progress = Callable[[str, float], None]
PointKind = Literal["full", "plain", "aware", "mqa"]

RANKS = (320, 256, 192, 128, 96, 64, 32)  # latent numbers per token and layer swept (the model's own K and V: 384)
EVAL_CHAT = 3  # held-out chat answers scored (as the activation lab: each variant is one dense pass per text)
MAX_PROMPT_CHARS = 1000
MAX_NEW_TOKENS = 64
CALIBRATION_TOKENS = 1024
KIND_LABELS: dict[PointKind, str] = {"full": "GQA as trained", "plain": "latent, plain SVD",
                                     "aware": "latent, activation-aware SVD", "mqa": "MQA by mean-pooling"}


def full_rank(cfg: ModelConfig) -> int:
    """The numbers the model itself caches per token and layer: K and V of every KV head."""
    return 2 * cfg.num_kv_heads * cfg.head_dim


@dataclass(frozen=True, slots=True)
class LatentSettings:
    prompt: str = "Explain in two sentences why the sky is blue."
    max_new_tokens: int = 32
    answer_rank: int = 128
    answer_method: Literal["plain", "aware"] = "aware"

    def check(self, cfg: ModelConfig | None = None) -> None:
        """ValueError with a message the page shows as is (`cfg`: the model's shape, SmolLM2's by default)."""
        cfg = cfg or ModelConfig()
        check_prompt(self.prompt, MAX_PROMPT_CHARS)
        check_new_tokens(self.max_new_tokens, MAX_NEW_TOKENS)
        if not 1 <= self.answer_rank <= full_rank(cfg):
            raise ValueError(f"the latent rank must be 1 to {full_rank(cfg)}")
        if self.answer_method not in ("plain", "aware"):
            raise ValueError(f"unknown factorisation {self.answer_method!r}: plain or aware")


@dataclass(frozen=True, slots=True)
class LatentPoint:
    """One cache layout scored: what it caches per token and layer, and how close the model stays."""

    kind: PointKind
    rank: int  # numbers cached per token and layer
    scores: dict[str, DomainScore]  # by domain ("chat", "prose")
    kept_energy: float  # mean over layers of the spectrum share kept (nan where it does not apply)

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]


@dataclass(frozen=True, slots=True)
class Answer:
    label: str
    run: LatentRun
    text: str
    differs_at: int | None  # first token that is not the full model's (None: the same answer)


@dataclass(frozen=True, slots=True, eq=False)
class LatentLabResult:
    settings: LatentSettings
    full_rank: int
    layers: int
    prompt_tokens: int
    points: tuple[LatentPoint, ...]
    spectra: dict[str, np.ndarray]  # "plain" / "aware": [layers, full_rank] cumulative share of energy kept
    answers: tuple[Answer, ...]  # the full model, the chosen latent, MQA
    seconds: float

    def point(self, kind: PointKind, rank: int) -> LatentPoint | None:
        return next((p for p in self.points if p.kind == kind and p.rank == rank), None)


@torch.inference_mode()
def kv_input_covariances(weights: LoadedWeights, windows: list[list[int]]) -> list[torch.Tensor]:
    """Each layer's XᵀX/n over the calibration windows, for the input its K and V projections read."""
    cfg, sd = weights.config, fp32_state(weights)
    cos, sin = rope_tables(cfg, WINDOW)
    h = embed(sd, torch.tensor(windows)).float()
    out: list[torch.Tensor] = []
    for i in range(cfg.num_layers):
        def keep(name: str, x: torch.Tensor) -> None:
            if name == "qkv":
                out.append(input_covariance(x))
        h = layer_forward(cfg, sd, i, h, cos, sin, hook=keep)
    return out


def _cumulative(svds: list[LayerSvd]) -> np.ndarray:
    return torch.stack([s.cumulative_energy for s in svds]).numpy()


def run_latent_lab(weights: LoadedWeights, settings: LatentSettings, progress: Progress | None = None,
                   ranks: tuple[int, ...] = RANKS) -> LatentLabResult:
    """Calibrate, factor every layer both ways, score each rank (and MQA's size) and MQA, answer the prompt three
    ways."""
    cfg = weights.config
    settings.check(cfg)
    t0 = time.perf_counter()
    say = progress or (lambda _msg, _frac: None)
    sd = fp32_state(weights)
    say("The full model writes the calibration and evaluation text (once per server)", 0.0)
    texts = reference_texts(weights)
    say("Calibrating: the inputs every layer's K and V projections read", 0.1)
    covariances = kv_input_covariances(weights, calibration_windows(weights, "chat", CALIBRATION_TOKENS, texts))
    svds = {"plain": [decompose(kv_weight(cfg, sd, i)) for i in range(cfg.num_layers)],
            "aware": [decompose(kv_weight(cfg, sd, i), covariances[i]) for i in range(cfg.num_layers)]}
    spectra = {k: _cumulative(v) for k, v in svds.items()}
    eval_set = build_eval_set(weights, [(list(q), list(a)) for q, a in texts.chat_eval[:EVAL_CHAT]])
    nan = float("nan")
    points = [LatentPoint("full", full_rank(cfg), score(weights, eval_set), 1.0)]
    mqa_rank = 2 * cfg.head_dim  # one K and one V head
    # MQA's size is always among the ranks: the page compares the two at the same cache.
    jobs = [(kind, r) for r in sorted({*ranks, mqa_rank}, reverse=True) for kind in ("plain", "aware")]
    jobs.append(("mqa", mqa_rank))
    for n, (kind, r) in enumerate(jobs):
        say(f"Scoring {KIND_LABELS[kind]} at {r} numbers a token and layer", 0.15 + 0.7 * n / len(jobs))
        layers = _layers(cfg, sd, svds, kind, r)
        variant = dataclasses.replace(weights, state_dict=equivalent_state(cfg, sd, layers))
        kept = float(spectra[kind][:, r - 1].mean()) if kind in spectra else nan
        points.append(LatentPoint(kind, r, score(variant, eval_set), kept))
    say("Answering the prompt with the cache holding only the latent", 0.88)
    prompt = weights.tokenizer.chat_prompt_ids(settings.prompt)
    eos, decode = cfg.eos_token_ids, weights.tokenizer.decode
    runs = [("GQA as trained (K and V cached)", _layers(cfg, sd, svds, "full", full_rank(cfg))),
            (f"{KIND_LABELS[settings.answer_method]}, rank {settings.answer_rank}",
             _layers(cfg, sd, svds, settings.answer_method, settings.answer_rank)),
            (KIND_LABELS["mqa"], _layers(cfg, sd, svds, "mqa", mqa_rank))]
    answers: list[Answer] = []
    for label, layers in runs:
        run = latent_greedy(cfg, sd, layers, prompt, settings.max_new_tokens, eos)
        ref = answers[0].run.tokens if answers else run.tokens
        answers.append(Answer(label, run, decode(list(run.tokens)), first_difference(run.tokens, ref)))
    say("Done", 1.0)
    return LatentLabResult(settings, full_rank(cfg), cfg.num_layers, len(prompt), tuple(points), spectra,
                           tuple(answers), time.perf_counter() - t0)


def _layers(cfg: ModelConfig, sd: dict[str, torch.Tensor], svds: dict[str, list[LayerSvd]], kind: PointKind,
            rank: int) -> list[LatentLayer]:
    if kind == "full":
        return [identity_layer(cfg, sd, i) for i in range(cfg.num_layers)]
    if kind == "mqa":
        return [mean_pooled_layer(cfg, sd, i) for i in range(cfg.num_layers)]
    return [s.truncate(rank) for s in svds[kind]]


def stored_latent_lab(weights: LoadedWeights, settings: LatentSettings,
                      progress: Progress | None = None) -> StoredResult[LatentLabResult]:
    """`run_latent_lab`'s result (every rank), kept on disk for CPU weights (engine/result_store.py): the same
    weights, settings and code give it back at once, with when it was computed and how long that took."""
    settings.check(weights.config)
    return stored_run("kv-latent-lab", weights, settings, lambda: run_latent_lab(weights, settings, progress))
