"""The hybrid families over any set of drafters but the default two (the drafter axis,
sim/core/drafters/registry.py): `hybrid`, `hybrid-price` and `hybrid-vllm` registered over the run's drafters with
the one definition of the chain choice, sim/core/policies/hybrid.py (two drafters are its case N = 2), `oracle` over
N drafters (`hybrid-tree`'s is in tree.py), and `suffix`, the single-drafter policy of vLLM's `method: "suffix"`.

A run that enables the default drafters (dspark, ngram) builds the families from hybrid.py's registrations (their
two-drafter fast forms); a run with any other set builds them here (sim/core/policies/catalog.py: get_policy), from
the same functions given the run's drafters.

  oracle        every subset s of the drafters (2^N, all first): A_s[r] = max_{d in s} acc_d[r] (true accepted
                lengths, capped at the chains), D_s = sum_{d in s} price_d + (s not empty) alloc_ms, and the
                (s, B) of maximal (N + B) / (D_s + verify_ms[T + B]) (simple.alloc_oracle's argument: a bound
                on every policy's step for any N).
  hybrid-vllm   needs dspark (vLLM verifies DSpark's slots); `:skip` plans the drafters as `hybrid` (no
                hysteresis, forecast avg) and leaves the budget to vLLM.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List

import torch

from sim.core.drafters.registry import chain_id
from sim.core.policies import hybrid
from sim.core.policies.base import Allocation, StepBatch, host_view
from sim.core.policies.common import arange, finish, goodput, top_b_counts
from sim.core.policies.hybrid import chain_ids, others, parse_hybrid, parse_hybrid_price, split_options
from sim.core.policies.registry import Policy, over_drafters, parse_spec, register, spec_name, spec_usage
from sim.core.settings import setting
from sim.core.vllm import VllmRun


def oracle_n(batch: StepBatch, names: tuple) -> Allocation:
    """The per-step oracle over `names` (module docstring; simple.alloc_oracle for two drafters)."""
    if batch.true_verify_cost_ms is not None:  # bound what the engine charges, not the decision table
        batch = dataclasses.replace(batch, verify_cost_ms=batch.true_verify_cost_ms)
    ch = batch.chains
    accs = [torch.minimum(batch.true_acc[n], ch[n][1]) for n in names]
    dev, N = accs[0].device, len(names)
    # subsets, all drafters first, the empty set last; drafter i is bit i (two drafters: alloc_oracle's order)
    masks = torch.tensor([[(s >> i) & 1 for i in range(N)] for s in range(2 ** N - 1, -1, -1)], device=dev)
    prices = {n: batch.price(n) for n in names}
    alloc_ms = batch.draft_cost_ms
    for n in names:
        alloc_ms = alloc_ms - prices[n]
    draft = masks[:, 0] * prices[names[0]]
    for i in range(1, N):
        draft = draft + masks[:, i] * prices[names[i]]
    draft = (draft + (masks.sum(1) > 0) * alloc_ms).to(torch.float64)  # [2^N]
    a_s = accs[0][None] * masks[:, 0, None]
    for i in range(1, N):
        a_s = torch.maximum(a_s, accs[i][None] * masks[:, i, None])  # [2^N, R]
    K = max(ch[n][0].shape[-1] for n in names)
    b = arange(accs[0].shape[0] * K + 1, dev)
    g = goodput(batch, b.to(torch.float64)[None, :], b[None, :], draft[:, None])
    g = g.masked_fill(b[None, :] > a_s.sum(-1, keepdim=True), float("-inf"))
    best = torch.argmax(g.flatten())
    s, budget = best // g.shape[1], best % g.shape[1]
    acc = a_s[s]
    ran = masks[s] > 0  # [N]
    choice = torch.argmax(torch.stack([torch.where(ran[i], a, -1) for i, a in enumerate(accs)]), 0)
    depth = arange(K, dev)
    scores = torch.where(depth[None, :] < acc[:, None], (K - depth).to(torch.float64)[None, :].expand(acc.shape[0], -1),
                         torch.full((acc.shape[0], K), float("-inf"), dtype=torch.float64, device=dev))
    out = finish(chain_ids(names).to(dev)[choice], top_b_counts(scores, budget))
    return Allocation(chain=out.chain, admitted=out.admitted, ran={n: ran[i] for i, n in enumerate(names)})


def _uses(names: tuple) -> dict:
    return dict(uses_model="dspark" in names, uses_ngram="ngram" in names,
                uses_extra=tuple(n for n in names if n in others(names)))


@over_drafters("hybrid")
def _hybrid_n(params: List[str], names: tuple) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_n_plain(params, names))


def _hybrid_n_plain(params: List[str], names: tuple) -> Policy:
    method, margin, hyst, forecast, _ = parse_hybrid(params)
    return hybrid.hybrid_policy(":".join(["hybrid", *params]), names, method, margin, hyst, forecast, **_uses(names))


@over_drafters("hybrid-price")
def _hybrid_price_n(params: List[str], names: tuple) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_price_n_plain(params, names))


def _hybrid_price_n_plain(params: List[str], names: tuple) -> Policy:
    method, current, margin, _ = parse_hybrid_price(params)
    return hybrid.hybrid_price_policy(":".join(["hybrid-price", *params]), names, method, current, margin,
                                      **_uses(names))


@over_drafters("oracle")
def _oracle_n(params: List[str], names: tuple) -> Policy:
    if params:
        raise ValueError("'oracle' takes no parameter")
    return Policy("oracle", lambda b: oracle_n(b, names), **_uses(names), needs_truth=True)


def alloc_suffix(batch: StepBatch, k: int | None) -> Allocation:
    """vLLM's suffix decoding: the whole suffix-tree chain (min(k, len) tokens), no budget."""
    length = batch.chains["suffix"][1]
    return finish(torch.full_like(length, chain_id("suffix")), length if k is None else length.clamp(max=k))


