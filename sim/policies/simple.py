"""Baseline policies without a batch budget: none, fixed-length, ngram-first, suffix-threshold, oracle.

All are batched torch over the StepBatch, host-sync free. Lengths and admitted counts are in draft
tokens (slots); survivals are probabilities.
"""
from __future__ import annotations

from typing import List

import torch

from sim.policies.base import Allocation, StepBatch
from sim.policies.common import CHAIN_MODEL, CHAIN_NGRAM, finish, survival
from sim.policies.registry import Policy, no_params, parse_float, parse_int, register

DEFAULT_SUFFIX_THRESHOLD = 2.0


def alloc_none(batch: StepBatch) -> Allocation:
    """No speculation: admitted = 0 for every request; each emits exactly 1 token per step."""
    return finish(torch.zeros_like(batch.model_len), torch.zeros_like(batch.model_len))


def alloc_fixed(batch: StepBatch, k: int, which: int) -> Allocation:
    """Classic fixed-length speculation: admitted[r] = min(K, len[r]) tokens of one drafter's chain."""
    length = batch.model_len if which == CHAIN_MODEL else batch.ngram_len
    return finish(torch.full_like(length, which), length.clamp(max=k))


def alloc_ngram_first(batch: StepBatch) -> Allocation:
    """vLLM PR 24344's hybrid: the whole n-gram chain when it matched (ngram_len > 0), else the whole
    model chain. admitted = ngram_len[r] or model_len[r]."""
    use_ngram = batch.ngram_len > 0
    chain = torch.where(use_ngram, torch.full_like(batch.ngram_len, CHAIN_NGRAM),
                        torch.full_like(batch.model_len, CHAIN_MODEL))
    return finish(chain, torch.where(use_ngram, batch.ngram_len, batch.model_len))


def alloc_suffix_threshold(batch: StepBatch, threshold: float) -> Allocation:
    """Arctic Inference style: E_n[r] = sum_j a^n[r, j] (expected accepted n-gram tokens, from the
    calibrated n-gram confidences). If E_n >= threshold [tokens], verify the whole n-gram chain, else
    the whole model chain (fixed length, as Arctic's fallback to its model drafter does; no budget)."""
    expected = survival(batch.ngram_conf, batch.ngram_len).sum(1)
    use_ngram = (expected >= threshold) & (batch.ngram_len > 0)
    chain = torch.where(use_ngram, torch.full_like(batch.ngram_len, CHAIN_NGRAM),
                        torch.full_like(batch.model_len, CHAIN_MODEL))
    return finish(chain, torch.where(use_ngram, batch.ngram_len, batch.model_len))


def alloc_oracle(batch: StepBatch) -> Allocation:
    """Upper bound: acc_m, acc_n = true accepted lengths (capped by the chain lengths). Choose the chain
    with the larger one (ties -> model), admit exactly its accepted prefix; 0 -> NONE. Nothing is wasted
    on rejected slots and the step emits acc + 1 tokens per request."""
    acc_m = torch.minimum(batch.true_model_acc, batch.model_len)
    acc_n = torch.minimum(batch.true_ngram_acc, batch.ngram_len)
    use_ngram = acc_n > acc_m
    chain = torch.where(use_ngram, torch.full_like(acc_n, CHAIN_NGRAM), torch.full_like(acc_m, CHAIN_MODEL))
    return finish(chain, torch.maximum(acc_m, acc_n))


@register("none", "none", "no speculation: one token per request per step")
def _none(params: List[str]) -> Policy:
    no_params("none", params)
    return Policy("none", alloc_none, uses_model=False, uses_ngram=False)


def _fixed_factory(family: str, which: int, uses_model: bool):
    def factory(params: List[str]) -> Policy:
        if len(params) != 1:
            raise ValueError(f"'{family}' needs one parameter K, e.g. '{family}:7'")
        k = parse_int(params[0], "K", lo=0)
        return Policy(f"{family}:{k}", lambda b: alloc_fixed(b, k, which),
                      uses_model=uses_model, uses_ngram=not uses_model)
    return factory


register("model-fixed", "model-fixed:K", "verify min(K, len) tokens of the model chain")(
    _fixed_factory("model-fixed", CHAIN_MODEL, True))
register("ngram-fixed", "ngram-fixed:K", "verify min(K, len) tokens of the n-gram chain")(
    _fixed_factory("ngram-fixed", CHAIN_NGRAM, False))


@register("ngram-first", "ngram-first", "n-gram chain when it matches, else model chain (vLLM PR 24344)")
def _ngram_first(params: List[str]) -> Policy:
    no_params("ngram-first", params)
    return Policy("ngram-first", alloc_ngram_first, uses_model=True, uses_ngram=True)


@register("suffix-threshold", "suffix-threshold[:t]",
          f"n-gram chain if its expected accepted length >= t (default {DEFAULT_SUFFIX_THRESHOLD}), "
          "else model chain (Arctic Inference style)")
def _suffix_threshold(params: List[str]) -> Policy:
    if len(params) > 1:
        raise ValueError("'suffix-threshold' takes at most one parameter t")
    t = parse_float(params[0], "t") if params else DEFAULT_SUFFIX_THRESHOLD
    name = "suffix-threshold" if not params else f"suffix-threshold:{t:g}"
    return Policy(name, lambda b: alloc_suffix_threshold(b, t), uses_model=True, uses_ngram=True)


@register("oracle", "oracle", "knows the true accepted lengths: upper bound, not realisable")
def _oracle(params: List[str]) -> Policy:
    no_params("oracle", params)
    return Policy("oracle", alloc_oracle, uses_model=True, uses_ngram=True, needs_truth=True)
