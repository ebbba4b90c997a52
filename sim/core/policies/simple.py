"""Baseline policies without a batch budget: none, fixed-length, ngram-first, ngram-threshold, oracle.

All are batched torch over the StepBatch, host-sync free. Lengths and admitted counts are in draft
tokens (slots); survivals are probabilities.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List

import torch

from sim.core.policies.base import MODEL, NGRAM, Allocation, StepBatch
from sim.core.policies.common import CHAIN_MODEL, CHAIN_NGRAM, arange, finish, goodput, survival, top_b_counts
from sim.core.policies.registry import (DynOption, Policy, deprecated_alias, no_params, parse_spec, register, spec_name,
                                        spec_usage, split_dyn, with_dynamic_k)
from sim.core.settings import setting
from sim.core.vllm import VllmRun

DEFAULT_NGRAM_THRESHOLD = 2.0


@dataclass(frozen=True)
class FixedK:
    """The K of `model-fixed:K` and `ngram-fixed:K` (tokens verified per request per step, at most the chain's)."""

    K: int = setting(None, "tokens of the chain verified per request per step (at most its length)", lo=0,
                     positional=True, required=True, metavar="K")


@dataclass(frozen=True)
class VllmNgramK:
    """The K of `vllm-ngram:K`: vLLM's num_speculative_tokens."""

    K: int = setting(None, "vLLM's num_speculative_tokens: slots scheduled and verified per request per step", lo=1,
                     positional=True, required=True, metavar="K")


@dataclass(frozen=True)
class Threshold:
    """The t of `ngram-threshold[:t]`."""

    t: float = setting(DEFAULT_NGRAM_THRESHOLD, "expected accepted length [tokens] from which the n-gram chain is "
                                                "taken", lo=0.0, positional=True, metavar="t")


def alloc_none(batch: StepBatch) -> Allocation:
    """No speculation: admitted = 0 for every request; each emits exactly 1 token per step."""
    return finish(torch.zeros_like(batch.chains[MODEL][1]), torch.zeros_like(batch.chains[MODEL][1]))


def alloc_fixed(batch: StepBatch, k: int, which: int) -> Allocation:
    """Classic fixed-length speculation: admitted[r] = min(K, len[r]) tokens of one drafter's chain."""
    length = batch.chains[MODEL][1] if which == CHAIN_MODEL else batch.chains[NGRAM][1]
    return finish(torch.full_like(length, which), length.clamp(max=k))


def alloc_ngram_first(batch: StepBatch) -> Allocation:
    """vLLM PR 24344's hybrid: the whole n-gram chain when it matched (n-gram length > 0), else the
    whole model chain. admitted = that chain's length."""
    use_ngram = batch.chains[NGRAM][1] > 0
    chain = torch.where(use_ngram, torch.full_like(batch.chains[NGRAM][1], CHAIN_NGRAM),
                        torch.full_like(batch.chains[MODEL][1], CHAIN_MODEL))
    return finish(chain, torch.where(use_ngram, batch.chains[NGRAM][1], batch.chains[MODEL][1]))


def alloc_ngram_threshold(batch: StepBatch, threshold: float) -> Allocation:
    """Arctic Inference style: E_n[r] = sum_j a^n[r, j] (expected accepted n-gram tokens, from the
    calibrated n-gram confidences). If E_n >= threshold [tokens], verify the whole n-gram chain, else
    the whole model chain (fixed length, as Arctic's fallback to its model drafter does; no budget)."""
    expected = survival(batch.chains[NGRAM][0], batch.chains[NGRAM][1]).sum(1)
    use_ngram = (expected >= threshold) & (batch.chains[NGRAM][1] > 0)
    chain = torch.where(use_ngram, torch.full_like(batch.chains[NGRAM][1], CHAIN_NGRAM),
                        torch.full_like(batch.chains[MODEL][1], CHAIN_MODEL))
    return finish(chain, torch.where(use_ngram, batch.chains[NGRAM][1], batch.chains[MODEL][1]))


def alloc_oracle(batch: StepBatch) -> Allocation:
    """Per-step oracle: the allocation of maximal goodput this step, given the true accepted lengths.

    acc_m[r], acc_n[r] = true accepted lengths (capped by the chain lengths). For each set of drafters
    s = (model runs, n-gram runs) in {0, 1}^2, request r can at best gain A_s[r] = max(m * acc_m[r],
    n * acc_n[r]) tokens from one chain, and a step admitting B of those accepted slots (none rejected)
    earns exactly
        G_s(B) = (N + B) / (D_s + verify_ms[T + B]),   0 <= B <= sum_r A_s[r]          [tokens/ms]
    where D_s = m * price(dspark) + n * price(ngram) + (m or n) * alloc_ms. The oracle takes the
    (s, B) of maximal G (first maximum; B admitted depth-first: slot j of every request before slot
    j + 1 of any), each request's chain with the larger A_s (ties: model), and reports which drafters
    ran (Allocation.ran) so the engine charges only those.

    Bound (exact, per step): any single- or two-branch allocation of any policy on the same step emits
    N + (its accepted slots) tokens at a cost >= D_s' + verify_ms[T + its slots] for the drafters s' it
    ran, and the oracle can admit exactly those accepted slots at a cost no higher, so G_oracle >= G_policy
    for that step. End to end (tokens / total time of a whole trace) this is not a theorem: runs diverge in
    state after the first step. tests/test_oracle_bound.py checks it on random traces for every policy.
    """
    if batch.true_verify_cost_ms is not None:  # bound what the engine charges, not the decision table
        batch = dataclasses.replace(batch, verify_cost_ms=batch.true_verify_cost_ms)
    acc_m = torch.minimum(batch.true_acc.get(MODEL), batch.chains[MODEL][1])
    acc_n = torch.minimum(batch.true_acc.get(NGRAM), batch.chains[NGRAM][1])
    dev = acc_m.device
    # drafter sets: (model, ngram) = (1, 1), (0, 1), (1, 0), (0, 0)
    use_m = torch.tensor([1, 0, 1, 0], device=dev)
    use_n = torch.tensor([1, 1, 0, 0], device=dev)
    alloc_ms = batch.draft_cost_ms - batch.price(MODEL) - batch.price(NGRAM)
    draft = (use_m * batch.price(MODEL) + use_n * batch.price(NGRAM)
             + (use_m | use_n) * alloc_ms).to(torch.float64)  # [4]
    a_s = torch.maximum(acc_m[None] * use_m[:, None], acc_n[None] * use_n[:, None])  # [4, R]
    K = max(batch.chains[MODEL][0].shape[-1], batch.chains[NGRAM][0].shape[-1])
    b = arange(acc_m.shape[0] * K + 1, dev)  # B = 0 .. R*K
    g = goodput(batch, b.to(torch.float64)[None, :], b[None, :], draft[:, None])  # [4, R*K+1]
    g = g.masked_fill(b[None, :] > a_s.sum(-1, keepdim=True), float("-inf"))
    best = torch.argmax(g.flatten())  # first maximum over (set, B)
    s, budget = best // g.shape[1], best % g.shape[1]
    s1 = s.reshape(1)  # index_select, not a_s[s]: indexing by a 0-d tensor is data-dependent under torch.compile
    acc = a_s.index_select(0, s1)[0]
    m_s, n_s = use_m.index_select(0, s1)[0], use_n.index_select(0, s1)[0]
    use_ngram = (acc_n > acc_m) & (n_s > 0) | (m_s == 0)
    chain = torch.where(use_ngram, torch.full_like(acc_n, CHAIN_NGRAM), torch.full_like(acc_m, CHAIN_MODEL))
    depth = arange(K, dev)
    scores = torch.where(depth[None, :] < acc[:, None], (K - depth).to(torch.float64)[None, :].expand(acc.shape[0], -1),
                         torch.full((acc.shape[0], K), float("-inf"), dtype=torch.float64, device=dev))
    out = finish(chain, top_b_counts(scores, budget))
    return Allocation(chain=out.chain, admitted=out.admitted, ran={MODEL: m_s > 0, NGRAM: n_s > 0})


@register("none", "none", "no speculation: one token per request per step")
def _none(params: List[str]) -> Policy:
    no_params("none", params)
    return Policy("none", alloc_none, uses_model=False, uses_ngram=False, vllm=VllmRun(None))


def _fixed_factory(family: str, which: int, uses_model: bool):
    def factory(params: List[str]) -> Policy:
        params, per_batch = split_dyn(params) if uses_model else (params, ())
        k = parse_spec(family, FixedK, params)["K"]
        # model-fixed:K is vLLM's DSpark at num_speculative_tokens = K without adaptive verification;
        # ngram-fixed:K (only the matched chain verified) has no vLLM counterpart: vllm-ngram:K is vLLM's ngram
        run = VllmRun("dspark", k=k) if uses_model else None
        return with_dynamic_k(Policy(f"{family}:{k}", lambda b: alloc_fixed(b, k, which),
                                     uses_model=uses_model, uses_ngram=not uses_model, vllm=run), per_batch)
    return factory


register("model-fixed", spec_usage("model-fixed", FixedK) + spec_usage("", DynOption),
         "verify min(K, len) tokens of the model chain; dyn=: vLLM's num_speculative_tokens_per_batch_size (K per "
         "number of scheduled requests, charged as vLLM)", settings=(FixedK, DynOption))(
    _fixed_factory("model-fixed", CHAIN_MODEL, True))
register("ngram-fixed", spec_usage("ngram-fixed", FixedK), "verify min(K, len) tokens of the n-gram chain",
         settings=(FixedK,))(_fixed_factory("ngram-fixed", CHAIN_NGRAM, False))


@register("vllm-ngram", spec_usage("vllm-ngram", VllmNgramK) + spec_usage("", DynOption),
          "vLLM's own ngram method as Model Runner V2 runs it: K slots scheduled and verified per request per "
          "step, matched or not (the matched chain's min(K, len) can be accepted; vLLM's scheduler charges K)",
          settings=(VllmNgramK, DynOption))
def _vllm_ngram(params: List[str]) -> Policy:
    """The allocation is ngram-fixed:K's (what can be accepted: the matched prefix); what differs is the charge,
    which the engine takes from `vllm` (sim.core.vllm: 1 + K tokens scheduled and verified per decoding
    request), and vLLM's fillers: a slot past the match holds the last sampled token, which the target accepts
    where it repeats that token (sim.engine.engine.Engine._filler_run, after the matched copy is accepted whole)."""
    params, per_batch = split_dyn(params)
    k = parse_spec("vllm-ngram", VllmNgramK, params)["K"]
    return with_dynamic_k(Policy(f"vllm-ngram:{k}", lambda b: alloc_fixed(b, k, CHAIN_NGRAM), uses_model=False,
                                 uses_ngram=True, vllm=VllmRun("ngram", k=k, only_vllm=True)), per_batch)


@register("ngram-first", "ngram-first", "n-gram chain when it matches, else model chain (vLLM PR 24344)",
          adaptive_verification=True)
def _ngram_first(params: List[str]) -> Policy:
    no_params("ngram-first", params)
    return Policy("ngram-first", alloc_ngram_first, uses_model=True, uses_ngram=True)


@register("ngram-threshold", spec_usage("ngram-threshold", Threshold),
          "n-gram chain if its expected accepted length >= t, else model chain (Arctic Inference's rule, on the "
          "n-gram drafter; formerly `suffix-threshold`)", adaptive_verification=True, settings=(Threshold,))
def _ngram_threshold(params: List[str]) -> Policy:
    given = parse_spec("ngram-threshold", Threshold, params)
    t, name = Threshold(**given).t, spec_name("ngram-threshold", Threshold, given)
    return Policy(name, lambda b: alloc_ngram_threshold(b, t), uses_model=True, uses_ngram=True)


deprecated_alias("suffix-threshold", "ngram-threshold")  # the old name: the rule runs on the n-gram chain


@register("oracle", "oracle", "per-step oracle: knows the true accepted lengths, picks the drafters to run, "
          "the chain and the accepted prefix of maximal step goodput; a bound, not realisable",
          adaptive_verification=True)
def _oracle(params: List[str]) -> Policy:
    no_params("oracle", params)
    return Policy("oracle", alloc_oracle, uses_model=True, uses_ngram=True, needs_truth=True)
