"""Ready-made scenarios, small enough to step comfortably on a 2-core CPU (a decode step 50-150 ms, a prefill of
a few hundred tokens up to a second).

Each page offers its own list; the first is the page's default. Prompts go through the chat
template (SmolLM2 adds a ~30-token system turn), so every prompt is at least a couple of blocks.
"""
from __future__ import annotations

from app.scenarios import RequestSpec, Scenario

KV_CACHE: list[Scenario] = [
    Scenario(
        name="One request, 40 new tokens",
        description="A single chat request decoding 40 tokens: watch the cache grow one token per step.",
        engine={"block_size": 16, "num_blocks": 64, "max_model_len": 512},
        requests=(RequestSpec("Explain in two sentences why a KV cache makes decoding faster.",
                              max_tokens=40, ignore_eos=True),),
    ),
    Scenario(
        name="Two requests, one joins late",
        description="A second request arrives at step 10; its prompt lands in the cache all at once (prefill).",
        engine={"block_size": 16, "num_blocks": 64, "max_model_len": 512},
        requests=(
            RequestSpec("Name three uses of a hash map.", max_tokens=32, ignore_eos=True),
            RequestSpec("Write a short poem about memory.", max_tokens=20, arrival_step=10, ignore_eos=True),
        ),
    ),
]

PAGED_ATTENTION: list[Scenario] = [
    Scenario(
        name="Two samples from one prompt (copy-on-write)",
        description="r0 samples n = 2 continuations at temperature 0.8: both share the prompt's blocks "
                    "until the first write into the shared tail block forces a copy. r1 and r2 arrive later.",
        engine={"block_size": 8, "num_blocks": 48, "max_model_len": 256},
        requests=(
            RequestSpec("Write a haiku about GPUs.", max_tokens=24, temperature=0.8, seed=7, n=2, ignore_eos=True),
            RequestSpec("What is paging in an operating system?", max_tokens=16, arrival_step=3, ignore_eos=True),
            RequestSpec("Say hello in French.", max_tokens=8, arrival_step=6, ignore_eos=True),
        ),
    ),
    Scenario(
        name="Four requests of different lengths",
        description="Requests finish at different times; their blocks go back to the free list and are reused.",
        engine={"block_size": 8, "num_blocks": 48, "max_model_len": 256},
        requests=(
            RequestSpec("List two prime numbers.", max_tokens=6, ignore_eos=True),
            RequestSpec("Describe a cat in one sentence.", max_tokens=20, ignore_eos=True),
            RequestSpec("What is 2 + 2?", max_tokens=10, arrival_step=4, ignore_eos=True),
            RequestSpec("Give a tip for writing clean code.", max_tokens=16, arrival_step=8, ignore_eos=True),
        ),
    ),
    Scenario(
        name="Big blocks (block_size 32)",
        description="The same idea with 32-token blocks: fewer block-table entries, more internal waste per request.",
        engine={"block_size": 32, "num_blocks": 16, "max_model_len": 256},
        requests=(
            RequestSpec("Write a haiku about GPUs.", max_tokens=20, temperature=0.8, seed=7, n=2, ignore_eos=True),
            RequestSpec("What is paging in an operating system?", max_tokens=12, arrival_step=2, ignore_eos=True),
        ),
    ),
]

