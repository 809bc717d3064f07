"""Parallelism for serving, run for real on one machine.

Tensor parallelism (`tensor_parallel.py`): every rank holds a slice of each layer's heads and MLP channels and
a slice of the vocabulary; the ranks' partial results meet in all-reduces (`collectives.py`). On the CPU the
ranks take turns in one process, each timed; under torch.distributed (bench/parallel.py on several GPUs) the
same per-rank functions run one per process over NCCL.

Pipeline parallelism (`pipeline.py`): the layers split into stages, micro-batches flow through them; the
stages really run and are timed, and the schedule is laid out from those times.

Expert parallelism (`expert_math.py`): this model has no experts, so that part is arithmetic over published
MoE shapes, and says so.
"""
