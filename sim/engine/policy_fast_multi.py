"""The simulator's fast form of `hybrid` and `hybrid-price` over any set of drafters but the default two: a
transcription of the one definition of the chain choice (sim/core/policies/hybrid.py: plan_skip / allocate_skip and
plan_price / allocate_price given the run's drafters) with the `sweep` price search, in numpy with the per-price
evaluation of the chains in C (native/multi_price.c), registered with sim.engine.forms.policy_form as a form of the
same definitions as the two-drafter C form of sim/engine/policy_fast.py (`drafters=`: the drafter sets
tests/test_fast_forms.py checks it over, the default two included).

Why: over three drafters a step's plan prices up to four drafter sets and its allocate one, each through some
hundred torch ops on tensors of a few hundred elements, where each op's dispatch (2-4 us) dominates.

The form has the Policy's three faces: fn(batch) -> Allocation (the whole policy on one view, Policy.fn),
fn.plan(view) -> Plan (Policy.plan_fn) and fn.allocate(batch, plan) -> Allocation (Policy.alloc_fn); the engine's
_plan and _allocate hooks call the last two (sim/engine/engine.py). Each falls back to the definition where the
transcription (fn.numpy_plan, fn.numpy_allocate) declines its input: confidences that are not CPU tensors, a
first chain that is not float32 (the definition then computes in its dtype; the others may be float32 or float64,
rounded to float32 as the definition does), a NaN in a chain or a mean chain it reads, lengths that are not int64,
a chain of no slot, drafter prices or the draft cost given as tensors, a verify table that is not a 1-d float64
CPU tensor. Specs with `recal=k`, `runcal=k` or `table=step` get no form at all (sim/core/policies/catalog.py), nor
`hybrid-price:current` or a method other than sweep, nor any spec where the C cannot be built.

Bit-exactness (why it equals the definition, not merely approximates it; sim/engine/policy_fast.py's rules):
  * survival and prefix sums: torch's CPU cumprod / cumsum accumulate float32 in float64 and round each output,
    so np.cumprod / np.cumsum run in float64 and are rounded once per element;
  * l_d = #{j : a^d_j > lambda} (the definition's searchsorted of -lambda in -a^d, exact on non-increasing rows)
    by a walk over the prices in ascending order, and V_d = g_d - l_d lambda, the margin test, in float32 ops;
  * the float32 sum of the kept gains over requests runs through torch.sum on a zero-copy view of an array of the
    definition's shape and layout (its summation order depends on the CPU's vector width);
  * elementwise float32 ops in the definition's order, Python scalars as float32 (torch's wrapped numbers), a
    float64 drafter cost promoting the step time and goodput to float64 (as the definition's [S, 1] tensor does);
  * first maxima (torch.argmax and np.argmax agree), stable descending top-B (np.argsort of the negated scores,
    kind stable), the sweep's prices from the definition's own torch ops (`_fine_prices`).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from sim.core.drafters.registry import chain_id
from sim.engine.forms import policy_form
from sim.core.policies import hybrid
from sim.core.policies.base import MODEL, Allocation, HostView, Plan, StepBatch, host_view

F32, I64 = np.float32, np.int64
THREE = ("dspark", "ngram", "suffix")
# the drafter sets the harness checks the form over (every non-default set of the registered drafters)
DRAFTER_SETS = (THREE, ("ngram", "suffix"), ("dspark", "suffix"), ("suffix",), ("dspark",), ("ngram",))
_CONST: dict = {}


def _native():
    """(ffi, lib) of native/multi_price.c, or None where it cannot be built (the definitions then run)."""
    if "native" not in _CONST:
        from sim.engine.native import load

        _CONST["native"] = load("multi_price")
    return _CONST["native"]


def _fine_prices() -> tuple:
    """The two-stage sweep's float32 prices by the definition's torch ops: the coarse grid [G] and, for each
    possible coarse best b, the fine prices exp(-(u_lo + q (u_hi - u_lo))) [G, F] (u = -log(grid), u_lo, u_hi the
    neighbours of b), elementwise the same floats as hybrid._two_stage_sweep computes per call."""
    out = _CONST.get("sweep")
    if out is None:
        grid = hybrid._price_grid(hybrid.SWEEP_COARSE, "cpu", torch.float32)
        u = -torch.log(grid.clamp(min=1e-12))
        G = grid.shape[0]
        best = torch.arange(G)[:, None]
        u_lo, u_hi = u[(best - 1).clamp(min=0)], u[(best + 1).clamp(max=G - 1)]
        q = torch.linspace(0.0, 1.0, hybrid.SWEEP_FINE, dtype=torch.float32)
        fine = torch.exp(-(u_lo + q * (u_hi - u_lo)))
        out = _CONST["sweep"] = (grid.numpy().copy(), fine.numpy().copy())
    return out


class _Step:
    """The scalars of one view: T, N, the verify table (float64), the cap, the drafters' prices [ms]."""

    __slots__ = ("T", "N", "table", "cap", "draft", "prices")

    def __init__(self, v):
        self.T, self.N = int(v.num_nondraft_tokens), int(v.num_sampling)
        self.table = v.verify_cost_ms.numpy()
        self.cap = v.max_draft_tokens
        self.draft = float(v.draft_cost_ms)
        self.prices = {k: float(p) for k, p in v.draft_ms_of.items()}