CONTINUOUS_BATCHING: list[Scenario] = [
    Scenario(
        name="Staggered arrivals, mixed lengths",
        description="Five requests arrive over the first steps and want different numbers of tokens.",
        engine={"block_size": 16, "num_blocks": 64, "max_num_seqs": 8, "max_model_len": 256},
        requests=(
            RequestSpec("Tell me a fun fact about octopuses.", max_tokens=28, ignore_eos=True),
            RequestSpec("What is the capital of Italy?", max_tokens=6, ignore_eos=True),
            RequestSpec("Give me a synonym for fast.", max_tokens=8, arrival_step=2, ignore_eos=True),
            RequestSpec("Write one line about the sea.", max_tokens=14, arrival_step=4, ignore_eos=True),
            RequestSpec("How do plants make food?", max_tokens=20, arrival_step=7, ignore_eos=True),
        ),
    ),
    Scenario(
        name="Small KV pool: preemption",
        description="Three requests that cannot all fit in a 14-block pool: when the pool runs out, the running "
                    "request admitted last is preempted (its blocks freed) and recomputed when memory frees up.",
        engine={"block_size": 8, "num_blocks": 14, "max_num_seqs": 8, "max_model_len": 128},
        requests=(
            RequestSpec("Describe a rainy day.", max_tokens=30, ignore_eos=True),
            RequestSpec("Describe a sunny day.", max_tokens=30, ignore_eos=True),
            RequestSpec("Describe a snowy day.", max_tokens=30, arrival_step=1, ignore_eos=True),
        ),
    ),
    Scenario(
        name="One long request, many short ones",
        description="Static batching makes the short requests behind the long one wait for the whole batch.",
        engine={"block_size": 16, "num_blocks": 64, "max_num_seqs": 3, "max_model_len": 256},
        requests=(
            RequestSpec("Write a short story about a robot.", max_tokens=36, ignore_eos=True),
            RequestSpec("Say yes.", max_tokens=4, ignore_eos=True),
            RequestSpec("Say no.", max_tokens=4, ignore_eos=True),
            RequestSpec("Count to three.", max_tokens=6, arrival_step=1, ignore_eos=True),
            RequestSpec("Name a colour.", max_tokens=4, arrival_step=2, ignore_eos=True),
            RequestSpec("Name a fruit.", max_tokens=4, arrival_step=3, ignore_eos=True),
        ),
    ),
]

# ---- Radix prefix cache (pages/06) and chunked prefill (pages/09) --------------------------------

# SmolLM2's chat template, written out so a scenario can hold a whole conversation as one raw prompt
# (chat=False): turn 2's prompt is turn 1's prompt + answer + a new user message, token for token.
_SYSTEM_TURN = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def chatml(*turns: str) -> str:
    """ChatML text for alternating user/assistant turns, ending with the assistant prompt."""
    body = "".join(f"<|im_start|>{'user' if i % 2 == 0 else 'assistant'}\n{t}<|im_end|>\n" for i, t in enumerate(turns))
    return _SYSTEM_TURN + body + "<|im_start|>assistant\n"


_FEW_SHOT = (
    "Classify the sentiment of each review as positive or negative.\n"
    "Review: The battery lasts all day and the screen is bright. Sentiment: positive\n"
    "Review: It stopped working after a week and support never answered. Sentiment: negative\n"
    "Review: Setup took two minutes and it just works. Sentiment: positive\n"
    "Review: The fan is loud and the case feels cheap. Sentiment: negative\n"
    "Review: Great value for the price, I would buy it again. Sentiment: positive\n"
    "Review: The keyboard keys started sticking within a month. Sentiment: negative\n"
)
# The answers below are what SmolLM2-135M-Instruct really answers (greedy, max_tokens 12 and 10), so
# with the real weights a follow-up turn finds the previous answer's blocks in the tree too.
_Q_A1, _A_A1 = "What is a KV cache? Answer in one sentence.", "A KV cache is a type of cache used in computer"
_Q_A2, _A_A2 = "Why does it make decoding faster?", "A KV cache is designed to speed up decoding"
_Q_B1, _A_B1 = "Name one planet in our solar system.", "The planet closest to our solar system is Venus, but it"
_RADIX_ENGINE = {"block_size": 8, "num_blocks": 96, "max_model_len": 384, "enable_prefix_cache": True}

