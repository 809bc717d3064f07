"""What this server runs on: which weights, which device, and the one cached copy of the weights.

Weights are loaded once per server process (`st.cache_resource`) and shared read-only by every
browser session's engine. `INFERSCOPE_WEIGHTS=random` swaps in random weights of the same shape
(tests, machines without the GGUF); `INFERSCOPE_DEVICE` overrides the device.
"""
from __future__ import annotations

import os
from typing import Literal

import streamlit as st
import torch

from engine.weights import LoadedWeights, load_weights

WeightsMode = Literal["real", "random"]


def weights_mode() -> WeightsMode:
    mode = os.environ.get("INFERSCOPE_WEIGHTS", "real").strip().lower()
    return "random" if mode == "random" else "real"


def device() -> str:
    return os.environ.get("INFERSCOPE_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def device_label() -> str:
    """Where the engine runs, for a sentence: "the CPU" or the GPU's name."""
    dev = device()
    return "the CPU" if dev == "cpu" else torch.cuda.get_device_name(torch.device(dev))


def dtype_name() -> str:
    # fp32 on the CPU reference path (the cached weights are fp32); bf16 on a GPU.
    return "float32" if device() == "cpu" else "bfloat16"


def server_engine_settings() -> dict[str, str]:
    """The EngineConfig fields the server decides (a scenario cannot set these)."""
    return {"device": device(), "dtype": dtype_name(), "weights": weights_mode()}


@st.cache_resource(show_spinner="Loading SmolLM2-135M-Instruct (the first load converts the GGUF; later ones take seconds)…")
def _cached_weights(mode: WeightsMode, device_name: str, dtype: str) -> LoadedWeights:
    return load_weights(mode, device=device_name, dtype=getattr(torch, dtype))


def shared_weights() -> LoadedWeights:
    return _cached_weights(weights_mode(), device(), dtype_name())


def backend_summary(kernel_backend: str = "auto") -> str:
    """Plain words for the home page and sidebar; says loudly when we are on the CPU fallback."""
    from kernels.dispatch import resolve_backend

    dev = torch.device(device())
    try:
        backend = resolve_backend(kernel_backend, dev)
    except ValueError as e:
        return f"unavailable ({e})"
    if dev.type == "cpu":
        return "torch reference path on the CPU (no GPU on this server; Triton kernels are not used)"
    if backend == "triton":
        return f"Triton kernels on {torch.cuda.get_device_name(dev)}"
    return f"torch reference kernels on {dev}"