def _covered_view(v, names: tuple, current: bool) -> Optional[_Step]:
    """The view's scalars where the form transcribes it, else None (module docstring)."""
    t = v.verify_cost_ms
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.is_cpu and t.dim() == 1):
        return None
    costs = [v.draft_cost_ms, *v.draft_ms_of.values()]
    if any(isinstance(c, torch.Tensor) for c in costs) or isinstance(v.num_sampling_reqs, torch.Tensor):
        return None
    chains = v.chains if current else v.stale_chains
    for i, n in enumerate(names):
        conf, length = chains[n]
        # the definitions compute in the first chain's dtype: float32 here (the others are rounded to it)
        ok = conf.dtype == torch.float32 or (i > 0 and conf.dtype == torch.float64)
        if not (ok and conf.is_cpu and conf.dim() == 2 and conf.shape[1] >= 1
                and length.dtype == torch.int64 and length.is_cpu) or np.isnan(conf.numpy()).any():
            return None
    return _Step(v)


def _f32(t: torch.Tensor) -> np.ndarray:
    """A float32 or float64 CPU tensor as float32 numpy (tensor.to(float32)'s rounding; zero-copy for float32)."""
    return t.numpy().astype(F32, copy=False)


class _Chains:
    """hybrid.Chains on numpy, every chain in one array: confs [S, R, K_d] (float32) and lens [S, R] (int64) per
    chain, padded with confidence 0 to K = max K_d (a padded slot's survival is 0, never above a price >= 0, and
    adds 0 to the prefix sums, so each chain's counts and gains are its own); draft None (the batch's
    draft_cost_ms, float32 goodput) or [S] float64 per side [ms]."""

    def __init__(self, confs: list, lens: list, draft: Optional[np.ndarray]):
        S, R = lens[0].shape
        self.Ks = Ks = [c.shape[-1] for c in confs]
        K = max(Ks)
        conf = np.zeros((S, len(confs), R, K), F32)
        for i, c in enumerate(confs):
            conf[:, i, :, :Ks[i]] = c
        self.len = np.stack(lens, 1)  # [S, N, R]
        # common.survival: the clamp, cumprod accumulated in float64 and rounded per element, 0 past the length
        surv = np.cumprod(np.clip(conf, F32(0.0), F32(1.0)).astype(np.float64), -1).astype(F32)
        self.surv = np.ascontiguousarray(surv * (np.arange(K) < self.len[..., None]))
        self.cs = np.zeros((S, len(confs), R, K + 1), F32)
        self.cs[..., 1:] = np.cumsum(self.surv.astype(np.float64), -1).astype(F32)
        self.draft = draft

    def all_survivals(self) -> np.ndarray:
        """Chains.all_survivals' order: per side, per request, each chain's K_d slots in turn ([S, R * sum K_d])."""
        S, N, R, K = self.surv.shape
        keep = np.arange(K)[None, :] < np.array(self.Ks)[:, None]  # [N, K]
        return self.surv.transpose(0, 2, 1, 3)[:, :, keep].reshape(S, -1)

    def evaluate(self, st: _Step, lam: np.ndarray, margin: float) -> tuple:
        """Chains.evaluate at prices lam [S, C]: (choice, kept slots [S, R, C] int64, goodput [S, C]); the counts,
        gains and chain choice per price in C (native/multi_price.c: mp_evaluate)."""
        ffi, lib = _native()
        S, N, R, K = self.surv.shape
        C = lam.shape[1]
        lam = np.ascontiguousarray(lam, F32)
        order = np.ascontiguousarray(np.argsort(lam, axis=1, kind="stable"), I64)
        choice, slots = np.empty((S, R, C), I64), np.empty((S, R, C), I64)
        gain, work = np.empty((S, R, C), F32), np.empty((N, C), I64)
        fb = ffi.from_buffer
        lib.mp_evaluate(S, N, R, K, fb("float[]", self.surv), fb("float[]", self.cs), C, fb("float[]", lam),
                        fb("int64_t[]", order), margin, fb("int64_t[]", choice), fb("int64_t[]", slots),
                        fb("float[]", gain), fb("int64_t[]", work))
        gsum = torch.from_numpy(np.ascontiguousarray(gain)).sum(1).numpy()  # float32, torch's order
        total = slots.sum(1)
        ver = st.table[np.clip(total + st.T, 0, st.table.shape[0] - 1)].astype(F32)
        if self.draft is None:
            g = (gsum + F32(st.N)) / (ver + F32(st.draft))
        else:
            g = (gsum + F32(st.N)).astype(np.float64) / (ver.astype(np.float64) + self.draft[:, None])
        return choice, slots, g

    def sweep(self, st: _Step, margin: float) -> tuple:
        """hybrid.lambda_sweep: (choice [S, R], kept [S, R], best goodput [S])."""
        S, _, R, _ = self.surv.shape
        if R * sum(self.Ks) <= hybrid.SWEEP_EXACT_MAX:
            lam = np.concatenate([self.all_survivals(), np.zeros((S, 1), F32)], 1)
            return _pick(*self.evaluate(st, lam, margin))
        grid, fine = _fine_prices()
        c1, k1, g1 = self.evaluate(st, np.broadcast_to(grid, (S, grid.shape[0])), margin)
        c2, k2, g2 = self.evaluate(st, fine[np.argmax(g1, -1)], margin)
        return _pick(np.concatenate([c1, c2], 2), np.concatenate([k1, k2], 2), np.concatenate([g1, g2], 1))