RADIX_PREFIX_CACHE: list[Scenario] = [
    Scenario(
        name="Few-shot prompts sharing a long prefix",
        description="Four classification requests behind the same six-example prompt (~150 tokens): the "
                    "first computes the prefix, the others find it in the tree and prefill only their review.",
        engine=_RADIX_ENGINE,
        requests=tuple(
            RequestSpec(_FEW_SHOT + f"Review: {review} Sentiment:", max_tokens=4, arrival_step=2 * i,
                        ignore_eos=True, request_id=f"shot{i}")
            for i, review in enumerate(("Arrived broken and the seller ignored me.", "Fast, quiet and easy to use.",
                                        "The colours are lovely and it charges quickly.",
                                        "Too heavy to carry and the strap broke."))),
    ),
    Scenario(
        name="Multi-turn chat (two conversations)",
        description="Two chats; each later turn's prompt is the earlier prompt + the model's answer + a new "
                    "user message (raw ChatML, chat unticked). Turn 2 and 3 reuse the conversation so far.",
        engine=_RADIX_ENGINE,
        requests=(
            RequestSpec(chatml(_Q_A1), chat=False, max_tokens=12, ignore_eos=True, request_id="A-turn1"),
            RequestSpec(chatml(_Q_B1), chat=False, max_tokens=12, arrival_step=1, ignore_eos=True,
                        request_id="B-turn1"),
            RequestSpec(chatml(_Q_A1, _A_A1, _Q_A2), chat=False, max_tokens=10, arrival_step=13, ignore_eos=True,
                        request_id="A-turn2"),
            RequestSpec(chatml(_Q_B1, _A_B1, "How far is it from the Sun?"), chat=False, max_tokens=8,
                        arrival_step=14, ignore_eos=True, request_id="B-turn2"),
            RequestSpec(chatml(_Q_A1, _A_A1, _Q_A2, _A_A2, "Give an example."), chat=False, max_tokens=8,
                        arrival_step=24, ignore_eos=True, request_id="A-turn3"),
        ),
    ),
    Scenario(
        name="Unrelated prompts (baseline, ~0 hits)",
        description="Raw prompts with nothing in common (no chat template: its system turn would itself be "
                    "a shared prefix). Every admission is a miss; the tree only grows.",
        engine=_RADIX_ENGINE,
        requests=tuple(RequestSpec(p, chat=False, max_tokens=8, arrival_step=i, ignore_eos=True)
                       for i, p in enumerate(("The history of the bicycle begins in",
                                              "Photosynthesis converts light into",
                                              "In 1969 the first humans landed on",
                                              "A good recipe for pancakes needs"))),
    ),
    Scenario(
        name="Small pool: LRU eviction",
        description="A 12-block pool (96 tokens). Finished requests stay cached until a new prompt needs "
                    "the room: unlocked leaves are evicted, least recently used first. The shared system "
                    "turn, touched by every request, survives longest.",
        engine={"block_size": 8, "num_blocks": 12, "max_model_len": 96, "enable_prefix_cache": True},
        requests=tuple(RequestSpec(p, max_tokens=6, arrival_step=3 * i, ignore_eos=True)
                       for i, p in enumerate(("Describe a rainy day in one sentence.",
                                              "Describe a sunny beach in one sentence.",
                                              "Describe a snowy mountain in one sentence.",
                                              "Describe a busy city street in one sentence.",
                                              "Describe a quiet forest at night in one sentence."))),
    ),
]

_LONG_NOTES = (
    "Summarise the following notes in two sentences.\n"
    "Serving a language model to many users at once is mostly a scheduling problem. Every request has two "
    "phases. In the prefill phase the whole prompt is pushed through the model in one go: hundreds or "
    "thousands of tokens are processed in parallel, the matrix multiplications are large, and the GPU is "
    "busy doing arithmetic. In the decode phase the model produces one new token per step for each request; "
    "each step reads all of the weights and the whole key-value cache but does very little arithmetic, so "
    "decode steps are limited by memory bandwidth. A server batches the decode steps of many requests "
    "together to share the cost of reading the weights. The trouble starts when a new request with a long "
    "prompt arrives while others are decoding. If the server runs the whole prompt in one iteration, that "
    "iteration takes much longer than a decode step, and every user who is waiting for their next token "
    "sees the text stop for a moment. Chunked prefill splits the long prompt into pieces that fit a fixed "
    "token budget and runs each piece together with the ongoing decodes, so no single iteration is much "
    "longer than the others. The price is that the long prompt itself takes a few more iterations before "
    "its first token appears, and its chunks must read the keys and values of the chunks before them."
)
_SHORT_CHATS = (
    RequestSpec("Tell me a fun fact about octopuses.", max_tokens=24, ignore_eos=True, request_id="chat1"),
    RequestSpec("Give me a tip for learning to cook.", max_tokens=24, ignore_eos=True, request_id="chat2"),
    RequestSpec("Why do cats purr?", max_tokens=24, ignore_eos=True, request_id="chat3"),
)

