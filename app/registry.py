"""The list of topic pages. `app/main.py` builds the navigation from it and the home page links to
every entry, so adding a page is: write `pages/NN_topic.py`, add one `PageSpec` here.

Entries without a `path` are planned topics: the home page lists them as "coming", the navigation
leaves them out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Section order and names follow the seed outline.
SECTIONS: tuple[str, ...] = ("Memory and attention", "Scheduling and decoding", "Serving",
                             "Serving post-trained models", "Test-time compute")


@dataclass(frozen=True, slots=True)
class PageSpec:
    title: str
    section: str
    summary: str
    icon: str
    path: str | None = None  # relative to the repo root; None = planned
    url_path: str | None = None

    @property
    def available(self) -> bool:
        return self.path is not None and (ROOT / self.path).is_file()

    @property
    def file(self) -> Path:
        assert self.path is not None
        return ROOT / self.path


HOME = PageSpec("Home", "", "What InferScope is and what is live.", ":material/home:", "pages/00_home.py", "home")

PAGES: tuple[PageSpec, ...] = (
    PageSpec("KV cache", "Memory and attention",
             "2 × layers × KV heads × head dim × bytes per number for every token, live: the cache growing, MHA/GQA/MQA, "
             "MLA's latent cache (released models' sizes, and retrofitted onto the live model by SVD, scored against "
             "MQA at the same size), long-context sizing, and decoding with vs without the cache timed on the model.",
             ":material/database:", "pages/01_kv_cache.py", "kv-cache"),
    PageSpec("Attention roofline", "Memory and attention",
             "The live kernels of every step on this machine's measured roofline: prefill near the compute "
             "roof, decode on the bandwidth slope; TTFT vs TPOT, kernel launches vs CUDA graphs, a batch-size "
             "calculator, and what decoding a block in parallel (diffusion LLMs) does to it.",
             ":material/speed:", "pages/02_attention_roofline.py", "attention-roofline"),
    PageSpec("PagedAttention", "Memory and attention",
             "The physical block pool, block tables, the free list, copy-on-write for parallel samples, "
             "and the measured waste of paged vs contiguous reservation.",
             ":material/grid_view:", "pages/03_paged_attention.py", "paged-attention"),
    PageSpec("FlashAttention-2", "Memory and attention",
             "The tile schedule, one row's running max and sum, and the N × N matrix never written, on the real "
             "Q, K, V of your prompt; time and error vs naive attention and SDPA; split-KV decoding (Flash-Decoding).",
             ":material/bolt:", "pages/05_flashattention.py", "flashattention"),
    PageSpec("KV quantization and eviction", "Memory and attention",
             "The same prompt decoded with the cache in FP8, INT8, INT4, INT2 or KIVI, or cut to a budget by a sliding "
             "window, StreamingLLM's attention sinks or H2O's heavy hitters: bytes per token against KL and agreement "
             "with the full cache, the text each writes, key outlier channels and which tokens each policy keeps.",
             ":material/compress:", "pages/13_kv_compression.py", "kv-quantization-eviction"),
    PageSpec("Radix prefix cache", "Memory and attention",
             "The radix tree of cached prompt prefixes growing as requests arrive: locks, LRU eviction in a "
             "small pool, hit rate, and prefill tokens and time saved, measured with the cache on and off.",
             ":material/account_tree:", "pages/06_radix_prefix_cache.py", "radix-prefix-cache"),
    PageSpec("Continuous batching", "Scheduling and decoding",
             "The batch rebuilt every iteration: arrivals, a Gantt of every request, preemption, and "
             "static vs continuous batching measured on the same requests.",
             ":material/view_timeline:", "pages/04_continuous_batching.py", "continuous-batching"),
    PageSpec("Chunked prefill", "Scheduling and decoding",
             "Prompt chunks co-scheduled with decodes under a token budget: tokens per iteration, measured "
             "iteration time and time between tokens, and the worst stall with chunking on vs off.",
             ":material/splitscreen:", "pages/09_chunked_prefill.py", "chunked-prefill"),
    PageSpec("Speculative decoding", "Scheduling and decoding",
             "Draft, verify, accept with min(1, p/q): every round's drafts, p, q and uniform draws, the rolled-back "
             "KV slots, the closed form vs measured acceptance, prompt lookup vs early exit vs plain decoding, and "
             "self-speculation from a low-bit copy of the model's own KV cache (QuantSpec).",
             ":material/fast_forward:", "pages/07_speculative_decoding.py", "speculative-decoding"),
    PageSpec("Medusa and EAGLE", "Scheduling and decoding",
             "Heads on the model's own hidden states draft a tree; one pass with a tree attention mask verifies "
             "every branch: the tree step by step, its mask, τ over time, tree size vs cost, Medusa vs EAGLE.",
             ":material/park:", "pages/08_medusa_eagle.py", "medusa-eagle"),
    PageSpec("Constrained decoding", "Scheduling and decoding",
             "A JSON schema, a regex or a list of choices masks the logits before every token: what the grammar "
             "allowed, where it overrode the model, jump-forward over text with no choice, and free vs masked "
             "output measured on the same prompt.",
             ":material/data_object:", "pages/12_constrained_decoding.py", "constrained-decoding"),
    PageSpec("Disaggregated prefill/decode", "Serving",
             "A prefill worker and a decode worker with their own KV pools: the prompt's KV blocks handed over "
             "through shared memory, both workers on one time axis, and colocated vs chunked vs disaggregated "
             "measured on the same requests.",
             ":material/swap_horiz:", "pages/10_disaggregated.py", "disaggregated-prefill-decode"),
    PageSpec("Latency SLOs and goodput", "Serving",
             "The live engine under Poisson load at several request rates: every request's TTFT and TPOT against "
             "targets you set, SLO attainment and goodput per batch cap, token budget or output cap, and one run "
             "on engine time, request by request.",
             ":material/timer:", "pages/14_slo_goodput.py", "latency-slo-goodput"),
    PageSpec("Parallelism for serving", "Serving",
             "The live model split by matrix over tensor-parallel ranks (the same tokens, a third of the weights "
             "and KV cache each, 62 collectives a step) and by layer over pipeline stages (a Gantt of measured stage "
             "times, the bubble); a rank's compute on an H200, the collectives over real processes here, and expert "
             "parallelism's memory, traffic and load imbalance.",
             ":material/lan:", "pages/19_parallelism.py", "parallelism"),
    PageSpec("Weight-only quantization", "Serving post-trained models",
             "The live model's linears rounded to 4 bits (or 8, 3, 2) by round-to-nearest, AWQ and GPTQ (also "
             "act-order), calibrated on its own chat answers, on prose or on random tokens: size against KL and "
             "agreement with the full model, "
             "the answer each checkpoint writes, the error layer by layer and the activation outliers behind it.",
             ":material/scale:", "pages/15_weight_quantization.py", "weight-quantization"),
    PageSpec("Merge the LoRA or serve it", "Serving post-trained models",
             "Three LoRA fine-tunes of the live model (pirate, terse, bullets): merged into the weights or served "
             "beside them, the same tokens either way; what each costs per decode step, measured, and in memory "
             "for one fine-tune or a hundred; the update BA, rank r, layer by layer.",
             ":material/merge:", "pages/16_lora_merge.py", "lora-merge-or-serve"),
    PageSpec("Multi-LoRA serving", "Serving post-trained models",
             "Requests for different adapters in one batch, step by step: the shared base GEMM and each adapter's "
             "rows (SGMV), the device's adapter slots loading and evicting, requests waiting for a slot, and "
             "mixed batches vs one deployment per fine-tune measured on the same requests.",
             ":material/hub:", "pages/17_multi_lora.py", "multi-lora"),
    PageSpec("FP8, FP4 and SmoothQuant", "Serving post-trained models",
             "Activations quantized as well as weights (INT8, FP8 E4M3, FP4 with block scales), so tensor cores could "
             "run at low precision: the few activation channels far larger than the rest, SmoothQuant moving that "
             "difficulty into the weights, and KL and agreement with the full model for each format.",
             ":material/speed:", "pages/18_activation_quantization.py", "activation-quantization"),
    PageSpec("Inference-time compute scaling", "Test-time compute",
             "More tokens for better answers: N samples sharing the prompt's KV blocks, majority vote vs the model's "
             "own certainty vs an oracle, accuracy vs tokens spent measured on a task set, and s1 budget forcing "
             "(forced “Wait,” and answer cue).",
             ":material/psychology:", "pages/11_test_time_compute.py", "test-time-compute"),
)


def available_pages() -> list[PageSpec]:
    return [p for p in PAGES if p.available]


def pages_by_section(include_planned: bool = False) -> dict[str, list[PageSpec]]:
    out: dict[str, list[PageSpec]] = {s: [] for s in SECTIONS}
    for p in PAGES:
        if include_planned or p.available:
            out.setdefault(p.section, []).append(p)
    return {s: ps for s, ps in out.items() if ps}
