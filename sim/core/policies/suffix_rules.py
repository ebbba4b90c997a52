"""Two rules over the suffix-tree drafter that vLLM runs in builds the simulator's vLLM scheduler does not model:
`suffix-adaptive` (vLLM main) and `arctic` (Arctic Inference 0.1.1's hybrid of suffix decoding and a model drafter).
`suffix` itself, vLLM 0.32/0.33's method 'suffix', is in sim/core/policies/multi.py.

Math. The suffix chain of request r: confidences c [R, K_s] (what the suffix drafter's `confidence` setting makes
them: sim/core/drafters/suffix.py), length n [R]; survival a_j = c_1 ... c_j, 0 past n [probability].

  suffix-adaptive  vLLM main's suffix speculator with enable_adaptive_verification (Model Runner V2,
                   vllm/v1/worker/gpu/spec_decode/suffix/speculator.py): the suffix chain inside vLLM's adaptive
                   verification, as `adaptive` runs the DSpark chain (sim/core/policies/adaptive.py) --
                     plan (host):     B* = argmax_{B} (N + S_1 + ... + S_B) / (draft_ms + verify_ms[T + B]),
                                      S = the stale suffix survivals sorted descending [tokens / ms];
                     allocate (GPU):  global top-B* of the current suffix survivals, admitted[r] = its count.
                   vLLM main's confidences are its online acceptance statistics per (source, match-length bucket,
                   position): run with the suffix drafter's `confidence: online` (what --speculative-config's
                   {"method": "suffix", "enable_adaptive_verification": true} sets); with the other settings the
                   same rule ranks the tree's calibrated or raw frequencies.
                   vLLM main fills each proposal to K with the last token at confidence 0: those slots rank last
                   and are never verified, so the chain stops at n here.
  arctic[:K]       Arctic Inference 0.1.1 (its vLLM plugin, arctic_inference/vllm/model_runner.py,
                   propose_draft_token_ids, on vLLM 0.10.1): per request, the suffix draft where its score is at
                   least K, else the model drafter's K tokens, all verified (no adaptive verification):
                     score[r] = a_1 + ... + a_{n[r]}         [tokens: the expected accepted length]
                     chain[r] = suffix if score[r] >= K, else the model chain; admitted = n[r] or min(K, len_m[r])
                   K = num_speculative_tokens of the model drafter (default: its whole block). Arctic scores with the
                   tree's own frequencies: exact with the suffix drafter's `confidence: raw`; with `calibrated` the
                   score is the calibrated expected length. Both drafters run every step (Arctic skips the model
                   drafter's work only for its own MLP speculator, which the simulator has no profile of).

Deployability: neither runs in a vLLM release the simulator models, so the 'vllm' scheduler refuses both (VllmRun
.release) and the verdict puts them in sim/core/deploy.py's 'newer' tier.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sim.core.drafters.registry import chain_id
from sim.core.policies.base import MODEL, Allocation, HostView, Plan, StepBatch, host_view
from sim.core.policies.common import (CHAIN_MODEL, best_budget, finish, rank_scores, survival, top_b_counts)
from sim.core.policies.registry import Policy, no_params, parse_spec, register, spec_name, spec_usage
from sim.core.settings import setting
from sim.core.vllm import VllmRun

SUFFIX = "suffix"  # the suffix drafter's registered name (sim/core/drafters/registry.py)
VLLM_MAIN = "vLLM main (Model Runner V2's suffix speculator, not in 0.33)"
ARCTIC = "Arctic Inference 0.1.1's vLLM plugin (vLLM 0.10.1)"


def plan_suffix_adaptive(view: HostView) -> Plan:
    """Host phase: only the suffix drafter runs; budget B* from its stale chains' survivals."""
    conf, length = view.stale_chains[SUFFIX]
    budget, _ = best_budget(view, rank_scores(survival(conf, length, dtype=torch.float64), length))
    return Plan(frozenset((SUFFIX,)), budget=budget)


def allocate_suffix_adaptive(batch: StepBatch, plan: Plan) -> Allocation:
    """Device phase: the global top-B (B = plan.budget) of the current suffix survivals."""
    conf, length = batch.chains[SUFFIX]
    admitted = top_b_counts(rank_scores(survival(conf, length), length), plan.budget)
    return finish(torch.full_like(admitted, chain_id(SUFFIX)), admitted)


def alloc_suffix_adaptive(batch: StepBatch) -> Allocation:
    return allocate_suffix_adaptive(batch, plan_suffix_adaptive(host_view(batch)))


@register("suffix-adaptive", "suffix-adaptive", "vLLM main's suffix decoding inside adaptive verification: the "
          "suffix chain ranked by its confidences (vLLM main's online per-source, per-match-length, per-position "
          "estimates with --suffix-confidence online); vLLM main only: refused by --scheduler vllm",
          adaptive_verification=True)
def _suffix_adaptive(params: list[str]) -> Policy:
    no_params("suffix-adaptive", params)
    return Policy("suffix-adaptive", alloc_suffix_adaptive, uses_model=False, uses_ngram=False, uses_extra=(SUFFIX,),
                  plan_fn=plan_suffix_adaptive, alloc_fn=allocate_suffix_adaptive,
                  vllm=VllmRun(SUFFIX, adaptive=True, release=VLLM_MAIN, main=True))


def alloc_arctic(batch: StepBatch, k: int | None) -> Allocation:
    """Arctic Inference's rule (module docstring): the suffix chain where its score >= K, else the model chain's
    first min(K, len) tokens."""
    conf, length = batch.chains[SUFFIX]
    K = batch.chains[MODEL][0].shape[1] if k is None else min(k, batch.chains[MODEL][0].shape[1])
    score = survival(conf, length, dtype=torch.float64).sum(-1)
    take = (score >= K) & (length > 0)
    chain = torch.where(take, torch.full_like(length, chain_id(SUFFIX)), torch.full_like(length, CHAIN_MODEL))
    return finish(chain, torch.where(take, length, batch.chains[MODEL][1].clamp(max=K)))


@dataclass(frozen=True)
class ArcticK:
    """The K of `arctic[:K]`: the model drafter's num_speculative_tokens, and the score the suffix chain must reach."""

    K: int | None = setting(None, "the model drafter's tokens per step, and the suffix chain's expected accepted "
                                  "length [tokens] from which it is taken instead", lo=1, positional=True,
                            metavar="K", off_means="the model drafter's whole block")


@register("arctic", spec_usage("arctic", ArcticK), "Arctic Inference 0.1.1's hybrid (its vLLM plugin, on vLLM "
          "0.10.1): per request the suffix chain where its score (expected accepted length) >= K, else the model "
          "chain's K tokens, all verified; exact with --suffix-confidence raw; refused by --scheduler vllm",
          settings=(ArcticK,))
def _arctic(params: list[str]) -> Policy:
    given = parse_spec("arctic", ArcticK, params)
    k = ArcticK(**given).K
    return Policy(spec_name("arctic", ArcticK, given), lambda b: alloc_arctic(b, k), uses_model=True,
                  uses_ngram=False, uses_extra=(SUFFIX,), vllm=VllmRun(SUFFIX, k=k, release=ARCTIC))
