"""Speculative decoding: a cheap drafter proposes gamma tokens, the target verifies them in one pass.

Turn it on with `EngineConfig(spec_drafter="ngram" | "early_exit" | "draft_model" | "medusa" | "eagle",
spec_gamma=4)`; a request can
choose its own gamma with `engine.add_request(prompt, params, spec_gamma=g)` (0 = plain decoding for
that request). Greedy requests emit exactly the tokens plain greedy decoding emits; sampled requests
emit tokens distributed exactly as the target's `filtered_probs` (temperature / top-k / top-p), drawn
with the request's own seeded generator (reproducible for a given seed, but not the same tokens as a
non-speculative run with that seed: the random numbers are spent differently).

Pieces
------
- `drafters.py`: `Drafter.propose(seq, gamma) -> DraftProposal(tokens, q_probs | None, q_of_tokens,
  detail)`, `propose_batch`, and `max_proposal` (asked before scheduling).
  `PromptLookupDrafter` ("ngram", deterministic: one-hot q), `EarlyExitDrafter` ("early_exit":
  the target's first `spec_draft_layers` layers + final norm + tied LM head, sharing its KV pool) and
  `DraftModelDrafter` ("draft_model": a 2-layer model distilled from the target, its own KV pool
  indexed by the target's block tables, mirrored on every target pass).
- `tree_drafters.py`: `MedusaDrafter` ("medusa", static tree over K heads' top-k) and `EagleDrafter`
  ("eagle", one decoder layer drafting a dynamic tree), both reading the target's hidden states
  (`FeatureStore`); knobs `spec_tree_nodes`, `spec_tree_depth`, `spec_tree_topk`. For them
  `spec_gamma` > 0 only switches speculation on (per request too: `spec_gamma=0` = plain).
- `tree.py`: `DraftTree` (flattened nodes, parents, the tree attention mask) and the tree rules
  `verify_tree_greedy` / `verify_tree_sampled`.
- `heads.py`: the trained modules and their fp16 files in `engine/assets/spec_heads/` (trained by
  `training/`).
- `acceptance.py`: the pure rule, `verify_sampled(p, drafts, q, generator)` and
  `verify_greedy(logits, drafts)`, both returning a `Verdict`.
- `speculator.py`: `Speculator`, the engine driver. Hooks: `Scheduler.lookahead` (extra slots to
  reserve), `LLMEngine.step` (drafts after scheduling, 1 + g verification rows per round in the one
  target pass, `Speculator.verify` after it: acceptance, `BlockManager.truncate` rollback,
  `num_computed_tokens`, emission through the engine's stop checks).

Counters
--------
`engine.counters` gains ints: `spec_rounds` (verification rounds, i.e. target passes per request),
`spec_drafted_tokens`, `spec_accepted_tokens`, `spec_rejected_rounds` (rounds that ended in a
rejection) and `spec_emitted_tokens` (accepted + bonus/resampled tokens actually emitted).
`Speculator.totals` holds float seconds `draft_seconds` and `verify_seconds`, and `draft_passes`
(early-exit draft forward passes).

The "spec" StepRecord extra
---------------------------
`record.extra("spec")` (present in full-detail traces of engines with a drafter) is a dict of plain
JSON types (after `load_trace` lists come back as tuples):

    {
      "drafter": "ngram" | "early_exit",
      "default_gamma": int,                # EngineConfig.spec_gamma
      "draft_seconds": float,              # wall time of all drafting in this step (all requests)
      "verify_seconds": float,             # this step's target pass + every acceptance rule; 0.0 if no round
      "rounds": [ROUND, ...],              # one per sequence that ran a speculative round this step
      "skipped": [                         # sequences that wanted drafts (gamma > 0) but decoded plainly
        {"request_id": str, "seq_id": int, "gamma": int,
         "reason": "no_match"              #   prompt lookup found no earlier occurrence
                 | "no_free_blocks"        #   no KV room for even one draft without preempting someone
                 | "token_budget"},        #   the step's token budget ran out before its drafts
        ...
      ],
      "totals": {                          # cumulative since the engine started
        "rounds": int, "drafted_tokens": int, "accepted_tokens": int, "rejected_rounds": int,
        "emitted_tokens": int, "draft_seconds": float, "verify_seconds": float
      }
    }

ROUND (g = num_drafted; lists marked [g] have one entry per drafted token, in order):

    {
      "request_id": str,                   # the sequence label, as in StepRecord.batch / emitted
      "seq_id": int,
      "mode": "greedy" | "sampled",
      "gamma": int,                        # drafts the request asked for this round (its gamma, capped so
                                           #   the round cannot emit past max_tokens)
      "num_drafted": int,                  # g <= gamma: free KV blocks or the step's token budget may cap
                                           #   it; the built-in drafters always give g >= 1 (a request that
                                           #   gets no drafts is listed under "skipped" instead)
      "position": int,                     # absolute position of the first drafted token
      "draft_token_ids": [g] int,
      "draft_texts": [g] str,              # tokenizer.decode_token (spaces / newlines made visible)
      "p": [g] float,                      # target probability of each draft (sampled: the filtered
                                           #   distribution the rule uses; greedy: temperature-1 softmax)
      "q": [g] float,                      # drafter probability of each draft (1.0 for prompt lookup;
                                           #   greedy early-exit: temperature-1 softmax of the draft logits)
      "uniforms": [g] float | null,        # the u ~ U[0,1) that decided each draft (accepted iff u < p/q);
                                           #   null in greedy mode and for drafts after the first rejection
      "verdicts": [g] "accepted" | "rejected" | "unverified",   # at most one "rejected"; "unverified" after it
      "num_accepted": int,
      "final_token_id": int,               # the token the round adds after the accepted drafts
      "final_text": str,
      "final_kind": "bonus" | "resampled", # bonus: every draft accepted, drawn from p at row g (greedy:
                                           #   its argmax); resampled: replaces the rejected draft, drawn
                                           #   from max(0, p - q) / Z (greedy: the target's argmax there)
      "final_p": float,                    # target probability of the final token at its position
      "residual_mass": float | null,       # Z = sum max(0, p - q) at the rejection (sampled + resampled only)
      "target_argmax_ids": [g + 1] int,    # the target's most likely token at each verified row
      "target_argmax_texts": [g + 1] str,
      "emitted_token_ids": [int],          # what the request really emitted this round: accepted drafts +
      "emitted_texts": [str],              #   final token, cut short if a stop condition (EOS, stop string,
                                           #   max_tokens) ended the request inside the round
      "draft_seconds": float,              # prompt lookup: an equal share of the step's lookup time; early
                                           #   exit: the wall time of the batched draft passes (all rounds of
                                           #   the step waited for all of them)
      "verify_seconds": float,             # the step's target pass (shared by the batch) + this round's rule
      "drafter_detail": {                  # drafter-specific
          ngram:      "ngram_n": int (0 = no match), "match_position": int (where the matched n-gram
                      starts), "copied_from": int (position of the first copied token; -1 = none),
                      "lag": int (drafts copy the token `lag` positions earlier; absent on no match)
          early_exit: "draft_layers": int
      }
    }

TREE ROUND (Medusa / EAGLE; N = num_drafted nodes, flattened parents first; verification row 0 is
the root = the request's last sampled token, row 1 + i is node i at position start + depth(i)):

    {
      "request_id", "seq_id", "mode", "gamma", "position", "draft_seconds", "verify_seconds",
      "emitted_token_ids", "emitted_texts", "drafter_detail",   # as in ROUND
      "kind": "tree",
      "num_drafted": int,                  # N
      "root_token_id": int, "root_text": str,
      "tree": {"token_ids": [N], "texts": [N], "parents": [N] (-1 = root), "depths": [N] (1 = child of
               the root), "q": [N] (drafter probability given the parent), "path_prob": [N],
               "status": [N] "accepted" | "rejected" (checked, not taken) | "unreached"},
      "accepted_path": [int],              # node indices, root to leaf
      "num_accepted": int,                 # len(accepted_path)
      "final_token_id", "final_text", "final_kind" ("bonus" | "resampled"), "final_p",
      "target_argmax_ids": [N + 1], "target_argmax_texts": [N + 1],   # per verification row
      "trials": [{"node", "u", "p", "accepted"}],   # sampled mode: children tried in order, p = the
                                                    # target's mass left for that child
      "kv_moves": [[from_position, to_position]],   # the accepted path compacted next to the context
    }

The KV picture stays consistent with the round: after the step, the request's block table holds
exactly `position + num_accepted` tokens (its `num_computed_tokens`), the rejected drafts' slots
having been given back (`BlockManager.truncate`). `StepRecord.batch` shows the round as a "decode"
entry of 1 + g tokens whose `context_len` is the post-rollback length.
"""
from engine.speculative.acceptance import Verdict, exact_residual, verify_greedy, verify_sampled
from engine.speculative.drafters import DraftProposal, Drafter, EarlyExitDrafter, PromptLookupDrafter, make_drafter
from engine.speculative.speculator import COUNTER_KEYS, SpecRound, Speculator

__all__ = ["COUNTER_KEYS", "DraftProposal", "Drafter", "EarlyExitDrafter", "PromptLookupDrafter", "SpecRound",
           "Speculator", "Verdict", "exact_residual", "make_drafter", "verify_greedy", "verify_sampled"]
