"""Adaptive verification over the model chain: vLLM 0.33's budget + global top-B, and DSpark's early stop.

`adaptive` (the baseline every result is compared to), as vLLM 0.33's `enable_adaptive_verification`
(vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, AdaptiveVerificationManager):
  1. Budget (`get_num_tokens`), on the CPU from one-step-old (stale) confidences, in float64 like vLLM:
       S = stale survivals cumprod(stale_chains[dspark] conf) of slots j < the scheduled model chain length
         (HostView.scheduled_len), sorted descending: the mask is this step's scheduled draft count, not the stale
         chain's length, as in vLLM
       C = min(|S|, max_draft_tokens)      (vLLM's logits-buffer cap, when the engine gives it)
       B* = argmax_{B = 0..C} (N + S_1 + ... + S_B) / (draft_ms + verify_ms[T + B])     [tokens/ms]
     N = num_sampling (decoding requests + prefill chunks that complete their prefill this step), T =
     non-draft tokens, verify_ms the start-up profiled table (first maximum on ties; index clamped).
  2. Allocation (`reallocate_drafts`), on the GPU from the current confidences: survival
     a = cumprod(chains[dspark] conf), slots j >= its length at -inf, global top-B* over the flattened [R, K_m]
     matrix, admitted[r] = row count.
  Step 1 is the policy's plan (`plan_adaptive`: the host's Plan, budget B*), step 2 its allocate
  (`allocate_adaptive`). B* stays a 0-d tensor and top-B is "stable sort, rank < B*", so there is no host
  sync at all.
  (vLLM's torch.topk leaves the order of equal survivals unspecified; the stable sort takes the lower
  flat index first, so allocations may differ from vLLM's only among tied slots.)

`adaptive:online`: the same two steps on the confidences of vLLM's online acceptance estimator, what vLLM runs
  for a drafter without a confidence head (EAGLE, EAGLE-3; `--speculative-config` eagle/eagle3 with
  enable_adaptive_verification): c_k = sigmoid(w * logit(q_k) + b_k), a slope and per-position intercepts refit
  every 100 steps from the verified slots' outcomes (sim/core/drafters/acceptance_estimator.py: the math, what
  stands for q). The engine keeps the estimator (Policy.online) and hands both phases its coefficients, the plan
  the ones a step older; no fast form transcribes it.

`adaptive:early-stop`: the DSpark paper's Algorithm 1. Slots are taken in descending *current*
  survival while each one raises the goodput G_B; it stops at the first slot that does not
  (B_es <= B* of the same confidences). Budget and allocation both use current values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from sim.core.policies.base import MODEL, Allocation, HostView, Plan, StepBatch, host_view
from sim.core.policies.common import (CHAIN_MODEL, best_budget, early_stop_budget, finish, rank_scores,
                                 survival, top_b_counts)
from sim.core.policies.registry import (DynOption, Policy, TableOption, parse_spec, register, spec_usage, split_dyn,
                                        split_table, with_dynamic_k, with_table)
from sim.core.settings import setting
from sim.core.vllm import VllmRun


def stale_model_budget(batch: HostView | StepBatch, scheduled: torch.Tensor) -> torch.Tensor:
    """B* from the stale model confidences (the part vLLM computes on the CPU), 0-d int64.
    Stale survivals are masked with `scheduled` [R], this step's scheduled model draft count
    (HostView.scheduled_len[dspark]), as vLLM masks them with this step's scheduled drafts."""
    surv = survival(batch.stale_chains[MODEL][0], scheduled, dtype=torch.float64)
    budget, _ = best_budget(batch, rank_scores(surv, scheduled))
    return budget


def plan_adaptive(view: HostView) -> Plan:
    """Host phase: the model drafter runs (not the n-gram one); budget B* from the stale confidences."""
    return Plan(frozenset((MODEL,)), budget=stale_model_budget(view, view.scheduled_len[MODEL]))


def allocate_adaptive(batch: StepBatch, plan: Plan) -> Allocation:
    """Device phase: the global top-B (B = plan.budget) of the current model-chain survivals."""
    scores = rank_scores(survival(batch.chains[MODEL][0], batch.chains[MODEL][1]), batch.chains[MODEL][1])
    admitted = top_b_counts(scores, plan.budget)
    return finish(torch.full_like(admitted, CHAIN_MODEL), admitted)


