"""Programmatic dependent launch (PDL, Hopper's `griddepcontrol`) for our Triton kernels.

A kernel launched with `launch_pdl=True` may start while the previous kernel in the stream is still
running: it can read what does not depend on that kernel (weights, norm scales) and then calls
`tl.extra.cuda.gdc_wait()`, which returns once the previous kernel has completed and its writes are
visible. Each kernel calls `gdc_launch_dependents()` first, so the next one can be scheduled early.

Safety rule every PDL kernel here follows: no store and no read of a previous kernel's output before
`gdc_wait`. Then, by induction along the chain, no kernel can observe or overwrite the data of one
still running. Where the engine uses it: `Kernels._use_pdl` (kernels/dispatch.py); measurements in
bench/pdl_chain.py and bench/NOTES_kernels.md v7.
"""
from __future__ import annotations

import os

import torch


def pdl_supported(device: torch.device) -> bool:
    """PDL needs Hopper (sm_90) or newer; the interpreter has none."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool) -> dict[str, bool]:
    """Extra keyword arguments of a Triton kernel launch: PDL on, or nothing."""
    return {"launch_pdl": True} if pdl else {}