CHUNKED_PREFILL: list[Scenario] = [
    Scenario(
        name="Three chats decoding, a ~300-token prompt arrives (budget 64)",
        description="Three short chats are decoding when a long summarisation prompt arrives at step 4. With a "
                    "64-token budget its prefill is split into chunks that ride along with the decodes.",
        engine={"block_size": 16, "num_blocks": 64, "max_model_len": 512, "max_num_batched_tokens": 64,
                "chunked_prefill": True},
        requests=_SHORT_CHATS + (RequestSpec(_LONG_NOTES, max_tokens=6, arrival_step=4, ignore_eos=True,
                                             request_id="long"),),
    ),
    Scenario(
        name="The same with a 128-token budget",
        description="A bigger budget: fewer, larger chunks, so each of those steps is slower, but the long "
                    "prompt gets its first token sooner.",
        engine={"block_size": 16, "num_blocks": 64, "max_model_len": 512, "max_num_batched_tokens": 128,
                "chunked_prefill": True},
        requests=_SHORT_CHATS + (RequestSpec(_LONG_NOTES, max_tokens=6, arrival_step=4, ignore_eos=True,
                                             request_id="long"),),
    ),
]

# ---- Speculative decoding (pages/07) -------------------------------------------------------------

# The "copy" workload of bench/spec.py: the answer reuses the prompt's text, so prompt lookup (n-gram)
# finds its drafts in the prompt; open chat has little to copy.
_LIGHTHOUSE = ("The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night its "
               "keeper climbed the narrow stairs, cleaned the great lens and lit the lamp, so that the fishing boats "
               "could find their way home through the fog.")
_TYPOS = _LIGHTHOUSE.replace("lighthouse", "lighthuose").replace("narrow", "narow").replace("fishing", "fishng")
SPEC_COPY_PROMPT = "Correct the spelling mistakes in the following text and write out the corrected text:\n\n" + _TYPOS
SPEC_CHAT_PROMPT = "Write a short story about a robot who learns to paint."
_SPEC_ENGINE = {"block_size": 16, "num_blocks": 64, "max_model_len": 512, "max_num_seqs": 4, "spec_draft_layers": 16}

SPECULATIVE: list[Scenario] = [
    Scenario(
        name="Copy-edit a paragraph, prompt lookup (n-gram), γ = 4",
        description="The answer repeats the prompt's text: prompt lookup copies the tokens that followed the "
                    "last 2-3 tokens' earlier occurrence, and the target accepts most of them (greedy).",
        engine={**_SPEC_ENGINE, "spec_drafter": "ngram", "spec_gamma": 4},
        requests=(RequestSpec(SPEC_COPY_PROMPT, max_tokens=48, ignore_eos=True, request_id="copy"),),
    ),
    Scenario(
        name="Open chat, prompt lookup (n-gram), γ = 4",
        description="A story has little to copy from its prompt: lookup often finds no match (plain decoding) "
                    "and its guesses are mostly rejected.",
        engine={**_SPEC_ENGINE, "spec_drafter": "ngram", "spec_gamma": 4},
        requests=(RequestSpec(SPEC_CHAT_PROMPT, max_tokens=40, ignore_eos=True, request_id="chat"),),
    ),
    Scenario(
        name="Copy-edit, early-exit drafter (16 of 30 layers), γ = 3",
        description="The draft model is the target's own first 16 layers + its LM head: it costs about half a "
                    "target pass per draft, and on this 135M model it rarely agrees with the full model.",
        engine={**_SPEC_ENGINE, "spec_drafter": "early_exit", "spec_gamma": 3, "spec_draft_layers": 16},
        requests=(RequestSpec(SPEC_COPY_PROMPT, max_tokens=32, ignore_eos=True, request_id="copy"),),
    ),
    Scenario(
        name="Sampled (temperature 0.8), early exit (26 layers): u against min(1, p/q)",
        description="Sampling mode: each draft is kept iff a uniform u < p/q, and a rejection is replaced by a "
                    "draw from the residual max(0, p − q). Early exit has a real q, so p/q varies; 26 of 30 "
                    "layers so that some drafts survive (and c is close to 1: no speedup).",
        engine={**_SPEC_ENGINE, "spec_drafter": "early_exit", "spec_gamma": 3, "spec_draft_layers": 26},
        requests=(RequestSpec(SPEC_COPY_PROMPT, max_tokens=32, temperature=0.8, seed=3, ignore_eos=True,
                              request_id="copy-T0.8"),),
    ),
    Scenario(
        name="Sampled (temperature 0.7), prompt lookup, copy + chat together",
        description="Two requests in one batch, both sampled: with prompt lookup q = 1, so a draft survives iff "
                    "u < p. The copy request keeps long runs; the chat request rarely has drafts.",
        engine={**_SPEC_ENGINE, "spec_drafter": "ngram", "spec_gamma": 4},
        requests=(RequestSpec(SPEC_COPY_PROMPT, max_tokens=40, temperature=0.7, seed=1, ignore_eos=True,
                              request_id="copy"),
                  RequestSpec(SPEC_CHAT_PROMPT, max_tokens=40, temperature=0.7, seed=2, ignore_eos=True,
                              request_id="chat")),
    ),
]


