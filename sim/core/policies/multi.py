"""Policies over any set of drafters (the drafter axis, sim/core/drafters/registry.py): `hybrid`, `hybrid-price`,
`hybrid-vllm` and the `oracle` over N chains (`hybrid-tree`'s is in tree.py), and `suffix`, the single-drafter
policy of vLLM's `method: "suffix"`.

A run that enables the default drafters (dspark, ngram) runs the two-drafter definitions of sim/core/policies/hybrid.py
and simple.py (and their fast forms); a run with any other set runs these (sim/core/policies/catalog.py: get_policy).
On the two default drafters these make the same allocations as those definitions (tests/test_drafter_axis.py
compares them on random batches).

Math. Chains d = 1..N in registry order (dspark first when enabled), conf_d [R, K_d], len_d [R]; survivals
a^d = cumprod(conf_d), 0 past len_d. At a price lambda (a survival) each chain's lambda-prefix is
l_d = #{j : a^d_j > lambda}, its gain g_d = a^d_1 + ... + a^d_{l_d} and its value V_d = g_d - l_d lambda
[expected tokens]. Each request keeps one chain, scanning d in order and switching to chain d iff
    V_d > V_best + margin,
so the margin (hybrid.py's NGRAM_MARGIN, expected tokens) is the winner's-curse correction of a chain against
the ones before it (picking the larger of two noisy estimates picks the over-estimated one): on (dspark, ngram)
this is hybrid-price's rule, and a third chain (suffix) must beat both by the margin. The batch goodput at lambda is
G = (N + sum of the kept gains) / (draft_ms + verify_ms[T + kept slots]) [tokens/ms], and the price search
(METHOD: model-opt, fixed-point, sweep) is hybrid.py's, run on these chains (`ChainsN`).
  hybrid-price  plan (host, stale chains): METHOD, total kept slots = the budget B (capped); allocate (device,
                current chains): METHOD chooses each request's chain (where every lambda-prefix is empty: the
                chain with the largest first survival, the first in order on ties), then the global top-B of
                the chosen chains' survivals.
  hybrid        plan, on the host-known chains (the model chain as last drafted, each model-free chain forecast
                slot by slot from its last and its mean proposal, forecast F, hybrid.py), each drafter set
                priced at the drafters it runs: first hybrid.plan_skip's decision over the two default drafters
                (the model pass runs unless the step earns more than G_all (1 + H) without it), then each
                further drafter (the suffix tree) joins iff the step earns more than G (1 + H) with it; B = the
                chosen set's slots widened to the free ones, capped. allocate: as hybrid-price over the chains
                that ran.
  oracle        every subset s of the drafters (2^N, all first): A_s[r] = max_{d in s} acc_d[r] (true accepted
                lengths, capped at the chains), D_s = sum_{d in s} price_d + (s not empty) alloc_ms, and the
                (s, B) of maximal (N + B) / (D_s + verify_ms[T + B]) (simple.alloc_oracle's argument: a bound
                on every policy's step for any N).
  hybrid-vllm   the plugin's rule over N chains: per request, the chain of largest value at the best price among
                the chains that ran (hybrid.choose_chain's rule, the largest first survival where every prefix is
                empty), its confidences published over W slots to vLLM's unchanged adaptive verification (stale
                publication chosen among all chains); `:skip` plans the drafters as `hybrid` (no hysteresis,
                forecast avg) and leaves the budget to vLLM. Needs dspark (vLLM verifies DSpark's slots).
"""
from __future__ import annotations

import dataclasses
from typing import List

import torch

from sim.core.drafters.registry import chain_id
from sim.core.policies import hybrid
from sim.core.policies.adaptive import alloc_adaptive
from sim.core.policies.base import Allocation, HostView, Plan, StepBatch, host_view
from sim.core.policies.common import (arange, cap_budget, finish, goodput, rank_scores, slot_valid, survival,
                                 top_b_counts)
