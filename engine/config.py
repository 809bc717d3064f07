"""Static configuration: the model's shape and the engine's knobs.

Both are frozen so a `StepRecord` or a page can hold them without fear of them changing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

SchedulerPolicy = Literal["continuous", "static"]
DRAFTERS = ("none", "ngram", "early_exit", "draft_model", "medusa", "eagle")
KernelBackend = Literal["auto", "triton", "torch"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Llama-family architecture. Defaults are SmolLM2-135M-Instruct."""

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_ids: tuple[int, ...] = (2, 0)  # <|im_end|> ends a ChatML turn; <|endoftext|> as backstop
    name: str = "SmolLM2-135M-Instruct"

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element (4 on the fp32 CPU path)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything a page can turn.

    `num_blocks` x `block_size` is the whole KV pool in tokens. `max_num_batched_tokens` is the
    per-step token budget shared by prefill chunks and decodes (vLLM v1's one rule).
    """

    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    policy: SchedulerPolicy = "continuous"
    chunked_prefill: bool = True
    enable_prefix_cache: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    kernel_backend: KernelBackend = "auto"
    cuda_graphs: bool = False
    # With cuda_graphs, steps with prefill tokens run as piecewise graphs too: everything but attention
    # captured per token-count bucket (engine/piecewise_graphs.py). Not while profiling kernels.
    prefill_graphs: bool = True
    # In those piecewise prefill steps, layers 1.. replay layer 0's attention launches on their own
    # tensors instead of going through the kernels' Python wrappers (kernels/launch_tape.py).
    replay_attention_launches: bool = True
    # Overlapped decode (engine/overlap.py): while the GPU computes a greedy decode step the host
    # schedules and launches the next one, reading the tokens a step late. Needs CUDA graphs.
    overlap_decode: bool = False
    # Programmatic dependent launch between the Triton kernels of a step (Hopper and newer, only
    # when kernels are not being profiled): each kernel starts while the previous one finishes.
    programmatic_launch: bool = True
    profile_kernels: bool = True
    # How a KV block is laid out in memory (engine/kv_pool.py): "auto" is head-major on CUDA (what the
    # Triton decode kernel streams fastest) and token-major on the CPU (what the torch reference
    # gathers fastest). Every layout gives the same tokens; tests pin one to check that.
    kv_layout: Literal["auto", "token_major", "head_major"] = "auto"
    weights: Literal["real", "random"] = "real"
    # "light" drops the per-block pool picture, block tables and per-request states from each
    # StepRecord: benchmarks with hundreds of requests and thousands of blocks need only timings.
    trace_detail: Literal["full", "light"] = "full"
    seed: int = 0
    # Speculative decoding (engine/speculative): which drafter proposes tokens ("none" = off), the
    # default drafted tokens per round (a request overrides it with add_request(spec_gamma=...)),
    # the early-exit drafter's layer count, and prompt lookup's n-gram sizes (single-token matches
    # are off by default: a frequent token matches everywhere and proposes noise).
    # "draft_model" is the distilled small model, "medusa"/"eagle" the tree drafters (weights in
    # engine/assets/spec_heads/); for trees, spec_gamma > 0 just switches speculation on and the tree
    # knobs below set its size: node budget, EAGLE depth, and the top-k of each expansion (Medusa:
    # how many ranks of each head the static tree may use).
    spec_drafter: Literal["none", "ngram", "early_exit", "draft_model", "medusa", "eagle"] = "none"
    spec_gamma: int = 4
    spec_draft_layers: int = 8
    spec_ngram_min: int = 2
    spec_ngram_max: int = 3
    spec_tree_nodes: int = 24
    spec_tree_depth: int = 5
    spec_tree_topk: int = 4
    # Trained drafters (draft model, Medusa, EAGLE) draft over the N most frequent answer tokens
    # (engine/speculative/draft_vocab.py); 0 = the full vocabulary. Verification is always full.
    spec_draft_vocab: int = 8192
    # Multi-LoRA serving (engine/lora): device slots for adapters (0 = no LoRA support) and the largest
    # rank a slot holds. A request names its adapter with add_request(adapter=...); adapters are
    # registered on the host (`LLMEngine.register_adapter`) and loaded into a slot at admission.
    max_loras: int = 0
    max_lora_rank: int = 8

    def __post_init__(self) -> None:
        positive = ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"EngineConfig.policy must be 'continuous' or 'static', got {self.policy!r}")
        if self.kernel_backend not in ("auto", "triton", "torch"):
            raise ValueError(f"EngineConfig.kernel_backend must be auto/triton/torch, got {self.kernel_backend!r}")
        if self.kv_layout not in ("auto", "token_major", "head_major"):
            raise ValueError(f"EngineConfig.kv_layout must be auto/token_major/head_major, got {self.kv_layout!r}")
        if self.spec_drafter not in DRAFTERS:
            raise ValueError(f"EngineConfig.spec_drafter must be one of {'/'.join(DRAFTERS)}, got {self.spec_drafter!r}")
        if not 0 <= self.spec_draft_vocab <= 1 << 20:
            raise ValueError(f"EngineConfig.spec_draft_vocab must be >= 0, got {self.spec_draft_vocab}")
        if not 1 <= self.spec_tree_nodes <= 128 or not 1 <= self.spec_tree_depth <= 16 or not 1 <= self.spec_tree_topk <= 16:
            raise ValueError("EngineConfig tree knobs: spec_tree_nodes in [1, 128], spec_tree_depth and "
                             f"spec_tree_topk in [1, 16]; got {self.spec_tree_nodes}, {self.spec_tree_depth}, "
                             f"{self.spec_tree_topk}")
        if self.overlap_decode and not self.cuda_graphs:
            raise ValueError("EngineConfig.overlap_decode needs cuda_graphs=True (it overlaps graph replays)")
        if not 0 <= self.max_loras <= 32 or not 1 <= self.max_lora_rank <= 128:
            raise ValueError(f"EngineConfig.max_loras must be in [0, 32] and max_lora_rank in [1, 128]; got "
                             f"{self.max_loras}, {self.max_lora_rank}")
        if self.max_loras and (self.overlap_decode or self.spec_drafter != "none"):
            raise ValueError("EngineConfig.max_loras > 0 cannot be combined with overlap_decode or a speculative "
                             "drafter (neither knows which adapter a row runs)")
        if not 0 <= self.spec_gamma <= 16:
            raise ValueError(f"EngineConfig.spec_gamma must be in [0, 16], got {self.spec_gamma}")
        if self.spec_draft_layers < 1 or not 1 <= self.spec_ngram_min <= self.spec_ngram_max:
            raise ValueError("EngineConfig.spec_draft_layers must be >= 1 and 1 <= spec_ngram_min <= spec_ngram_max")

    @property
    def pool_tokens(self) -> int:
        return self.block_size * self.num_blocks

    @property
    def kv_head_major(self) -> bool:
        """Whether the KV pool stores each block head-major (see kv_layout)."""
        if self.kv_layout == "auto":
            return self.device.split(":")[0] == "cuda"
        return self.kv_layout == "head_major"

    def to_dict(self) -> dict:
        return asdict(self)
