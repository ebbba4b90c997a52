"""`hybrid-tree`: beyond the seed -- verify both chains as a two-branch tree when extra slots are cheap (over
more than two drafters, `tree_alloc_n`: the best other chain is the second branch).

The primary branch is exactly `hybrid-price:METHOD:current` (chain choice and prefix by the price rule).
The other chain may then add a second branch to the same verification pass. With independent branches
the request accepts max(A_p, A_s) tokens, and
    E[max(A_p, A_s)] = sum_j P(A_p >= j or A_s >= j) = sum_j [a^p_j + a^s_j (1 - a^p_j)]
(a^p_j taken as 0 past the primary prefix), so slot j of the second branch adds v_j = a^s_j (1 - a^p_j)
expected tokens. It is admitted, as a prefix, while v_j * DISCOUNT > lambda, where lambda is the price of
a slot at the primary allocation:
    lambda = G x (verify_ms[T + S + w] - verify_ms[T + S]) / w,   w = max(4, S / 2)
(G the primary allocation's goodput, S its slots; a secant, since CUDA-graph buckets make the table a
step function). DISCOUNT < 1 hedges the independence assumption: a model chain inside a copied span
proposes much the same tokens as the n-gram chain, so the branches fail together more often than
independence says. In a memory-bound step lambda is near 0 and both chains are verified almost whole;
in a compute-bound step the second branch is rarely worth its slots.
All batched torch, no host sync, fixed op count. Like `hybrid-price:current`, its token count is decided
from current values on the GPU, so in vLLM the verify pass is padded to its maximum (or the CPU-side budget
of hybrid-price bounds it); the simulator charges the slots actually admitted. A real engine also needs
tree attention (two branches off the last accepted token), which vLLM's tree speculative decoding provides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from sim.core.policies.base import Allocation, StepBatch
from sim.core.policies.common import CHAIN_MODEL, CHAIN_NGRAM, finish, goodput, verify_ms
from sim.core.policies.hybrid import (DEFAULT_METHOD, LAMBDA_METHODS, METHOD_HELP, METHODS, NGRAM_MARGIN, TWO, Chains,
                                      chain_ids)
from sim.core.policies.registry import Policy, over_drafters, parse_spec, register, spec_name, spec_usage
from sim.core.settings import setting

DISCOUNT = 0.5
SECANT_MIN = 4


def tree_alloc(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
               discount: float = DISCOUNT) -> Allocation:
    ch = Chains.current(batch, TWO)
    choice, adm, _ = LAMBDA_METHODS[method](batch, ch, margin)
    return second_branch(batch, ch.survs[0][0], ch.survs[1][0], choice[0], adm[0], discount)  # bool: two chains


def second_branch(batch: StepBatch, surv_m: torch.Tensor, surv_n: torch.Tensor, use_ngram: torch.Tensor,
                  adm: torch.Tensor, discount: float = DISCOUNT) -> Allocation:
    """The tree from the primary allocation (use_ngram bool [R], adm int64 [R]) and the current survivals
    (surv_m [R, K_m], surv_n [R, K_n]): the primary chain's prefix plus the other chain's second branch
    (module docstring). The simulator's faster form (sim/engine/policy_fast.py, tree_arrays) computes the primary
    and this in C, checked equal to it by tests/test_fast_forms.py."""
    surv_p = torch.where(use_ngram[:, None], _pad(surv_n, surv_m), _pad(surv_m, surv_n))
    surv_s = torch.where(use_ngram[:, None], _pad(surv_m, surv_n), _pad(surv_n, surv_m))
    K = surv_p.shape[-1]
    j = torch.arange(K, device=adm.device)
    in_primary = j[None, :] < adm[:, None]
    a_p = torch.where(in_primary, surv_p, torch.zeros_like(surv_p))
    total = adm.sum(-1, keepdim=True)  # [1]: a 0-d index would be a data-dependent scalar under compile
    gain = a_p.sum(-1).sum(-1, keepdim=True)
    g = goodput(batch, gain, total)
    w = torch.clamp(total // 2, min=SECANT_MIN)
    lam = g * (verify_ms(batch, total + w) - verify_ms(batch, total)).to(g.dtype) / w
    v = surv_s * (1.0 - a_p) * discount
    second = torch.cumprod((v > lam).to(torch.int64), dim=-1).sum(-1)
    second = torch.where(adm > 0, second, torch.zeros_like(second))
    chain = torch.where(use_ngram, torch.full_like(adm, CHAIN_NGRAM), torch.full_like(adm, CHAIN_MODEL))
    out = finish(chain, adm)
    return Allocation(chain=out.chain, admitted=out.admitted, second=second)


def _pad(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Right-pad x with zeros to the width of the wider of the two chains."""
    width = max(x.shape[-1], other.shape[-1])
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