from sim.core.policies.hybrid import (FORECAST_RULES, LAMBDA_METHODS, free_budget, parse_hybrid, parse_hybrid_price,
                                 split_options)
from sim.core.policies.registry import Policy, over_drafters, parse_int, register
from sim.core.vllm import VllmRun


class ChainsN:
    """N chains' survivals for S sides at once (hybrid.Chains' interface for any N): confs [S, R, K_d] and lens
    [S, R] per chain, in order; draft_ms None or [S, 1] per side [ms]; model_first: the first chain is the model
    chain. surv_m / len_m name the first chain (hybrid.model_opt_lambda's)."""

    def __init__(self, confs: list, lens: list, draft_ms=None, model_first: bool = True):
        dt = confs[0].dtype
        self.survs = [survival(c.to(dt), n) for c, n in zip(confs, lens)]
        self.lens = lens
        self.negs = [-s for s in self.survs]
        self.cs = [torch.nn.functional.pad(torch.cumsum(s, -1), (1, 0)) for s in self.survs]
        self.draft_ms, self.model_first = draft_ms, model_first
        self.surv_m, self.len_m = self.survs[0], lens[0]

    def num_slots(self) -> int:
        return sum(s[0].numel() for s in self.survs)

    def all_survivals(self) -> torch.Tensor:
        """[S, R * sum K_d]: every slot's survival (0 for absent slots)."""
        return torch.cat(self.survs, -1).flatten(1)

    def evaluate(self, batch, lam: torch.Tensor, margin: float = 0.0):
        """hybrid.evaluate for N chains at prices lam [S, C]: (choice [S, R, C] int64 index of the kept chain,
        kept slots [S, R, C] int64, goodput [S, C]) by the module docstring's rule."""
        lam_r = lam[:, None, :].expand(-1, self.surv_m.shape[1], -1)
        neg = (-lam_r).contiguous()
        choice = gain = slots = value = None
        for i, (ng, cs) in enumerate(zip(self.negs, self.cs)):
            n = torch.searchsorted(ng, neg)
            g = cs.gather(-1, n)
            v = g - n * lam_r
            if i == 0:
                choice, gain, slots, value = torch.zeros_like(n), g, n, v
                continue
            bar = value + margin
            take = v > bar
            choice = torch.where(take, i, choice)
            gain, slots, value = torch.where(take, g, gain), torch.where(take, n, slots), torch.where(take, v, value)
        return choice, slots, goodput(batch, gain.sum(1), slots.sum(1), self.draft_ms)


    @classmethod
    def current(cls, batch: StepBatch, names: tuple, draft_ms=None) -> "ChainsN":
        """The batch's current chains of `names` (one side)."""
        ch = batch.chains
        return cls([ch[n][0][None] for n in names], [ch[n][1][None] for n in names], draft_ms, names[0] == "dspark")


def chain_ids(names: tuple) -> torch.Tensor:
    """The registry's chain ids of `names` (int64 [N]): Allocation.chain of each chain index."""
    return torch.tensor([chain_id(n) for n in names], dtype=torch.int64)


_ids = chain_ids
_current = ChainsN.current


def _allocate_chosen(batch: StepBatch, ch: ChainsN, names: tuple, budget, method: str, margin: float) -> Allocation:
    """The current chain choice by price (empty prefixes: the largest first survival), then the global top-B of
    the chosen chains' survivals (budget None: each request's lambda-prefix, the idealised allocation)."""
    choice, kept, _ = LAMBDA_METHODS[method](batch, ch, margin)
    choice, kept = choice[0], kept[0]
    first = torch.stack([s[0, :, 0] for s in ch.survs])  # [N, R]
    choice = torch.where(kept == 0, torch.argmax(first, 0), choice)  # first maximum: the earlier chain on ties
    if ch.model_first and len(names) > 1:  # a request whose model chain is empty takes the best other one
        other = torch.argmax(first[1:], 0) + 1
        choice = torch.where((choice == 0) & (ch.lens[0][0] == 0), other, choice)
    if budget is None:
        admitted = kept
    else:
        scores = [rank_scores(s[0], n[0]).masked_fill((choice != i)[:, None], float("-inf"))
                  for i, (s, n) in enumerate(zip(ch.survs, ch.lens))]
        admitted = top_b_counts(torch.cat(scores, 1), budget)
    return finish(_ids(names)[choice], admitted)