def _pick(choice, kept, g) -> tuple:
    best = np.argmax(g, -1)
    S = g.shape[0]
    return choice[np.arange(S), :, best], kept[np.arange(S), :, best], g[np.arange(S), best]


def _free_budget(st: _Step, total: int) -> int:
    """hybrid.free_budget: the largest B' >= B with table[T + B'] <= table[T + B]."""
    t = st.table
    cost = t[min(max(total + st.T, 0), t.shape[0] - 1)]
    last = int(np.searchsorted(t, cost, side="right")) - 1
    return max(total, last - st.T)


def _cap(st: _Step, budget: int) -> int:
    return budget if st.cap is None else min(budget, max(int(st.cap), 0))


def _forecast(v, name: str, forecast: str) -> Optional[np.ndarray]:
    """multi._forecast on numpy (float32 [R, K]); None where the mean chain holds a NaN or is not a CPU tensor."""
    conf = _f32(v.stale_chains[name][0])
    mean = v.means.get(name)
    if mean is None or forecast == "stale":
        return conf
    if not (isinstance(mean, torch.Tensor) and mean.is_cpu and mean.is_floating_point()):
        return None
    mean = mean.numpy().astype(F32)
    if np.isnan(mean).any():
        return None
    if forecast == "avg":
        return (conf + mean) * F32(0.5)
    return np.minimum(conf, mean) if forecast == "min" else mean