@dataclass(frozen=True)
class SuffixK:
    """The K of `suffix[:K]`: vLLM's num_speculative_tokens for method 'suffix' (its max_spec_tokens)."""

    K: int | None = setting(None, "tokens of the suffix chain verified per request per step at most", lo=0,
                            positional=True, metavar="K", off_means="the whole chain")


@register("suffix", spec_usage("suffix", SuffixK), "the suffix-tree drafter's whole chain, at most K tokens (vLLM's "
          "method 'suffix'; needs --drafters with suffix)", settings=(SuffixK,))
def _suffix(params: List[str]) -> Policy:
    given = parse_spec("suffix", SuffixK, params)
    k = SuffixK(**given).K
    return Policy(spec_name("suffix", SuffixK, given), lambda b: alloc_suffix(b, k), uses_model=False,
                  uses_ngram=False, uses_extra=("suffix",), vllm=VllmRun("suffix", k=k))


@over_drafters("hybrid-vllm")
def _hybrid_vllm_n(params: List[str], names: tuple) -> Policy:
    if "dspark" not in names:
        raise ValueError("'hybrid-vllm' publishes to vLLM's adaptive verification of DSpark: --drafters must "
                         "enable dspark")
    if hybrid.split_recal(params, "runcal")[1] is not None:
        raise ValueError("runcal is the plugin's recalibration of its two chains (dspark, ngram): run it with "
                         "--drafters dspark,ngram")
    params, fill, budget = hybrid.split_fill(params)
    v, name, run = hybrid.parse_hybrid_vllm(params)
    if (fill, budget) != (hybrid.FILLS[0], hybrid.BUDGETS[0]) or v.tail:
        raise ValueError("fill=, budget= and tail= (the slots vLLM verifies past the chosen chain) are modelled over "
                         "dspark,ngram only: run them with --drafters dspark,ngram")
    method, margin, slots, skip = v.method, v.margin, v.slots or None, v.skip
    if not skip:
        return Policy(name, lambda b: hybrid.alloc_hybrid_vllm(b, method, margin, slots, names), **_uses(names),
                      vllm=run)
    plan = lambda v: hybrid.plan_hybrid_vllm_skip(v, method, margin, names)  # noqa: E731
    alloc = lambda b, p: hybrid.alloc_hybrid_vllm_skip(b, p, method, margin, slots, names)  # noqa: E731
    return Policy(name, lambda b: alloc(b, plan(host_view(b))), **_uses(names), vllm=run, plan_fn=plan,
                  alloc_fn=alloc)