def _others(names: tuple) -> frozenset:
    return frozenset(n for n in names if n not in ("dspark", "ngram"))


def plan_price_n(view: HostView, names: tuple, method: str, margin: float) -> Plan:
    """Host phase of `hybrid-price` over `names`: METHOD on the stale chains, B = their kept slots (capped)."""
    st = view.stale_chains
    ch = ChainsN([st[n][0][None] for n in names], [st[n][1][None] for n in names], None, names[0] == "dspark")
    _, kept, _ = LAMBDA_METHODS[method](view, ch, margin)
    return Plan(model="dspark" in names, ngram="ngram" in names, budget=cap_budget(view, kept[0].sum()),
                extra=_others(names))


def allocate_price_n(batch: StepBatch, plan: Plan, names: tuple, method: str, margin: float) -> Allocation:
    """Device phase of `hybrid-price` over `names` (module docstring)."""
    return _allocate_chosen(batch, _current(batch, names), names, plan.budget, method, margin)


def _forecast(view: HostView, name: str, forecast: str, dt) -> torch.Tensor:
    """A model-free chain's host-side forecast: forecast F of its last proposal and its mean one (hybrid.py)."""
    conf = view.stale_chains[name][0].to(dt)
    mean = view.mean_ngram_conf if name == "ngram" else view.mean_extra.get(name)
    return conf if mean is None else FORECAST_RULES[forecast](conf, mean.to(dt))


def skip_sides(names: tuple) -> list:
    """The drafter sets hybrid's plan prices, as the drafters each leaves out: none first, then every subset of
    the skippable drafters (all but the n-gram drafter, a cheap GPU kernel that always runs) that leaves one
    drafter at least. On (dspark, ngram): [{}, {dspark}], hybrid.plan_skip's two scenarios."""
    skippable = [n for n in names if n != "ngram"]
    sides = []
    for mask in range(2 ** len(skippable)):
        left_out = frozenset(n for i, n in enumerate(skippable) if mask >> i & 1)
        if len(left_out) < len(names):
            sides.append(left_out)
    return sides


def _price_sets(view: HostView, names: tuple, sets: list, method: str, margin: float, forecast: str):
    """METHOD on the host-known chains of `names` once per drafter set in `sets` (a side each: the chains of
    drafters outside the set empty, their prices off draft_cost_ms): (kept slots [S, R], goodput [S])."""
    st, prices = view.stale_chains, view.draft_ms_of
    dt = st[names[0]][0].dtype
    S = len(sets)
    confs, lens = [], []
    for n in names:
        conf = view.stale_model_conf if n == "dspark" else _forecast(view, n, forecast, dt)
        confs.append(conf[None].repeat(S, 1, 1))
        zero = torch.zeros_like(st[n][1])
        lens.append(torch.stack([st[n][1] if n in run else zero for run in sets]))
    full = torch.as_tensor(view.draft_cost_ms, dtype=torch.float64)
    draft = []
    for run in sets:
        d = full
        for n in names:
            if n not in run:
                d = d - torch.as_tensor(prices[n], dtype=torch.float64)
        draft.append(d)
    _, kept, g = LAMBDA_METHODS[method](view, ChainsN(confs, lens, torch.stack(draft)[:, None], names[0] == "dspark"),
                                        margin)
    return kept, g