@dataclass(frozen=True)
class TreeSettings:
    """`hybrid-tree`'s settings: the primary branch's method (hybrid-price's) and the second branch's DISCOUNT."""

    method: str = setting(DEFAULT_METHOD, METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD")
    discount: float = setting(DISCOUNT, "weight of a second-branch slot's expected tokens against the slot price, "
                                        "hedging the branches' correlation (1 = independent)", lo=0.0, hi=1.0,
                              metavar="D")


@register("hybrid-tree", spec_usage("hybrid-tree", TreeSettings),
          "beyond the seed: hybrid-price's chain plus the other chain as a second tree branch where its "
          "slots pay for themselves (discount D for correlated branches)", adaptive_verification=True,
          settings=(TreeSettings,))
def _hybrid_tree(params: List[str]) -> Policy:
    method, discount, name = parse_tree(params)
    return Policy(name, lambda b: tree_alloc(b, method, NGRAM_MARGIN, discount), uses_model=True, uses_ngram=True, tree=True)


def parse_tree(params: List[str]) -> tuple[str, float, str]:
    """(METHOD, discount, canonical name) of a hybrid-tree spec's parameters (TreeSettings); ValueError if bad."""
    given = parse_spec("hybrid-tree", TreeSettings, params)
    v = TreeSettings(**given)
    return v.method, v.discount, spec_name("hybrid-tree", TreeSettings, given)


def tree_alloc_n(batch: StepBatch, names: tuple, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                 discount: float = DISCOUNT) -> Allocation:
    """`hybrid-tree` over any drafters `names` (hybrid.Chains, in registry order). The primary
    branch is hybrid-price:METHOD:current over the N chains (hybrid.Chains' choice); every other chain d is
    priced as a second branch by the module docstring's rule, v^d_j = a^d_j (1 - a^p_j) DISCOUNT admitted as a
    prefix n_d while v^d_j > lambda, and the request takes the one of largest expected gain sum_{j < n_d} v^d_j
    (the first in order on ties; Allocation.second_chain names it). On (dspark, ngram) this is `tree_alloc`
    (tests/test_drafter_axis.py); with one drafter there is no second branch."""
    ch = Chains.current(batch, names)
    choice, adm, _ = LAMBDA_METHODS[method](batch, ch, margin)
    choice, adm = choice[0].to(torch.int64), adm[0]  # an index (two chains choose by a bool: evaluate)
    ids = chain_ids(names)
    if len(names) < 2:
        return finish(ids[choice], adm)
    W = max(s.shape[-1] for s in ch.survs)
    survs = torch.stack([torch.nn.functional.pad(s[0], (0, W - s.shape[-1])) for s in ch.survs])  # [N, R, W]
    surv_p = survs.gather(0, choice[None, :, None].expand(1, -1, W))[0]
    j = torch.arange(W, device=adm.device)
    a_p = torch.where(j[None, :] < adm[:, None], surv_p, torch.zeros_like(surv_p))
    total = adm.sum(-1, keepdim=True)
    gain = a_p.sum(-1).sum(-1, keepdim=True)
    g = goodput(batch, gain, total)
    w = torch.clamp(total // 2, min=SECANT_MIN)
    lam = g * (verify_ms(batch, total + w) - verify_ms(batch, total)).to(g.dtype) / w
    v = survs * (1.0 - a_p)[None] * discount
    n = torch.cumprod((v > lam).to(torch.int64), dim=-1).sum(-1)  # [N, R]
    worth = torch.where(j[None, None, :] < n[..., None], v, torch.zeros_like(v)).sum(-1)
    worth = worth.masked_fill(torch.arange(len(names), device=adm.device)[:, None] == choice[None, :], -1.0)
    other = torch.argmax(worth, 0)  # the first maximum: the earlier chain on ties
    second = n.gather(0, other[None])[0]
    second = torch.where(adm > 0, second, torch.zeros_like(second))
    out = finish(ids[choice], adm)
    return Allocation(chain=out.chain, admitted=out.admitted, second=second, second_chain=ids[other])


@over_drafters("hybrid-tree")
def _hybrid_tree_n(params: List[str], names: tuple) -> Policy:
    method, discount, name = parse_tree(params)
    return Policy(name, lambda b: tree_alloc_n(b, names, method, NGRAM_MARGIN, discount),
                  uses_model="dspark" in names, uses_ngram="ngram" in names,
                  uses_extra=tuple(n for n in names if n not in ("dspark", "ngram")), tree=True)