# ---- Medusa and EAGLE (pages/08) -----------------------------------------------------------------

# Prompts whose topics are not in training/prompts.py (what the heads were trained on).
TREE_CHAT_PROMPT = "How does a refrigerator keep food cold?"
TREE_ADVICE_PROMPT = "Give me some advice for writing a good cover letter."
_TREE_ENGINE = {"block_size": 16, "num_blocks": 96, "max_model_len": 512, "max_num_seqs": 4, "spec_gamma": 1}

TREE_SPEC: list[Scenario] = [
    Scenario(
        name="EAGLE dynamic tree (24 nodes, depth 5, top-4), open question",
        description="The EAGLE layer drafts from the target's own hidden state, expands the 4 likeliest nodes "
                    "of each depth and keeps the 24 likeliest paths' nodes; one target pass checks them all.",
        engine={**_TREE_ENGINE, "spec_drafter": "eagle", "spec_tree_nodes": 24, "spec_tree_depth": 5,
                "spec_tree_topk": 4},
        requests=(RequestSpec(TREE_CHAT_PROMPT, max_tokens=48, ignore_eos=True, request_id="fridge"),),
    ),
    Scenario(
        name="Medusa static tree (24 nodes, 4 heads), open question",
        description="Four Medusa heads each guess one position further ahead from the same hidden state; a "
                    "fixed tree of their top-k combinations is verified in one pass.",
        engine={**_TREE_ENGINE, "spec_drafter": "medusa", "spec_tree_nodes": 24, "spec_tree_topk": 4},
        requests=(RequestSpec(TREE_CHAT_PROMPT, max_tokens=48, ignore_eos=True, request_id="fridge"),),
    ),
    Scenario(
        name="EAGLE, two requests in one batch (each with its own tree)",
        description="Continuous batching with trees: both requests verify their own tree in the same target "
                    "pass, with one tree mask each.",
        engine={**_TREE_ENGINE, "spec_drafter": "eagle", "spec_tree_nodes": 16, "spec_tree_depth": 4,
                "spec_tree_topk": 3},
        requests=(RequestSpec(TREE_CHAT_PROMPT, max_tokens=40, ignore_eos=True, request_id="fridge"),
                  RequestSpec(TREE_ADVICE_PROMPT, max_tokens=40, ignore_eos=True, request_id="letter",
                              arrival_step=2)),
    ),
    Scenario(
        name="EAGLE sampled (temperature 0.7): children tried in turn",
        description="Sampling mode: a node's children are tried in order, each accepted with its share of the "
                    "target's probability left after the rejected siblings; the output keeps the target's "
                    "distribution.",
        engine={**_TREE_ENGINE, "spec_drafter": "eagle", "spec_tree_nodes": 24, "spec_tree_depth": 5,
                "spec_tree_topk": 4},
        requests=(RequestSpec(TREE_ADVICE_PROMPT, max_tokens=40, temperature=0.7, seed=5, ignore_eos=True,
                              request_id="letter-T0.7"),),
    ),
]

# ---- Disaggregated prefill/decode (pages/10) ---------------------------------------------------------

_DISAGG_ENGINE = {"block_size": 16, "num_blocks": 64, "max_model_len": 512, "max_num_batched_tokens": 512}