def plan_skip_n(view: HostView, names: tuple, method: str, margin: float, hysteresis: float,
                forecast: str) -> Plan:
    """Host phase of `hybrid` over `names` (module docstring): first the two default drafters' decision
    (`skip_sides`: run the model pass unless the step earns more than G_all (1 + hysteresis) without it), then
    each further drafter in order joins iff the step with it earns more than G (1 + hysteresis) without it; B =
    the chosen set's kept slots widened to the free ones, capped."""
    base = tuple(n for n in names if n in ("dspark", "ngram")) or names[:1]
    sides = skip_sides(base)
    kept, g = _price_sets(view, base, [tuple(n for n in base if n not in out) for out in sides], method, margin,
                          forecast)
    k = 0
    if len(sides) > 1:
        other = int(torch.argmax(g[1:])) + 1
        k = 0 if bool(g[other] <= g[0] * (1.0 + hysteresis)) else other
    run, total = tuple(n for n in base if n not in sides[k]), kept[k].sum()
    for d in names:
        if d in base:
            continue
        with_d = tuple(n for n in names if n in run or n == d)
        kept, g = _price_sets(view, names, [run, with_d], method, margin, forecast)
        if bool(g[1] > g[0] * (1.0 + hysteresis)):
            run, total = with_d, kept[1].sum()
        else:
            total = kept[0].sum()
    return Plan(model="dspark" in run, ngram="ngram" in run, budget=cap_budget(view, free_budget(view, total)),
                extra=_others(run))


def allocate_skip_n(batch: StepBatch, plan: Plan, names: tuple, method: str, margin: float) -> Allocation:
    """Device phase of `hybrid` over `names`: hybrid-price's allocation over the chains that ran, priced at the
    drafters that ran."""
    ran = tuple(n for n in names if n in plan.drafters)
    draft = torch.as_tensor(batch.draft_cost_ms, dtype=torch.float64)
    prices = batch.draft_ms_of
    for n in names:
        if n not in ran:
            draft = draft - torch.as_tensor(prices[n], dtype=torch.float64)
    return _allocate_chosen(batch, _current(batch, ran, draft.reshape(1, 1)), ran, plan.budget, method, margin)


def true_acc(batch: StepBatch, name: str) -> torch.Tensor:
    if name == "dspark":
        return batch.true_model_acc
    return batch.true_ngram_acc if name == "ngram" else batch.true_extra_acc[name]


def oracle_n(batch: StepBatch, names: tuple) -> Allocation:
    """The per-step oracle over `names` (module docstring; simple.alloc_oracle for two drafters)."""
    if batch.true_verify_cost_ms is not None:  # bound what the engine charges, not the decision table
        batch = dataclasses.replace(batch, verify_cost_ms=batch.true_verify_cost_ms)
    ch = batch.chains
    accs = [torch.minimum(true_acc(batch, n), ch[n][1]) for n in names]
    dev, N = accs[0].device, len(names)
    # subsets, all drafters first, the empty set last; drafter i is bit i (two drafters: alloc_oracle's order)
    masks = torch.tensor([[(s >> i) & 1 for i in range(N)] for s in range(2 ** N - 1, -1, -1)], device=dev)
    prices = batch.draft_ms_of
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
    out = finish(_ids(names).to(dev)[choice], top_b_counts(scores, budget))
    said = {n: ran[i] for i, n in enumerate(names)}
    no = torch.tensor(False, device=dev)
    return Allocation(chain=out.chain, admitted=out.admitted, model_ran=said.get("dspark", no),
                      ngram_ran=said.get("ngram", no), extra_ran={n: said[n] for n in _others(names)})


def _uses(names: tuple) -> dict:
    return dict(uses_model="dspark" in names, uses_ngram="ngram" in names,
                uses_extra=tuple(n for n in names if n in _others(names)))


@over_drafters("hybrid")
def _hybrid_n(params: List[str], names: tuple) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_n_plain(params, names))