def alloc_adaptive(batch: StepBatch) -> Allocation:
    """vLLM adaptive verification: stale budget B*, current global top-B* of model-chain survivals."""
    return allocate_adaptive(batch, plan_adaptive(host_view(batch)))


def plan_online(view: HostView) -> Plan:
    """Host phase of `adaptive:online`: plan_adaptive on the estimator's predictions (the view's coefficients)."""
    from sim.core.drafters.acceptance_estimator import estimated  # lazy: the vLLM plugin loads this module only

    return plan_adaptive(estimated(view))


def allocate_online(batch: StepBatch, plan: Plan) -> Allocation:
    """Device phase of `adaptive:online`: allocate_adaptive on the estimator's predictions."""
    from sim.core.drafters.acceptance_estimator import estimated

    return allocate_adaptive(estimated(batch), plan)


def alloc_online(batch: StepBatch) -> Allocation:
    """vLLM adaptive verification on the online acceptance estimator's confidences (a view without coefficients:
    the estimator's cold start)."""
    return allocate_online(batch, plan_online(host_view(batch)))


def alloc_adaptive_early_stop(batch: StepBatch) -> Allocation:
    """DSpark Algorithm 1: greedy over current survivals, stop at the first slot that does not raise G."""
    scores = rank_scores(survival(batch.chains[MODEL][0], batch.chains[MODEL][1]), batch.chains[MODEL][1])
    budget = early_stop_budget(batch, scores)
    admitted = top_b_counts(scores, budget)
    return finish(torch.full_like(admitted, CHAIN_MODEL), admitted)


def _adaptive_vllm() -> Policy:
    return Policy("adaptive", alloc_adaptive, uses_model=True, uses_ngram=False, plan_fn=plan_adaptive,
                  alloc_fn=allocate_adaptive, vllm=VllmRun("dspark", adaptive=True))


def _adaptive_online() -> Policy:
    from sim.core.drafters.acceptance_estimator import EstimatorState

    return Policy("adaptive:online", alloc_online, uses_model=True, uses_ngram=False, plan_fn=plan_online,
                  alloc_fn=allocate_online, online=EstimatorState, vllm=VllmRun("eagle", adaptive=True, estimator=True))


def _adaptive_early_stop() -> Policy:
    return Policy("adaptive:early-stop", alloc_adaptive_early_stop, uses_model=True, uses_ngram=False)


# the variants (`adaptive[:VARIANT]`): None is vLLM 0.33's rule; each builds its Policy
VARIANTS = {None: _adaptive_vllm, "early-stop": _adaptive_early_stop, "online": _adaptive_online}


@dataclass(frozen=True)
class AdaptiveSettings:
    """`adaptive`'s own setting (its options table=T and dyn=: TableOption, DynOption)."""

    variant: str | None = setting(None, "early-stop: DSpark's Algorithm 1 (current survivals, stop at the first "
                                        "slot that does not raise goodput); online: on vLLM's online acceptance "
                                        "estimator's confidences (a drafter without a confidence head: eagle, "
                                        "eagle3)", choices=tuple(v for v in VARIANTS if v is not None),
                                  positional=True, off_means="vLLM's rule")


@register("adaptive", spec_usage("adaptive", AdaptiveSettings) + spec_usage("", TableOption)
          + spec_usage("", DynOption),
          "DSpark/vLLM adaptive verification of the model chain (stale budget, current top-B); dyn=: vLLM's "
          "num_speculative_tokens_per_batch_size (K per number of scheduled requests); table=step: priced with the "
          "step's own verify table, not vLLM's start-up profile (as hybrid's; not with dyn=)",
          adaptive_verification=True, settings=(AdaptiveSettings, TableOption, DynOption))
def _adaptive(params: List[str]) -> Policy:
    params, step = split_table(params)
    params, per_batch = split_dyn(params)
    if step and per_batch:
        raise ValueError("table=step has no vLLM counterpart, dyn= is vLLM's: give one")
    variant = parse_spec("adaptive", AdaptiveSettings, params).get("variant")
    return with_dynamic_k(with_table(VARIANTS[variant](), step), per_batch)