DISAGGREGATED: list[Scenario] = [
    Scenario(
        name="Three chats decoding, a ~300-token prompt arrives",
        description="Three short chats are decoding when a long summarisation prompt arrives at step 4. The "
                    "prefill worker computes it while the decode worker keeps the chats going; then its KV moves.",
        engine=_DISAGG_ENGINE,
        requests=_SHORT_CHATS + (RequestSpec(_LONG_NOTES, max_tokens=8, arrival_step=4, ignore_eos=True,
                                             request_id="long"),),
    ),
    Scenario(
        name="Two long prompts back to back",
        description="Two long prompts arrive one step apart while chats decode: the second waits for the prefill "
                    "worker (its TTFT grows), the decode worker's iterations stay even.",
        engine=_DISAGG_ENGINE,
        requests=_SHORT_CHATS[:2] + (
            RequestSpec(_LONG_NOTES, max_tokens=8, arrival_step=3, ignore_eos=True, request_id="long1"),
            RequestSpec(_LONG_NOTES.replace("two sentences", "one sentence"), max_tokens=8, arrival_step=4,
                        ignore_eos=True, request_id="long2")),
    ),
    Scenario(
        name="A small decode pool: handoffs wait for room",
        description="Each worker has 8 blocks of 16 tokens and every chat needs 3: the decode worker holds two at "
                    "a time, so the other handoffs wait in shared memory until a chat finishes and frees its blocks.",
        engine={"block_size": 16, "num_blocks": 8, "max_model_len": 128, "max_num_batched_tokens": 256},
        requests=tuple(RequestSpec(p, max_tokens=k, ignore_eos=True, request_id=f"chat{i + 1}")
                       for i, (p, k) in enumerate((("Tell me a fun fact about octopuses.", 8), ("Why do cats purr?", 6),
                                                   ("Give me a tip for learning to cook.", 8),
                                                   ("Name a famous bridge.", 5), ("What is a prime number?", 7)))),
    ),
]

# Multi-LoRA: the bundled adapters (engine/assets/adapters: pirate, terse, bullets) and the base model,
# mixed in one queue. Answers end at the end of turn, so the terse adapter's requests leave early.
_LORA_ENGINE = {"block_size": 16, "num_blocks": 128, "max_num_seqs": 8, "max_model_len": 512, "max_loras": 2,
                "max_lora_rank": 8}
_LORA_REQUESTS = (
    RequestSpec("What is a good way to start learning to cook?", max_tokens=40, adapter="pirate"),
    RequestSpec("Why is the sky blue?", max_tokens=40, adapter="terse"),
    RequestSpec("How can I sleep better?", max_tokens=40, adapter="bullets"),
    RequestSpec("What is a GPU?", max_tokens=40),
    RequestSpec("Tell me about the moon.", max_tokens=40, arrival_step=2, adapter="pirate"),
    RequestSpec("How do I keep a house plant healthy?", max_tokens=40, arrival_step=3, adapter="bullets"),
    RequestSpec("What does a compiler do?", max_tokens=40, arrival_step=4, adapter="terse"),
    RequestSpec("Give me a tip for writing emails.", max_tokens=40, arrival_step=5),
)
MULTI_LORA: list[Scenario] = [
    Scenario(
        name="Three fine-tunes and the base model, two adapter slots",
        description="Eight requests for three LoRA fine-tunes and the base model share one engine. The device "
                    "holds two adapters at a time: a request whose adapter has no slot waits until one frees.",
        engine=_LORA_ENGINE, requests=_LORA_REQUESTS),
    Scenario(
        name="A slot for every adapter",
        description="The same requests with three slots: every adapter stays resident, nobody waits, and every "
                    "step's batch mixes all of them.",
        engine={**_LORA_ENGINE, "max_loras": 3}, requests=_LORA_REQUESTS),
    Scenario(
        name="One slot: adapters take turns",
        description="One slot: only one fine-tune's requests run at a time beside the base model's, and every "
                    "switch loads an adapter (S-LoRA swaps them in from host memory).",
        engine={**_LORA_ENGINE, "max_loras": 1}, requests=_LORA_REQUESTS),
]