def _hybrid_n_plain(params: List[str], names: tuple) -> Policy:
    method, margin, hyst, forecast, _ = parse_hybrid(params)
    plan = lambda v: plan_skip_n(v, names, method, margin, hyst, forecast)  # noqa: E731
    alloc = lambda b, p: allocate_skip_n(b, p, names, method, margin)  # noqa: E731
    return Policy(":".join(["hybrid", *params]), lambda b: _reporting(alloc, plan, b), **_uses(names),
                  plan_fn=plan, alloc_fn=alloc)


def _reporting(alloc, plan, batch: StepBatch) -> Allocation:
    """The policy on one view, reporting its plan's model pass (Allocation.model_ran, as hybrid.price_skip)."""
    p = plan(host_view(batch))
    out = alloc(batch, p)
    return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(p.model))


@over_drafters("hybrid-price")
def _hybrid_price_n(params: List[str], names: tuple) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_price_n_plain(params, names))


def _hybrid_price_n_plain(params: List[str], names: tuple) -> Policy:
    method, current, margin, _ = parse_hybrid_price(params)
    name = ":".join(["hybrid-price", *params])
    if current:
        return Policy(name, lambda b: _allocate_chosen(b, _current(b, names), names, None, method, margin),
                      **_uses(names))
    plan = lambda v: plan_price_n(v, names, method, margin)  # noqa: E731
    alloc = lambda b, p: allocate_price_n(b, p, names, method, margin)  # noqa: E731
    return Policy(name, lambda b: alloc(b, plan(host_view(b))), **_uses(names), plan_fn=plan, alloc_fn=alloc)


@over_drafters("oracle")
def _oracle_n(params: List[str], names: tuple) -> Policy:
    if params:
        raise ValueError("'oracle' takes no parameter")
    return Policy("oracle", lambda b: oracle_n(b, names), **_uses(names), needs_truth=True)


def alloc_suffix(batch: StepBatch, k: int | None) -> Allocation:
    """vLLM's suffix decoding: the whole suffix-tree chain (min(k, len) tokens), no budget."""
    length = batch.extra["suffix"][1]
    return finish(torch.full_like(length, chain_id("suffix")), length if k is None else length.clamp(max=k))


@register("suffix", "suffix[:K]", "the suffix-tree drafter's whole chain, at most K tokens (vLLM's method "
          "'suffix'; needs --drafters with suffix)")
def _suffix(params: List[str]) -> Policy:
    if len(params) > 1:
        raise ValueError("'suffix' takes at most one parameter K")
    k = parse_int(params[0], "K", lo=0) if params else None
    return Policy("suffix" + (f":{k}" if params else ""), lambda b: alloc_suffix(b, k), uses_model=False,
                  uses_ngram=False, uses_extra=("suffix",), vllm=VllmRun("suffix", k=k))


def _published_chains(batch: StepBatch, names: tuple, W: int, stale: bool) -> tuple:
    """The chains as the vLLM plugin sees them when it chooses (hybrid.published_view, for N chains): every
    model-free chain cut to the W slots vLLM drafts, in `names` order: (confs, lens)."""
    ch = batch.stale_chains if stale else batch.chains
    confs, lens = [], []
    for n in names:
        conf, length = ch[n]
        confs.append(conf if n == "dspark" else conf[:, :W])
        lens.append(length if n == "dspark" else length.clamp(max=W))
    return confs, lens


def choose_chain_n(view: StepBatch, confs: list, lens: list, model_first: bool, method: str,
                   margin: float) -> torch.Tensor:
    """hybrid.choose_chain over N chains: per request, the index of the chain to publish (int64 [R]): the largest
    value at the best price (the module docstring's rule); where every lambda-prefix is empty, the largest first
    survival, the first in order on ties."""
    ch = ChainsN([c[None] for c in confs], [n[None] for n in lens], None, model_first)
    choice, kept, _ = LAMBDA_METHODS[method](view, ch, margin)
    first = torch.stack([s[0, :, 0] for s in ch.survs])
    return torch.where(kept[0] == 0, torch.argmax(first, 0), choice[0])


