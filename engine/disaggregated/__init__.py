"""Disaggregated prefill/decode: a prefill worker and a decode worker, each an `LLMEngine` with its own
KV pool, and the prompt's KV handed from one to the other (seed chapter 10).

`DisaggregatedEngine` steps both like one engine; `engine.disaggregated.transport` moves the KV bytes.
"""
from engine.disaggregated.cluster import DisaggregatedEngine
from engine.disaggregated.records import ClusterRequestState, ClusterStepRecord, KVHandoff, WorkerStep

__all__ = ["DisaggregatedEngine", "ClusterRequestState", "ClusterStepRecord", "KVHandoff", "WorkerStep"]