def _price_sets(v, st: _Step, names: tuple, sets: list, margin: float, forecast: str) -> Optional[tuple]:
    """hybrid._price_sets: (kept [S, R], goodput [S]) of the host-known chains of `names` once per drafter set."""
    stale = v.stale_chains
    S = len(sets)
    confs, lens = [], []
    for n in names:
        conf = _f32(stale[n][0]) if n == "dspark" else _forecast(v, n, forecast)
        if conf is None:
            return None
        confs.append(np.broadcast_to(conf, (S,) + conf.shape))
        length = stale[n][1].numpy()
        lens.append(np.stack([length if n in run else np.zeros_like(length) for run in sets]))
    draft = np.empty(S, np.float64)
    for i, run in enumerate(sets):
        d = st.draft
        for n in names:
            if n not in run:
                d = d - st.prices.get(n, 0.0)
        draft[i] = d
    _, kept, g = _Chains(confs, lens, draft).sweep(st, margin)
    return kept, g


def plan_skip(v: HostView, names: tuple, margin: float, hysteresis: float, forecast: str) -> Optional[Plan]:
    """hybrid.plan_skip (method sweep) on numpy, or None where not covered."""
    st = _covered_view(v, names, current=False)
    if st is None:
        return None
    base = tuple(n for n in names if n in hybrid.TWO) or names[:1]
    sides = hybrid.skip_sides(base)
    out = _price_sets(v, st, base, [tuple(n for n in base if n not in o) for o in sides], margin, forecast)
    if out is None:
        return None
    kept, g = out
    k = 0
    if len(sides) > 1:
        other = int(np.argmax(g[1:])) + 1
        k = 0 if g[other] <= g[0] * (1.0 + hysteresis) else other
    run, total = tuple(n for n in base if n not in sides[k]), int(kept[k].sum())
    for d in names:
        if d in base:
            continue
        with_d = tuple(n for n in names if n in run or n == d)
        out = _price_sets(v, st, names, [run, with_d], margin, forecast)
        if out is None:
            return None
        kept, g = out
        if g[1] > g[0] * (1.0 + hysteresis):
            run, total = with_d, int(kept[1].sum())
        else:
            total = int(kept[0].sum())
    budget = _cap(st, _free_budget(st, total))
    return Plan(frozenset(run), budget=torch.tensor(budget, dtype=torch.int64))


def plan_price(v: HostView, names: tuple, margin: float) -> Optional[Plan]:
    """hybrid.plan_price (method sweep) on numpy, or None where not covered."""
    st = _covered_view(v, names, current=False)
    if st is None:
        return None
    stale = v.stale_chains
    ch = _Chains([_f32(stale[n][0])[None] for n in names], [stale[n][1].numpy()[None] for n in names], None)
    _, kept, _ = ch.sweep(st, margin)
    return Plan(frozenset(names), budget=torch.tensor(_cap(st, int(kept[0].sum())), dtype=torch.int64))


def _allocate_chosen(b: StepBatch, st: _Step, names: tuple, draft: Optional[float], budget: Optional[int],
                     margin: float) -> Allocation:
    """hybrid.allocate_chosen (method sweep) on the batch's current chains of `names`."""
    cur = b.chains
    ch = _Chains([_f32(cur[n][0])[None] for n in names], [cur[n][1].numpy()[None] for n in names],
                 None if draft is None else np.array([draft]))
    choice, kept, _ = ch.sweep(st, margin)
    choice, kept = choice[0], kept[0]
    first = ch.surv[0, :, :, 0]  # [N, R]
    choice = np.where(kept == 0, np.argmax(first, 0), choice)
    lens = ch.len[0]  # [N, R]
    if names[0] == hybrid.MODEL and len(names) > 1:
        other = np.argmax(first[1:], 0) + 1
        choice = np.where((choice == 0) & (lens[0] == 0), other, choice)
    if budget is None:
        admitted = kept
    else:  # common.rank_scores of each chain, -inf outside the chosen one, in the definition's column order
        scores = []
        for i, K in enumerate(ch.Ks):
            s = ch.surv[0, i, :, :K]
            sc = np.where(np.arange(K) < lens[i][:, None], s, F32(-np.inf))
            scores.append(np.where((choice != i)[:, None], F32(-np.inf), sc))
        flat = np.concatenate(scores, 1)
        R = flat.shape[0]
        flat = flat.ravel()
        order = np.argsort(-flat, kind="stable")
        win = np.zeros(flat.shape[0], bool)
        win[order[:max(budget, 0)]] = True
        admitted = (win & (flat >= 0)).reshape(R, -1).sum(1)
    ids = np.array([chain_id(n) for n in names], I64)
    admitted = admitted.astype(I64)
    chain = np.where(admitted > 0, ids[choice], 0).astype(I64)
    return Allocation(chain=torch.from_numpy(chain), admitted=torch.from_numpy(admitted))