def publish_n(confs: list, lens: list, choice: torch.Tensor, W: int) -> torch.Tensor:
    """hybrid.publish over N chains: the chosen chain's conditional acceptances [R, W] (model_conf's dtype), 0 past
    its length."""
    dt = confs[0].dtype
    rows = []
    for c, n in zip(confs, lens):
        c = c[:, :W].to(dt) * slot_valid(n.clamp(max=W), c[:, :W].shape[1])
        rows.append(torch.nn.functional.pad(c, (0, W - c.shape[1])) if c.shape[1] < W else c)
    return torch.stack(rows).gather(0, choice[None, :, None].expand(1, -1, W))[0]


def alloc_hybrid_vllm_n(batch: StepBatch, names: tuple, method: str, margin: float, slots, ran: tuple) -> Allocation:
    """`hybrid-vllm` over `names` (dspark first): hybrid.alloc_hybrid_vllm with the chain choice among every chain
    that ran this step (`ran`; the stale publication chose among all of them), the chosen chain's confidences
    published to vLLM's unchanged adaptive verification over W slots. On (dspark, ngram) it is the two-drafter
    definition (tests/test_drafter_axis.py)."""
    K = batch.model_conf.shape[1]
    W = K if slots is None else max(int(slots), K)
    cur = hybrid.published_view(batch, W)
    old = hybrid.published_view(batch, W, stale=True)
    confs, lens = _published_chains(batch, names, W, stale=False)
    oconfs, olens = _published_chains(batch, names, W, stale=True)
    idx = [i for i, n in enumerate(names) if n in ran]
    sub = choose_chain_n(cur, [confs[i] for i in idx], [lens[i] for i in idx], names[idx[0]] == "dspark", method,
                         margin)
    choice = torch.tensor(idx, dtype=torch.int64)[sub]
    use_stale = choose_chain_n(old, oconfs, olens, True, method, margin)
    pub = publish_n(confs, lens, choice, W)
    pub_stale = publish_n(oconfs, olens, use_stale, W)
    sched = hybrid.scheduled_slots(batch.model_len, K, W, "dspark" in ran)
    view = dataclasses.replace(batch, model_conf=pub, model_len=sched,
                               stale_model_conf=pub_stale.to(batch.stale_model_conf.dtype))
    admitted = alloc_adaptive(view).admitted
    chain_len = torch.stack(lens).gather(0, choice[None])[0]
    return finish(_ids(names)[choice], torch.minimum(admitted, chain_len))


@over_drafters("hybrid-vllm")
def _hybrid_vllm_n(params: List[str], names: tuple) -> Policy:
    if "dspark" not in names:
        raise ValueError("'hybrid-vllm' publishes to vLLM's adaptive verification of DSpark: --drafters must "
                         "enable dspark")
    if hybrid.split_recal(params, "runcal")[1] is not None:
        raise ValueError("runcal is the plugin's recalibration of its two chains (dspark, ngram): run it with "
                         "--drafters dspark,ngram")
    method, margin, slots, skip, name, run = hybrid.parse_hybrid_vllm(params)
    if not skip:
        return Policy(name, lambda b: alloc_hybrid_vllm_n(b, names, method, margin, slots, names), **_uses(names),
                      vllm=run)

    def plan(v: HostView) -> Plan:  # plan_skip_n's drafters (no hysteresis, forecast avg), vLLM's own budget
        p = plan_skip_n(v, names, method, margin, 0.0, hybrid.FORECASTS[0])
        return Plan(model=p.model, ngram=True, extra=p.extra)

    def alloc(b: StepBatch, p: Plan) -> Allocation:
        out = alloc_hybrid_vllm_n(b, names, method, margin, slots, tuple(n for n in names if n in p.drafters))
        return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(p.model))

    return Policy(name, lambda b: alloc(b, plan(host_view(b))), **_uses(names), vllm=run, plan_fn=plan,
                  alloc_fn=alloc)
