"""LoRA adapters on the live engine: merged into the weights, or served unmerged, many at once.

- `adapter.py`: the adapter record, its safetensors file, random adapters for timing.
- `merge.py`: W' = W + (alpha / r) B A, a plain checkpoint per fine-tune.
- `slots.py`: the adapters resident on the device (stacked A/B per fused linear, LRU slots).
- `manager.py`: the engine's bookkeeping: host registry, admission pins, each row's slot.
The batched update itself is a kernel family (`kernels/lora_ref.py`, `kernels/lora_triton.py`).
Turn it on with `EngineConfig(max_loras=4, max_lora_rank=8)`, `engine.register_adapter(...)`, and
`engine.add_request(prompt, params, adapter="name")`.
"""
from engine.lora.adapter import (ADAPTERS_DIR, TARGETS, LoraAdapter, bundled_adapters, load_adapter,
                                 random_adapter, save_adapter)
from engine.lora.merge import merged_state_dict, merged_weights

__all__ = ["ADAPTERS_DIR", "TARGETS", "LoraAdapter", "bundled_adapters", "load_adapter", "merged_state_dict",
           "merged_weights", "random_adapter", "save_adapter"]