def allocate_skip(b: StepBatch, plan: Plan, names: tuple, margin: float) -> Optional[Allocation]:
    """hybrid.allocate_skip (method sweep) on numpy, or None where not covered."""
    ran = tuple(n for n in names if n in plan.drafters)
    st = _covered_view(b, ran, current=True) if ran else None
    if st is None or plan.budget is None or isinstance(b.num_sampling_reqs, torch.Tensor):
        return None
    draft = st.draft
    for n in names:
        if n not in ran:
            draft = draft - float(b.price(n))
    return _allocate_chosen(b, st, ran, draft, int(plan.budget), margin)


def allocate_price(b: StepBatch, plan: Plan, names: tuple, margin: float) -> Optional[Allocation]:
    """hybrid.allocate_price (method sweep) on numpy, or None where not covered."""
    st = _covered_view(b, names, current=True)
    if st is None or plan.budget is None:
        return None
    return _allocate_chosen(b, st, names, None, int(plan.budget), margin)


def _form(plan, alloc, definition_plan, definition_alloc, report_model: bool):
    """The three faces (module docstring), each falling back to the definition where the numpy one declines."""

    def plan_or_definition(v: HostView) -> Plan:
        p = plan(v)
        return definition_plan(v) if p is None else p

    def allocate_or_definition(b: StepBatch, p: Plan) -> Allocation:
        out = alloc(b, p)
        return definition_alloc(b, p) if out is None else out

    def fn(b: StepBatch) -> Allocation:
        p = plan_or_definition(host_view(b))
        out = allocate_or_definition(b, p)
        if report_model:  # hybrid.price_skip: the plan's model pass
            return Allocation(chain=out.chain, admitted=out.admitted, ran={MODEL: torch.tensor(p.runs(MODEL))})
        return out

    fn.plan, fn.allocate = plan_or_definition, allocate_or_definition
    fn.numpy_plan, fn.numpy_allocate = plan, alloc  # the transcriptions alone (None where they decline)
    return fn


@policy_form("hybrid", hybrid.price_skip, drafters=DRAFTER_SETS,
             specs=("hybrid", "hybrid:forecast=min", "hybrid:forecast=mean:hyst=0.2:margin=0.5",
                    "hybrid:forecast=stale:margin=0"))
def _parse_hybrid_n(params: List[str], names: tuple):
    method, margin, hyst, forecast, _ = hybrid.parse_hybrid(params)
    if method != "sweep" or _native() is None:
        return None
    return _form(lambda v: plan_skip(v, names, margin, hyst, forecast),
                 lambda b, p: allocate_skip(b, p, names, margin),
                 lambda v: hybrid.plan_skip(v, method, margin, hyst, forecast, names),
                 lambda b, p: hybrid.allocate_skip(b, p, method, margin, names), report_model=True)


@policy_form("hybrid-price", hybrid.price_with_budget, drafters=DRAFTER_SETS,
             specs=("hybrid-price", "hybrid-price:sweep", "hybrid-price:margin=0", "hybrid-price:margin=0.37"))
def _parse_hybrid_price_n(params: List[str], names: tuple):
    method, current, margin, _ = hybrid.parse_hybrid_price(params)
    if method != "sweep" or current or _native() is None:
        return None
    return _form(lambda v: plan_price(v, names, margin), lambda b, p: allocate_price(b, p, names, margin),
                 lambda v: hybrid.plan_price(v, method, margin, names),
                 lambda b, p: hybrid.allocate_price(b, p, method, margin, names), report_model=False)
