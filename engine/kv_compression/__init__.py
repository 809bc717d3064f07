"""KV cache compression on the real model: storage formats (FP8, INT8, INT4, INT2, KIVI) and eviction
policies (sliding window, StreamingLLM sinks, H2O heavy hitters), measured against the full cache."""
from engine.kv_compression.formats import FORMATS, KVFormat, get_format
from engine.kv_compression.lab import KVLab, LabResult, Variant, VariantResult
from engine.kv_compression.policies import EvictionPolicy

__all__ = ["FORMATS", "EvictionPolicy", "KVFormat", "KVLab", "LabResult", "Variant", "VariantResult", "get_format"]
