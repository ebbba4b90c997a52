"""The hybrids over any set of drafters, two drafters (dspark, ngram: the default run) being the case N = 2: the
seed's `hybrid-price` (every chain on one scale via a price per verified slot), the project's default `hybrid`, which
also prices the drafters' passes (`plan_skip`), and `hybrid-vllm`, the hybrid as the vLLM plugin runs it. This
module is the one definition of the chain choice; sim/core/policies/multi.py registers the families over the run's
other drafter sets with these same functions.

Math (docs/simulator.md, "Policies"). Chains d = 1..N in registry order (dspark first when enabled), conf_d [R, K_d],
len_d [R]; survivals a^d = cumprod(conf_d), 0 past len_d. Given a price lambda (a survival, i.e. expected accepted
tokens per slot), each chain's lambda-prefix is l_d = #{j : a^d_j > lambda}, its gain g_d = a^d_1 + ... + a^d_{l_d}
and its value V_d = g_d - l_d lambda = sum_j relu(a^d_j - lambda) [expected tokens]. Each request keeps one chain,
scanning d in order and switching to chain d iff
    V_d > V_best + margin,
so on (dspark, ngram) the n-gram chain is kept only if V_n > V_m + NGRAM_MARGIN, and a third chain must beat both.
The margin (expected tokens) corrects the winner's curse: picking the larger of two noisy estimates selects the
over-estimated one (on general text the n-gram slots chosen by max-V accept less than estimated). NGRAM_MARGIN = 1
was chosen on general text only (`python -m sim.sweep --preset tune`, 400 sampled requests of traces/general.jsonl,
batch 1/4/32/128), measured with `hybrid` while its forecast was still `min`: geometric-mean throughput over
adaptive 1.0039 (margin 0), 1.0034 (0.25), 1.0067 (0.5), 1.0085 (1), 1.0063 (1.5), 1.0061 (2). `hybrid`'s forecast
`avg` was then chosen on 150 sampled general requests at batch 1/4/32 (geometric means 1.0133 avg, 1.0099 min,
1.0085 mean); the preset reruns both comparisons with the current code. The batch goodput of the result is
    G = (N + sum of the kept gains) / (draft_ms + verify_ms[T + kept slots])   [tokens/ms].
At the optimum lambda = G* x (marginal step cost of one slot): a slot pays only if its survival beats what the slot
would earn elsewhere in the batch.

How lambda is found (`hybrid-price:METHOD`); all batched torch, no host sync, a fixed op count:
  model-opt    lambda = the survival of the first slot *left out* by adaptive's optimum B* over the first chain
               (computed from current values): on a batch with no n-gram match this reproduces adaptive's top-B*.
  fixed-point  lambda_0 = model-opt, then FP_ITERS times: allocate at lambda -> total slots S and G;
               lambda <- G x secant slope of verify_ms over [T+S, T+S+w], w = max(FP_MIN_WINDOW, S/2).
               A step-function table (CUDA-graph buckets) has zero marginal cost inside a bucket, so a
               one-slot difference would give lambda = 0 or a spike; the secant averages over buckets.
               Every iterate is scored and the best G is kept (never worse than model-opt).
  sweep        (default) evaluate G at a fixed set of candidate prices in one batched pass and keep the
               best. With at most SWEEP_EXACT_MAX slots in the batch the candidates are every slot's
               survival and 0, i.e. every allocation the threshold rule can produce (exact over the
               family). Above that, a two-stage grid with no sort: SWEEP_COARSE prices exp(-u), u
               log-spaced in [1e-3, 12], plus 0; then SWEEP_FINE prices linear in u between the two
               neighbours of the best one. Counts per chain are binary searches (searchsorted) on the
               survival rows and prefix sums are gathers, so a pass costs O(S R C log K), not O(S R C K).
               Measured against brute force it is the best of the three (tests/test_policies_optimality.py).

The chain choice (`choose`): the kept chain at the best price; where every lambda-prefix is empty, the chain with the
largest first survival (the first in order on ties); a request whose model chain (dspark, first) is empty takes the
best other chain (`allocate_chosen`; the plugin's `choose_chain` leaves that to its eligibility mask).

Budget consistency (what runs where in vLLM, `hybrid-price:METHOD`, the default):
  * CPU, stale values (one-step-old chains, as adaptive's budget): run METHOD and take its total kept slots as the
    step's draft budget B. Like adaptive's B*, this is what sizes the verify forward pass (the number of tokens
    must be known on the host before launch).
  * GPU, current values: run METHOD to get each request's chain choice, then admit the global top-B slots of the
    chosen chains by current survival (the same stable-sort top-B kernel as adaptive). B is already paid for, so
    the GPU fills it even if the current lambda would take fewer slots.
  The CPU part is the policy's plan (`plan_price`, on the HostView), the GPU part its allocate (`allocate_price`,
  with the Plan's budget): the step contract of sim/core/policies/base.py, so nothing on the device waits for the
  host and the host never reads a device value. (The simulator's C form, sim/engine/policy_fast.py, runs both
  sides of the two-drafter case in one call with the same results; sim/engine/policy_fast_multi.py transcribes
  the same functions over any drafters.)
  `hybrid-price:METHOD:current` skips the stale budget and admits the current lambda-prefixes directly
  (the idealised allocation; its token count is data dependent, so in vLLM it would need a host sync or
  padding to the maximum). The optimality tests measure this core.
  `hybrid` (plan_skip): on the host-known chains (the model chain as last drafted, each model-free chain forecast
  slot by slot from its last and its mean proposal, forecast F), each drafter set priced at the drafters it runs:
  first the model pass runs unless the step over the two default drafters earns more than G_all (1 + H) without it,
  then each further drafter joins iff the step earns more than G (1 + H) with it; B = the chosen set's kept slots
  widened to the free ones (`free_budget`), capped. allocate: as hybrid-price over the chains that ran.

Online recalibration (`hybrid:...:recal=k`, `hybrid-price:...:recal=k`; off by default): the same two phases on the
view's confidences corrected per request and drafter by the offsets the engine keeps from each request's own
outcomes (`with_recal`; the math, the prior precision k and the invariants in sim/core/drafters/recalibration.py).
No fast form transcribes it (get_policy attaches none), so the simulator runs these definitions.
`runcal=k` is the same with one offset per drafter for the whole run. `table=T` (registry.with_table): T = step
prices verify slots with the step's own verify table instead of vLLM's start-up profile (the engine hands it in
verify_cost_ms; the functions are unchanged). Neither has a fast form.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List

import torch

from sim.core.drafters import DEFAULT_DRAFTERS
from sim.core.drafters.recalibration import recalibrated
from sim.core.policies.adaptive import alloc_adaptive, stale_model_budget
from sim.core.policies.base import FREE, MODEL, NGRAM, Allocation, HostView, Plan, StepBatch, host_view
from sim.core.policies.common import (CHAIN_MODEL, CHAIN_NONE, CONST, best_budget, cap_budget, count_above, finish,
                                 goodput, prefix_sum, rank_scores, slot_valid, survival, top_b_counts, verify_ms)
from sim.core.policies.registry import (Policy, TableOption, parse_spec, register, spec_name, spec_usage, spec_written,
                                        split_option, with_table)
from sim.core.settings import setting
# the plugin's settings and the constants they share with these policies (declared below the policies: the vLLM
# plugin reads them without loading this module; sim.core.vllm without an import circle)
from sim.core.plugin_settings import (DEFAULT_METHOD, MARGIN_HELP, METHOD_HELP, METHODS, NGRAM_MARGIN, PLUGIN_OPTIONS,
                                      PluginSettings)
from sim.core.vllm import VllmRun

FP_ITERS = 4
FP_MIN_WINDOW = 4
SWEEP_EXACT_MAX = 256  # up to this many slots, the sweep tries every survival as the price (exact)
SWEEP_COARSE = 48
SWEEP_FINE = 32
# hybrid's host-side forecast of a request's model-free chain from (previous proposal, mean proposal)
FORECAST_RULES = {"avg": lambda last, mean: 0.5 * (last + mean), "min": torch.minimum,
              "mean": lambda last, mean: mean, "stale": lambda last, mean: last}
FORECASTS = tuple(FORECAST_RULES)  # the first is the default
FILLS = ("cut", "vllm")  # hybrid-vllm's fill=: the slots past the chosen chain cut (the default), or as vLLM verifies
BUDGETS = ("stale", "current")  # hybrid-vllm's budget=: vLLM's (one step old), or a what-if on the current publication

# ---- The families' settings, declared once (sim/core/settings.py): the spec grammar, its usage, its errors and the
# canonical names are made from these (registry.parse_spec, spec_usage, spec_name).


@dataclass(frozen=True)
class HybridSettings:
    """`hybrid`'s own settings (its options recal/runcal/table: RecalOptions, TableOption)."""

    method: str = setting(DEFAULT_METHOD, METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD")
    margin: float = setting(NGRAM_MARGIN, MARGIN_HELP, lo=0.0, metavar="M")
    hyst: float = setting(0.0, "expected tokens by which skipping the model drafter's pass must win (makes skipping "
                               "harder)", lo=0.0, metavar="H")
    forecast: str = setting(FORECASTS[0], "the host's forecast of a request's n-gram chain from its last and mean "
                                          "proposals", choices=FORECASTS, metavar="F")


@dataclass(frozen=True)
class HybridPriceSettings:
    """`hybrid-price`'s own settings (its options: RecalOptions, TableOption)."""

    method: str = setting(DEFAULT_METHOD, METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD")
    current: bool = setting(False, "no stale budget: admit the current lambda-prefixes (idealised)")
    margin: float = setting(NGRAM_MARGIN, MARGIN_HELP, lo=0.0, metavar="M")


@dataclass(frozen=True)
class RecalOptions:
    """The online recalibration options of `hybrid` and `hybrid-price` (with_recal): one or the other."""

    recal: float = setting(None, "online recalibration of the drafters' confidences from each request's outcomes, "
                                 "prior precision k", lo=0.0, strict=True, metavar="k")
    runcal: float = setting(None, "the same with one offset per drafter learnt from every request of the run",
                            lo=0.0, strict=True, metavar="k", alt="recal")


@dataclass(frozen=True)
class FillOption:
    """`hybrid-vllm`'s simulator-only option: how the simulator treats the slots vLLM verifies past the chosen chain
    (alloc_hybrid_vllm); no plugin setting, since the plugin publishes and vLLM admits the same either way."""

    fill: str = setting(FILLS[0], "the slots vLLM's top-B admits past each chosen chain: cut (not charged; the "
                                  "committed reports) or vllm (admitted as vLLM's topk does, charged, DSpark's own "
                                  "tokens accepted; implied by tail > 0)", choices=FILLS, metavar="F")
    budget: str = setting(BUDGETS[0], "what vLLM's budget B* is computed from: stale (the confidences published a "
                                      "step earlier, as vLLM does) or current (a what-if no vLLM runs: this step's "
                                      "publication; what the one-step-old budget loses)", choices=BUDGETS,
                          metavar="B")


TWO = DEFAULT_DRAFTERS  # the default run's drafters: the two-drafter entry points' `names`
ALWAYS_RUNS = "ngram"  # a cheap GPU kernel that always runs (plan_skip never prices leaving it out)


class Chains:
    """N chains' survivals for S "sides" at once (S = 1: current values; S > 1: e.g. drafter sets priced in one
    pass, evaluated by the same ops): confs [S, R, K_d] and lens [S, R] per chain, in order (computed in the first
    chain's dtype). survs[d] [S, R, K_d] (0 on absent slots); negs[d] = -survival (ascending along a row, for
    searchsorted); cs[d] = prefix sums with a leading 0, so cs[d][..., l] = sum of the first l survivals. draft_ms:
    None (every side pays the batch's draft_cost_ms) or [S, 1], each side's drafter cost [ms]. model_first: the
    first chain is the model chain; surv_m / len_m name the first chain (model_opt_lambda's)."""

    def __init__(self, confs: list, lens: list, draft_ms=None, model_first: bool = True):
        dt = confs[0].dtype
        self.survs = [survival(c if c.dtype == dt else c.to(dt), n) for c, n in zip(confs, lens)]
        self.lens = lens
        self.negs = [-s for s in self.survs]
        self.cs = [torch.nn.functional.pad(prefix_sum(s), (1, 0)) for s in self.survs]
        self.draft_ms, self.model_first = draft_ms, model_first
        self.surv_m, self.len_m = self.survs[0], lens[0]

    @classmethod
    def current(cls, batch: StepBatch, names: tuple, draft_ms=None) -> "Chains":
        """The batch's current chains of `names` (one side)."""
        ch = batch.chains
        return cls([ch[n][0][None] for n in names], [ch[n][1][None] for n in names], draft_ms, names[0] == MODEL)

    def num_slots(self) -> int:
        """R * sum K_d: the slots of one side."""
        return sum(s[0].numel() for s in self.survs)

    def all_survivals(self) -> torch.Tensor:
        """[S, R * sum K_d]: every slot's survival (0 for absent slots)."""
        return torch.cat(self.survs, -1).flatten(1)


def evaluate(batch: StepBatch, ch: Chains, lam: torch.Tensor, margin: float = 0.0):
    """Allocation at candidate prices lam [S, C]: (choice [S, R, C], the kept chain's index, kept slots [S, R, C]
    int64, goodput [S, C]) by the module docstring's rule. Per chain l = #{j : a_j > lam} (a binary search, since a
    is non-increasing), gain = a_1 + ... + a_l and V = gain - l * lam. Cost O(S R C log K). A choice is int64, or
    bool where there are two chains (True: the second; `select` and `chain_of` read either), so that the two-chain
    case runs the ops the vLLM plugin's per-step budget allows (real/vllm_plugin/checks.py)."""
    lam_r = lam[:, None, :].expand(-1, ch.surv_m.shape[1], -1)  # [S, R, C]
    neg = (-lam_r).contiguous()  # searchsorted on an expanded view takes a slow path (~20x)
    last = len(ch.survs) - 1
    choice = gain = slots = value = None
    for i, (ng, cs) in enumerate(zip(ch.negs, ch.cs)):
        n = count_above(ng, neg)  # #{-a < -lam} = #{a > lam}
        g = cs.gather(-1, n)
        v = g - n * lam_r
        if i == 0:
            gain, slots, value = g, n, v
            continue
        take = v > value + margin
        # chain 1 replaces an all-zero choice: take itself; the last chain's value is never compared again
        choice = (take if last == 1 else take.to(torch.int64)) if i == 1 else torch.where(take, i, choice)
        gain, slots = torch.where(take, g, gain), torch.where(take, n, slots)
        if i < last:
            value = torch.where(take, v, value)
    if choice is None:
        choice = torch.zeros_like(slots)
    return choice, slots, goodput(batch, gain.sum(1), slots.sum(1), ch.draft_ms)


def _pick(choice, kept, g):
    """The candidate with the best goodput on each side: ([S, R] int64, [S, R] int64, best G [S])."""
    best = torch.argmax(g, dim=-1)
    idx = best[:, None, None].expand(-1, choice.shape[1], 1)
    return choice.gather(2, idx)[..., 0], kept.gather(2, idx)[..., 0], g.gather(1, best[:, None])[:, 0]


def model_opt_lambda(batch: StepBatch, ch: Chains) -> torch.Tensor:
    """lambda = survival of the first slot left out by the first chain's optimum B* (0 if all are in): [S, 1]."""
    budget, sorted_scores = best_budget(batch, rank_scores(ch.surv_m, ch.len_m), ch.draft_ms)
    padded = torch.nn.functional.pad(sorted_scores.clamp(min=0.0), (0, 1))
    return padded.gather(-1, budget[:, None])


def lambda_model_opt(batch: StepBatch, ch: Chains, margin: float = 0.0):
    return _pick(*evaluate(batch, ch, model_opt_lambda(batch, ch), margin))


def lambda_fixed_point(batch: StepBatch, ch: Chains, margin: float = 0.0, iters: int = FP_ITERS):
    lam = model_opt_lambda(batch, ch)
    uses, adms, gs = [], [], []
    for _ in range(iters + 1):  # fixed trip count: unrolled under compile, no data-dependent control
        choice, admitted, g = evaluate(batch, ch, lam, margin)
        uses.append(choice)
        adms.append(admitted)
        gs.append(g)
        total = admitted.sum(1)  # [S, 1]
        window = torch.clamp(total // 2, min=FP_MIN_WINDOW)
        slope = (verify_ms(batch, total + window) - verify_ms(batch, total)) / window
        lam = (g * slope.to(g.dtype)).clamp(0.0, 1.0)
    return _pick(torch.cat(uses, 2), torch.cat(adms, 2), torch.cat(gs, 1))


def lambda_sweep(batch: StepBatch, ch: Chains, margin: float = 0.0):
    if ch.num_slots() <= SWEEP_EXACT_MAX:
        # every survival (and 0) as the price: all allocations of the threshold family are tried
        lam = torch.nn.functional.pad(ch.all_survivals(), (0, 1))
        return _pick(*evaluate(batch, ch, lam, margin))
    return _two_stage_sweep(batch, ch, margin)


def _price_grid(n: int, device, dtype) -> torch.Tensor:
    """SWEEP_COARSE prices lambda = exp(-u), u log-spaced in [1e-3, 12], plus lambda = 0 (cached)."""
    key = ("price-grid", n, str(device), dtype)
    out = None if torch.compiler.is_compiling() else CONST.get(key)
    if out is None:
        u = torch.logspace(-3.0, math.log10(12.0), n - 1, dtype=torch.float64)
        out = torch.cat([torch.exp(-u), torch.zeros(1, dtype=torch.float64)]).to(device=device, dtype=dtype)
        if not torch.compiler.is_compiling():
            CONST[key] = out
    return out


def _two_stage_sweep(batch: StepBatch, ch: Chains, margin: float = 0.0):
    """Stage 1: SWEEP_COARSE fixed prices lambda = exp(-u), u log-spaced in [1e-3, 12] (lambda from
    0.999 down to 6e-6), plus 0; stage 2: SWEEP_FINE prices spaced linearly in u between the two
    neighbours of the best stage-1 price. No sort, fixed shapes, no host sync."""
    dt, dev = ch.surv_m.dtype, ch.surv_m.device
    grid = _price_grid(SWEEP_COARSE, dev, dt)
    lam1 = grid[None, :].expand(ch.surv_m.shape[0], -1)
    use1, adm1, g1 = evaluate(batch, ch, lam1, margin)
    best = torch.argmax(g1, -1, keepdim=True)  # [S, 1]
    u = -torch.log(grid.clamp(min=1e-12))  # price 0 -> u = 27.6 (a finite stand-in)
    u_lo = u[(best - 1).clamp(min=0)]
    u_hi = u[(best + 1).clamp(max=grid.shape[0] - 1)]
    q = torch.linspace(0.0, 1.0, SWEEP_FINE, device=dev, dtype=dt)
    use2, adm2, g2 = evaluate(batch, ch, torch.exp(-(u_lo + q * (u_hi - u_lo))), margin)
    return _pick(torch.cat([use1, use2], 2), torch.cat([adm1, adm2], 2), torch.cat([g1, g2], 1))


LAMBDA_METHODS = {"model-opt": lambda_model_opt, "fixed-point": lambda_fixed_point, "sweep": lambda_sweep}


def chain_ids(names: tuple) -> torch.Tensor:
    """The registry's chain ids of `names` (int64 [N]): Allocation.chain of each chain index (cached)."""
    key = ("chain-ids", names)
    out = CONST.get(key)
    if out is None:
        from sim.core.drafters.registry import chain_id  # not at import: the vLLM plugin loads none of the drafters

        out = torch.tensor([chain_id(n) for n in names], dtype=torch.int64)
        if not torch.compiler.is_compiling():
            CONST[key] = out
    return out


def others(names: tuple) -> frozenset:
    """The drafters of `names` beyond the two defaults (Policy.uses_extra)."""
    return frozenset(n for n in names if n not in TWO)


def select(rows: list, choice: torch.Tensor) -> torch.Tensor:
    """Per request, the chosen chain's row (rows: one tensor [R] or [R, W] per chain; choice [R] as `evaluate`'s)."""
    two_d = rows[0].dim() == 2
    if choice.dtype == torch.bool:
        return torch.where(choice[:, None] if two_d else choice, rows[1], rows[0])
    c = choice[None, :, None].expand(1, -1, rows[0].shape[1]) if two_d else choice[None]
    return torch.stack(rows).gather(0, c)[0]


def chain_of(names: tuple, choice: torch.Tensor) -> torch.Tensor:
    """The registry's chain id of each request's chosen chain (int64 [R])."""
    ids = chain_ids(names)
    return torch.where(choice, ids[1], ids[0]) if choice.dtype == torch.bool else ids[choice]


def _left_out(choice: torch.Tensor, i: int) -> torch.Tensor:
    """Where chain i is not the chosen one (bool [R])."""
    if choice.dtype == torch.bool:
        return choice if i == 0 else ~choice
    return choice != i


def choose(batch: StepBatch, ch: Chains, method: str, margin: float) -> tuple:
    """Per request of one side, (the chain to keep, as `evaluate`'s choice, its kept slots at the best price (int64
    [R])): METHOD's choice; where every lambda-prefix is empty, the largest first survival (the first in order on
    ties; a NaN survival is not ordered: no fast form takes one)."""
    choice, kept, _ = LAMBDA_METHODS[method](batch, ch, margin)
    choice, kept = choice[0], kept[0]
    if len(ch.survs) == 1:
        return choice, kept
    if len(ch.survs) == 2:
        best = ch.survs[1][0, :, 0] > ch.survs[0][0, :, 0]
    else:
        best = torch.argmax(torch.stack([s[0, :, 0] for s in ch.survs]), 0)  # [R]
    return torch.where(kept == 0, best, choice), kept


def allocate_chosen(batch: StepBatch, ch: Chains, names: tuple, budget, method: str, margin: float) -> Allocation:
    """The current chain choice by price (`choose`; a request whose model chain is empty takes the best other
    one), then the global top-B of the chosen chains' survivals (budget None: each request's lambda-prefix, the
    idealised allocation)."""
    choice, kept = choose(batch, ch, method, margin)
    if ch.model_first and len(names) == 2:
        choice = choice | (ch.lens[0][0] == 0)
    elif ch.model_first and len(names) > 2:
        other = torch.argmax(torch.stack([s[0, :, 0] for s in ch.survs[1:]]), 0) + 1
        choice = torch.where((choice == 0) & (ch.lens[0][0] == 0), other, choice)
    if budget is None:
        admitted = kept
    else:
        scores = [rank_scores(s[0], n[0]).masked_fill(_left_out(choice, i)[:, None], float("-inf"))
                  for i, (s, n) in enumerate(zip(ch.survs, ch.lens))]
        admitted = top_b_counts(torch.cat(scores, 1), budget)
    return finish(chain_of(names, choice), admitted)


def price_core(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
               names: tuple = TWO) -> Allocation:
    """The idealised allocation: each request's lambda-prefix of its chosen chain, current values only."""
    return allocate_chosen(batch, Chains.current(batch, names), names, None, method, margin)


def plan_price(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
               names: tuple = TWO) -> Plan:
    """Host phase of `hybrid-price`: METHOD on the stale chains; their total kept slots are the step's budget B
    (capped by vLLM's logits buffer). Every drafter of `names` runs. Computed in the first stale chain's dtype."""
    st = view.stale_chains
    ch = Chains([st[n][0][None] for n in names], [st[n][1][None] for n in names], None, names[0] == MODEL)
    _, kept, _ = LAMBDA_METHODS[method](view, ch, margin)
    return Plan(frozenset(names), budget=cap_budget(view, kept[0].sum()))


def allocate_price(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                   names: tuple = TWO) -> Allocation:
    """Device phase of `hybrid-price`: METHOD on the current chains chooses each request's chain (`allocate_chosen`),
    then the global top-B (B = plan.budget) of the chosen chains' current survivals."""
    return allocate_chosen(batch, Chains.current(batch, names), names, plan.budget, method, margin)


def price_with_budget(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                      names: tuple = TWO) -> Allocation:
    """vLLM-consistent hybrid on one view: the stale budget B (plan_price, CPU part), then the current chain
    choice by price and the global top-B of the chosen chains (allocate_price, GPU part)."""
    return allocate_price(batch, plan_price(host_view(batch), method, margin, names), method, margin, names)


def free_budget(batch: StepBatch, budget: torch.Tensor) -> torch.Tensor:
    """Widen a budget B to every slot that costs nothing more: the largest B' >= B with
    verify_ms[T + B'] <= verify_ms[T + B] (a flat, memory-bound stretch of the table, or the rest of a
    CUDA-graph bucket the pass is padded to anyway). The stale optimum's first-maximum rule stops at the
    last stale slot; this lets the current chains, which may be longer, use the slots the step pays for
    anyway. 0-d int64, no host sync (the table is monotone, so a binary search finds B')."""
    table = batch.verify_cost_ms
    b1 = budget.reshape(1)  # a [1] index, not 0-d: a 0-d tensor index is a data-dependent scalar under compile
    cost = verify_ms(batch, b1).to(table.dtype)
    last = torch.searchsorted(table, cost, right=True) - 1  # largest t with table[t] <= cost
    return torch.maximum(b1, last - batch.num_nondraft_tokens)[0]


def price_skip(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
               hysteresis: float = 0.0, forecast: str = FORECASTS[0], names: tuple = TWO) -> Allocation:
    """`hybrid`: hybrid-price that also prices the drafters' passes and skips a pass for the whole step when the
    step is worth more without it (plan_skip, then allocate_skip), reporting the plan's model pass.

    Host side (stale values only, known before the step is launched), on two drafters: price the batch twice,
      G_both = best goodput over both chains, paying draft_cost_ms,
      G_ngram = best goodput over the n-gram chains alone, paying draft_cost_ms less the model drafter's price,
    and skip the model pass iff G_ngram > G_both * (1 + hysteresis). The chosen scenario's total kept slots are
    the step's budget B, as in `price_with_budget`. Device side (current values): the chain choice by price and
    the global top-B of the chosen chains, over the chains that ran (the current model chains of a skipped pass
    are never read: they were not drafted). A request whose model chain is empty takes the best other chain.
    Host-side forecasts (all known before the step): a request's model chain is the previous step's when
    the pass ran then, else the mean of the chains drafted for it so far (the engine keeps it), so the
    decision never uses a chain that was not drafted; a model-free chain is, slot by slot, the average
    (`forecast="avg"`, the default; or min / mean / stale) of the previous proposal and the request's mean
    proposal (`HostView.means`), because a copy that held at the last step predicts the next step well
    only in a request that keeps copying (an edit), not in one whose matches are short-lived (chat).
    The budget is capped like adaptive's by vLLM's logits buffer (`cap_budget`).
    """
    plan = plan_skip(host_view(batch), method, margin, hysteresis, forecast, names)
    out = allocate_skip(batch, plan, method, margin, names)
    return Allocation(chain=out.chain, admitted=out.admitted, ran={MODEL: torch.tensor(plan.runs(MODEL))})


def _forecast(view: HostView, name: str, forecast: str, dt) -> torch.Tensor:
    """A model-free chain's host-side forecast: forecast F of its last proposal and its mean one."""
    conf = view.stale_chains[name][0].to(dt)
    mean = view.means.get(name)
    return conf if mean is None else FORECAST_RULES[forecast](conf, mean.to(dt))


def skip_sides(names: tuple) -> list:
    """The drafter sets hybrid's plan prices, as the drafters each leaves out: none first, then every subset of
    the skippable drafters (all but ALWAYS_RUNS) that leaves one drafter at least. On (dspark, ngram):
    [{}, {dspark}], with the model pass and without it."""
    skippable = [n for n in names if n != ALWAYS_RUNS]
    sides = []
    for mask in range(2 ** len(skippable)):
        left_out = frozenset(n for i, n in enumerate(skippable) if mask >> i & 1)
        if len(left_out) < len(names):
            sides.append(left_out)
    return sides


def _price_sets(view: HostView, names: tuple, sets: list, method: str, margin: float, forecast: str):
    """METHOD on the host-known chains of `names` once per drafter set in `sets` (a side each: the chains of
    drafters outside the set empty, their prices off draft_cost_ms): (kept slots [S, R], goodput [S])."""
    st = view.stale_chains
    dt = st[names[0]][0].dtype
    S = len(sets)
    confs, lens = [], []
    for n in names:
        conf = st[n][0] if n == MODEL else _forecast(view, n, forecast, dt)
        confs.append(conf[None].repeat(S, 1, 1))
        zero = torch.zeros_like(st[n][1])
        lens.append(torch.stack([st[n][1] if n in run else zero for run in sets]))
    full = torch.as_tensor(view.draft_cost_ms, dtype=torch.float64)
    draft = []
    for run in sets:
        d = full
        for n in names:
            if n not in run:
                d = d - torch.as_tensor(view.price(n), dtype=torch.float64)
        draft.append(d)
    _, kept, g = LAMBDA_METHODS[method](view, Chains(confs, lens, torch.stack(draft)[:, None], names[0] == MODEL),
                                        margin)
    return kept, g


def plan_skip(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
              hysteresis: float = 0.0, forecast: str = FORECASTS[0], names: tuple = TWO) -> Plan:
    """Host phase of `hybrid` over `names` (module docstring): first the two default drafters' decision
    (`skip_sides`: run the model pass unless the step earns more than G_all (1 + hysteresis) without it), then
    each further drafter in order joins iff the step with it earns more than G (1 + hysteresis) without it; B =
    the chosen set's kept slots widened to the free ones, capped. Plan.drafters is read on the host: the view is
    host data."""
    base = tuple(n for n in names if n in TWO) or names[:1]
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
    return Plan(frozenset(run), budget=cap_budget(view, free_budget(view, total)))


def allocate_skip(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                  names: tuple = TWO) -> Allocation:
    """Device phase of `hybrid` over `names`: hybrid-price's allocation over the chains that ran (the others were
    not drafted and are not read), priced at the drafters that ran."""
    ran = tuple(n for n in names if n in plan.drafters)
    draft = torch.as_tensor(batch.draft_cost_ms, dtype=torch.float64)
    for n in names:
        if n not in ran:
            draft = draft - torch.as_tensor(batch.price(n), dtype=torch.float64)
    return allocate_chosen(batch, Chains.current(batch, ran, draft.reshape(1, 1)), ran, plan.budget, method, margin)


def hybrid_policy(name: str, names: tuple, method: str, margin: float, hysteresis: float, forecast: str,
                  **uses) -> Policy:
    """The `hybrid` Policy over `names`: plan_skip, allocate_skip, and fn = both on one view (price_skip)."""
    return Policy(name, lambda b: price_skip(b, method, margin, hysteresis, forecast, names), **uses,
                  plan_fn=lambda v: plan_skip(v, method, margin, hysteresis, forecast, names),
                  alloc_fn=lambda b, p: allocate_skip(b, p, method, margin, names))


def hybrid_price_policy(name: str, names: tuple, method: str, current: bool, margin: float, **uses) -> Policy:
    """The `hybrid-price` Policy over `names`: single-phase price_core with `current`, else plan_price and
    allocate_price (fn = both on one view, price_with_budget)."""
    if current:  # no host budget: single-phase
        return Policy(name, lambda b: price_core(b, method, margin, names), **uses)
    return Policy(name, lambda b: price_with_budget(b, method, margin, names), **uses,
                  plan_fn=lambda v: plan_price(v, method, margin, names),
                  alloc_fn=lambda b, p: allocate_price(b, p, method, margin, names))


def choose_chain_n(view: StepBatch, confs: list, lens: list, model_first: bool, method: str,
                   margin: float) -> torch.Tensor:
    """Per request, the chain to publish among the chains (confs [R, K_d], lens [R]), as `evaluate`'s choice:
    `choose` on the view's step shape."""
    return choose(view, Chains([c[None] for c in confs], [n[None] for n in lens], None, model_first), method,
                  margin)[0]


def choose_chain(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> torch.Tensor:
    """Per request, whether its n-gram chain is the one to verify (bool [R]), from the batch's current values:
    choose_chain_n over (model, n-gram). The chain-choice half of `price_with_budget`, without a budget: what the
    vLLM plugin runs per step."""
    (mc, ml), (nc, nl) = batch.chains[MODEL], batch.chains[NGRAM]
    return choose_chain_n(batch, [mc, nc], [ml, nl], True, method, margin)


def published_view(batch: StepBatch, k: int, stale: bool = False, names: tuple = TWO) -> StepBatch:
    """The batch as the vLLM plugin sees it when it chooses (current or, with stale=True, last step's values), over
    `names`: model-free chains cut to the k slots vLLM drafts (num_speculative_tokens), and a decode-only step shape
    (T = N = R) because the plugin chooses right after a verify pass, before the next step is scheduled."""
    src = batch.stale_chains if stale else batch.chains
    chains = {}
    for n in names:
        conf, length = src[n]
        chains[n] = (conf, length) if n == MODEL else (conf[:, :k], length.clamp(max=k))
    R = batch.num_reqs
    return dataclasses.replace(batch, chains=chains, stale_chains=chains, num_nondraft_tokens=R, num_sampling_reqs=R,
                               true_acc={}, true_verify_cost_ms=None)


def publish_n(confs: list, lens: list, choice: torch.Tensor, W: int, tail: float = 0.0) -> torch.Tensor:
    """The confidences the plugin writes for vLLM's adaptive verification ([R, W], the first chain's dtype): the
    chosen chain's (choice [R], as `evaluate`'s) per-slot conditional acceptance, `tail` (hybrid_spec.tail, a
    conditional confidence in [0, TAIL_MAX]) past that chain's length: survival a_L tail^(j - L + 1) at slot j >= L,
    below every slot of the chain, so such a slot only fills a budget that has no better slot left (0: exact zeros,
    which vLLM's top-B admits among ties; see alloc_hybrid_vllm)."""
    dt = confs[0].dtype
    rows = []
    for c, n in zip(confs, lens):
        if c.shape[1] > W:  # a chain wider than W is cut to it (a narrower one's lengths are within it already)
            c, n = c[:, :W], n.clamp(max=W)
        c = c if c.dtype == dt else c.to(dt)
        valid = slot_valid(n, c.shape[1])
        c = c * valid if not tail else torch.where(valid, c, _const(float(tail), c))
        if c.shape[1] < W:
            c = torch.nn.functional.pad(c, (0, W - c.shape[1]), value=float(tail))
        rows.append(c)
    return select(rows, choice)


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    """A cached 0-d tensor of `value` on `like`'s device and dtype (made once: the plugin's step stays within its op
    budget and uploads nothing)."""
    key = ("const", value, str(like.device), like.dtype)
    out = None if torch.compiler.is_compiling() else CONST.get(key)
    if out is None:
        out = torch.tensor(value, dtype=like.dtype, device=like.device)
        if not torch.compiler.is_compiling():
            CONST[key] = out
    return out


def publish(model_conf: torch.Tensor, model_len: torch.Tensor, ngram_conf: torch.Tensor, ngram_len: torch.Tensor,
            use_ngram: torch.Tensor, width: int | None = None, tail: float = 0.0) -> torch.Tensor:
    """publish_n over (model, n-gram) by use_ngram (bool [R]), W = width or model_conf's width K."""
    W = model_conf.shape[1] if width is None else width
    return publish_n([model_conf, ngram_conf], [model_len, ngram_len], use_ngram, W, tail)


def vllm_top_b(scores: torch.Tensor, budget: torch.Tensor, sched: torch.Tensor) -> torch.Tensor:
    """The draft slots vLLM 0.33's adaptive verification verifies per request (int64 [R]), as its reallocate_drafts
    and _assign_draft_token_budget do: scores [R, W] the current published survivals, -inf past the scheduled
    drafts sched [R]; budget B (0-d). B >= sum(sched): every scheduled slot (vLLM runs no top-B then); B = 0: none;
    else the row counts of `topk(B)` over the flattened scores (vLLM verifies the first count slots of a row).
    Where B exceeds the slots of positive survival the top-B picks among ties at 0 (the slots past each chosen
    chain): vLLM's device topk leaves their order unspecified (it is not stable on the GPU); this models it as
    the deterministic CPU torch.topk picks them. Whatever it picks, the counts sum to min(B, sum(sched)) and each
    row's is at most its sched (tests/test_hybrid_tail.py). Reads B on the host: a simulator-only function (the
    plugin leaves the admission to vLLM)."""
    total = int(sched.sum())
    b = int(budget)
    if b >= total:
        return sched.to(torch.int64).clone()
    if b <= 0:
        return torch.zeros_like(sched, dtype=torch.int64)
    flat = scores.to(torch.float32).flatten()  # vLLM ranks float32 survivals
    win = torch.zeros_like(flat, dtype=torch.bool).index_fill_(0, flat.topk(b).indices, True)
    return win.view(scores.shape).sum(1).to(torch.int64)


def alloc_hybrid_vllm(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                      slots: int | None = None, names: tuple = TWO, ran: tuple | None = None,
                      fill: str = "cut", tail: float = 0.0, budget: str = "stale") -> Allocation:
    """`hybrid-vllm`: the hybrid as the vLLM plugin (real/vllm_plugin) runs it inside vLLM 0.33, over `names`
    (dspark first; `ran`: the drafters that ran this step, None = all).

    The plugin chooses each request's chain among the chains that ran (`choose_chain_n` on `published_view`:
    K-slot model and W-slot model-free chains, T = N = R) and publishes that chain's confidences (`publish_n`);
    vLLM's adaptive verification then runs unchanged on them: the budget B* from the confidences published at the
    previous step (stale, on the CPU, chosen among all chains), the global top-B* of the current published
    survivals (on the GPU), i.e. `alloc_adaptive` on the published chains. The previous step's publication is
    re-derived here from the stale values with this step's shape (exact in steady decoding; when requests join or
    leave, the plugin chose with the old R). A slot past the chosen chain's length has survival 0 and is admitted
    only when B* exceeds the slots with positive survival; vLLM then verifies the token there.
    fill="cut" (the committed reports' approximation): the stable top-B, the admitted count cut to the chain's
    length, those slots neither charged nor accepted. fill="vllm" (`hybrid-vllm:...:fill=vllm`, implied by
    tail > 0): vLLM's own top-B over the published survivals (`vllm_top_b`, ties at 0 as the CPU topk picks them),
    every slot it verifies charged (Allocation.verified), and past a chosen model-free chain the plugin's tokens are
    DSpark's own (slots < K_b when its pass ran: Allocation.past_chain = CHAIN_MODEL), which the engine accepts as
    the trace replay says (a filler, past both chains, CHAIN_NONE, is never accepted). tail: the confidence the
    plugin publishes past its chosen chain (publish_n), what vLLM budgets and ranks those slots by.
    budget="current" (a what-if no vLLM runs): B* from this step's publication instead of the last step's, which
    measures what the stale budget loses.

    slots = W > K (`hybrid-vllm:slots=W`, a what-if the plugin cannot run today: DSpark's speculator drafts
    exactly its block of K): vLLM schedules W draft slots per request, the model chain is padded with
    survival 0 and the model-free chains keep up to W tokens. Requests whose model chain is cut by the end of
    their output (model_len < K) are scheduled model_len slots, the others W. After a skipped model pass every
    request publishes a model-free chain (the current model chains were not drafted and are not read).
    A real engine's recorded choices (StepBatch.replay) replace the current and the stale choice where recorded
    (take_recorded); Allocation.own_chain keeps this rule's own current choice."""
    ran = names if ran is None else ran
    K = batch.chains[MODEL][0].shape[1]
    W = K if slots is None else max(int(slots), K)
    cur, old = published_view(batch, W, names=names), published_view(batch, W, stale=True, names=names)
    confs, lens = [cur.chains[n][0] for n in names], [cur.chains[n][1] for n in names]
    oconfs, olens = [old.chains[n][0] for n in names], [old.chains[n][1] for n in names]
    idx = [i for i, n in enumerate(names) if n in ran]
    sub = choose_chain_n(cur, [confs[i] for i in idx], [lens[i] for i in idx], names[idx[0]] == MODEL, method,
                         margin)
    choice = sub if len(idx) == len(names) else _index(idx)[sub.to(torch.int64)]
    use_stale = choose_chain_n(old, oconfs, olens, True, method, margin)
    own = None
    if batch.replay is not None:  # a real engine's recorded choices, taken where recorded (take_recorded)
        own = chain_of(names, choice)
        choice = take_recorded(names, choice, batch.replay.chain, idx)
        use_stale = take_recorded(names, use_stale, batch.replay.stale_chain, list(range(len(names))))
    pub = publish_n(confs, lens, choice, W, tail)
    pub_stale = publish_n(oconfs, olens, use_stale, W, tail) if budget == "stale" else pub
    if budget == "stale" and W > K:  # vLLM's reset (add_request) writes 1.0 into all W slots of a new request's row
        pub_stale = torch.where(reset_rows(batch.stale_chains[MODEL][0])[:, None], _const(1.0, pub_stale), pub_stale)
    sched = scheduled_slots(batch.chains[MODEL][1], K, W, MODEL in ran)
    stale_m = batch.stale_chains[MODEL]
    view = dataclasses.replace(batch, chains={**batch.chains, MODEL: (pub, sched)},
                               stale_chains={**batch.stale_chains, MODEL: (pub_stale.to(stale_m[0].dtype), stale_m[1])})
    chosen_len = select(lens, choice)
    if fill == "cut" and not tail:
        admitted = alloc_adaptive(view).admitted
        return dataclasses.replace(finish(chain_of(names, choice), torch.minimum(admitted, chosen_len)), own_chain=own)
    verified = vllm_top_b(rank_scores(survival(pub, sched), sched), stale_model_budget(view, sched), sched)
    out = finish(chain_of(names, choice), torch.minimum(verified, chosen_len))
    model_chain = choice == 0 if choice.dtype != torch.bool else ~choice
    past = torch.where(~model_chain & (MODEL in ran), CHAIN_MODEL, CHAIN_NONE)  # DSpark's past a model-free chain
    return dataclasses.replace(out, verified=verified, past_chain=past, own_chain=own)


def reset_rows(stale_model_conf: torch.Tensor) -> torch.Tensor:
    """The requests whose stale model row is vLLM's reset (bool [R]): the engine's host history writes exactly 1.0
    into every slot of a request's first decode step since admission (sim/engine/history.py), a row no drafter
    publishes; vLLM resets all W = num_speculative_tokens slots of it, which the K-wide model row cannot hold."""
    return (stale_model_conf == 1.0).all(1)


def take_recorded(names: tuple, choice: torch.Tensor, recorded: torch.Tensor, ran: list) -> torch.Tensor:
    """`choice` (per request, as `evaluate`'s: an index into `names`) with a real engine's recorded chain taken where
    one was recorded (recorded [R]: chain ids, base.FREE where none) and that chain is among the indices `ran` (a
    recorded chain whose drafter did not run here, a schedule that drifted from the recorded one, keeps the
    policy's own choice)."""
    ok = torch.zeros(len(names), dtype=torch.bool)
    ok[list(ran)] = True
    hit = (recorded.to(torch.int64)[:, None] == chain_ids(names)[None, :]) & ok[None, :]  # [R, N]
    has, at = hit.any(1), hit.to(torch.int64).argmax(1)
    return torch.where(has, at == 1, choice) if choice.dtype == torch.bool else torch.where(has, at, choice)


def _index(idx: list) -> torch.Tensor:
    key = ("index", tuple(idx))
    out = CONST.get(key)
    if out is None:
        out = torch.tensor(idx, dtype=torch.int64)
        if not torch.compiler.is_compiling():
            CONST[key] = out
    return out


def scheduled_slots(model_len: torch.Tensor, K: int, W: int, model_ran: bool) -> torch.Tensor:
    """The draft slots vLLM schedules per request (int64 [R]) under the plugin: the model chain's scheduled length
    (min(K, output left)), W where W > K and the block is whole. After a skipped pass a request whose model
    chain was not proposed (length 0 in the engine's StepBatch) is scheduled W: vLLM schedules its
    num_speculative_tokens whatever the plugin drafts (a one-view batch keeps the scheduled lengths; the
    simulator's native step gathers them, its numpy step proposes none, and both now schedule the same)."""
    sched = model_len if W == K else torch.where(model_len < K, model_len, W)
    return sched if model_ran else torch.where(model_len > 0, sched, W)


def plan_hybrid_vllm_skip(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                          names: tuple = TWO) -> Plan:
    """Host phase of `hybrid-vllm:...:skip`: which drafters run, by `plan_skip` (the default `hybrid`'s rule,
    forecast `avg`, no hysteresis) on the stale values, as the plugin decides (HybridDrafter.plan_skip calls the
    same function); the n-gram drafter always runs; no budget: vLLM's adaptive verification keeps its own (from the
    published confidences, charging DSpark's full profiled draft cost), which the allocate phase computes. With a
    real engine's recorded decisions (HostView.replay) the pass runs as recorded, Plan.own_drafters keeping this
    rule's."""
    p = plan_skip(view, method, margin, 0.0, FORECASTS[0], names)
    free = frozenset(n for n in names if n != MODEL)  # every model-free drafter runs (the plugin's: the n-gram one)
    own = free | (p.drafters & {MODEL})
    rp = view.replay
    recorded = None if rp is None else rp.chain != FREE
    if recorded is not None and bool(recorded.any()):  # a recorded step: its pass ran unless every recorded row skipped
        ran = not bool(rp.skipped[recorded].all())
        return Plan(free | ({MODEL} if ran else frozenset()), own_drafters=own)
    return Plan(own)


def alloc_hybrid_vllm_skip(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                           slots: int | None = None, names: tuple = TWO, fill: str = "cut",
                           tail: float = 0.0, budget: str = "stale") -> Allocation:
    """Device phase of `hybrid-vllm:...:skip`: `alloc_hybrid_vllm` over the chains that ran; ran[dspark] =
    plan.runs(dspark), so the engine charges the draft cost without the block pass when it was skipped."""
    out = alloc_hybrid_vllm(batch, method, margin, slots, names, tuple(n for n in names if n in plan.drafters),
                            fill, tail, budget)
    return dataclasses.replace(out, ran={MODEL: torch.tensor(plan.runs(MODEL))})


def split_recal(params: List[str], key: str = "recal") -> tuple[List[str], float | None]:
    """The `recal=k` option (or `runcal=k`: `key`; anywhere in the parameters; RecalOptions) and the other
    parameters; ValueError unless k > 0."""
    keys = {key}
    mine = [p for p in params if p.partition("=")[0] in keys and "=" in p]
    return [p for p in params if p not in mine], parse_spec("policy", RecalOptions, mine).get(key)


def split_options(params: List[str]):
    """The options `hybrid` and `hybrid-price` share (over two drafters or any), read by their declarations
    (RecalOptions, TableOption): recal=k (per-request online recalibration), runcal=k (one offset per drafter for
    the run; not with recal), table=T; returns the other parameters and the function that applies the options to
    the plain policy. ValueError if bad."""
    params, opts = split_option(RecalOptions, params)
    params, table = split_option(TableOption, params)
    k, k_run = opts.get("recal"), opts.get("runcal")
    step = table.get("table", TableOption.table) == "step"
    return params, lambda pol: with_table(with_recal(pol, k if k_run is None else k_run, shared=k_run is not None),
                                          step)


def with_recal(pol: Policy, k: float | None, shared: bool = False) -> Policy:
    """`pol` with online recalibration of prior precision k (sim/core/drafters/recalibration.py): both phases see the
    view's confidences recalibrated by its offsets (the HostView's one step older than the StepBatch's); named
    `NAME:recal=k`, or `NAME:runcal=k` with shared=True (one offset per drafter for the whole run,
    Policy.recal_shared). One code path: the same functions, on corrected confidences. `pol` itself when k is
    None."""
    if k is None:
        return pol
    name = f"{pol.name}:{'runcal' if shared else 'recal'}={k:g}"
    if pol.plan_fn is None:  # single-phase
        inner = pol.fn
        return dataclasses.replace(pol, name=name, fn=lambda b: inner(recalibrated(b)), recal=k,
                                   recal_shared=shared, sim_fn=None,
                                   sim_for=None)
    plan_fn, alloc_fn = pol.plan_fn, pol.alloc_fn
    plan = lambda v: plan_fn(recalibrated(v))  # noqa: E731
    alloc = lambda b, p: alloc_fn(recalibrated(b), p)  # noqa: E731

    def fn(batch: StepBatch) -> Allocation:
        p = plan(host_view(batch))
        out = alloc(batch, p)
        return Allocation(chain=out.chain, admitted=out.admitted, ran={MODEL: torch.tensor(p.runs(MODEL))})

    return dataclasses.replace(pol, name=name, fn=fn, plan_fn=plan, alloc_fn=alloc, phases_of=fn, recal=k,
                               recal_shared=shared, sim_fn=None, sim_for=None)


def parse_hybrid(params: List[str]) -> tuple[str, float, float, str, bool]:
    """`hybrid`'s parameters (HybridSettings; its options split off): (method, margin, hysteresis, forecast, method
    given); ValueError if bad."""
    given = parse_spec("hybrid", HybridSettings, params)
    v = HybridSettings(**given)
    return v.method, v.margin, v.hyst, v.forecast, "method" in given


@register("hybrid", spec_usage("hybrid", HybridSettings) + spec_usage("", RecalOptions) + spec_usage("", TableOption),
          "the default hybrid: hybrid-price that also prices the model drafter's pass and skips it for a step "
          "when host-known values say the step earns more without it; recal=k or runcal=k: online recalibration "
          "(per request or per run), table=step: price verify slots with the step's own verify table",
          adaptive_verification=True, settings=(HybridSettings, RecalOptions, TableOption))
def _hybrid(params: List[str]) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_plain(params))


def _hybrid_plain(params: List[str]) -> Policy:
    method, margin, hyst, forecast, _ = parse_hybrid(params)
    name = spec_name("hybrid", HybridSettings, parse_spec("hybrid", HybridSettings, params))
    return hybrid_policy(name, TWO, method, margin, hyst, forecast, uses_model=True, uses_ngram=True)


def parse_hybrid_price(params: List[str]) -> tuple[str, bool, float, bool]:
    """`hybrid-price`'s parameters (HybridPriceSettings; its options split off): (method, current, margin, method
    given); ValueError if bad."""
    given = parse_spec("hybrid-price", HybridPriceSettings, params)
    v = HybridPriceSettings(**given)
    return v.method, v.current, v.margin, "method" in given


@register("hybrid-price", spec_usage("hybrid-price", HybridPriceSettings) + spec_usage("", RecalOptions)
          + spec_usage("", TableOption),
          "the seed's price per verified slot over both chains; recal=k, runcal=k, table=T: as "
          "hybrid's", adaptive_verification=True, settings=(HybridPriceSettings, RecalOptions, TableOption))
def _hybrid_price(params: List[str]) -> Policy:
    params, wrap = split_options(params)
    return wrap(_hybrid_price_plain(params))


def _hybrid_price_plain(params: List[str]) -> Policy:
    method, current, margin, _ = parse_hybrid_price(params)
    name = spec_name("hybrid-price", HybridPriceSettings, parse_spec("hybrid-price", HybridPriceSettings, params))
    return hybrid_price_policy(name, TWO, method, current, margin, uses_model=True, uses_ngram=True)


@register("hybrid-vllm", spec_usage("hybrid-vllm", PluginSettings, PLUGIN_OPTIONS) + spec_usage("", FillOption),
          "the hybrid as the vLLM plugin runs it: per-request chain choice by price, the chosen chain's "
          "confidences published to vLLM's unchanged adaptive verification (stale budget, current top-B); "
          "slots=W > K: vLLM verifies W draft slots per request (the n-gram chain keeps up to W); skip: the "
          "plugin's skip of DSpark's pass (hybrid_spec.skip), vLLM keeping its own budget; runcal=k: the "
          "plugin's online recalibration (hybrid_spec.runcal): one offset per drafter learnt on the device from "
          "every graded slot of the run (both chains, verified or not), applied "
          "to the confidences it chooses with and publishes", adaptive_verification=True,
          settings=((PluginSettings, PLUGIN_OPTIONS), FillOption))
def _hybrid_vllm(params: List[str]) -> Policy:
    params, fill, budget = split_fill(params)
    v, name, run = parse_hybrid_vllm(params)
    method, margin, slots, skip, tail = v.method, v.margin, v.slots or None, v.skip, v.tail
    name, past = fill_name(name, fill, budget), fill == "vllm" or bool(tail)
    k_run = dict(run.plugin_config).get("runcal")
    if not skip:
        pol = Policy(name, lambda b: alloc_hybrid_vllm(b, method, margin, slots, fill=fill, tail=tail, budget=budget),
                     uses_model=True, uses_ngram=True, vllm=run, verifies_past=past)
    else:
        plan = lambda v: plan_hybrid_vllm_skip(v, method, margin)  # noqa: E731
        alloc = lambda b, p: alloc_hybrid_vllm_skip(b, p, method, margin, slots, fill=fill, tail=tail,  # noqa: E731
                                                    budget=budget)
        pol = Policy(name, lambda b: alloc(b, plan(host_view(b))), uses_model=True, uses_ngram=True, vllm=run,
                     plan_fn=plan, alloc_fn=alloc, verifies_past=past)
    # the plugin recalibrates what it chooses with and publishes: the same functions on corrected confidences,
    # so vLLM's adaptive verification (alloc_adaptive inside) budgets and admits on them too
    return dataclasses.replace(with_recal(pol, float(k_run), shared=True), name=name) if k_run is not None else pol


def split_fill(params: List[str]) -> tuple[List[str], str, str]:
    """The simulator-only `fill=F` and `budget=B` options (FillOption) split off `hybrid-vllm`'s parameters: (the
    other parameters, F, B); ValueError if bad."""
    rest, given = split_option(FillOption, params)
    return rest, given.get("fill", FILLS[0]), given.get("budget", BUDGETS[0])


def fill_name(name: str, fill: str, budget: str = BUDGETS[0]) -> str:
    """A hybrid-vllm name with its fill= and budget= options where not the defaults."""
    return name + (f":fill={fill}" if fill != FILLS[0] else "") + (f":budget={budget}" if budget != BUDGETS[0] else "")


def parse_hybrid_vllm(params: List[str], runcal: float | None = None) -> tuple:
    """`hybrid-vllm`'s parameters, the plugin's option settings (PluginSettings, PLUGIN_OPTIONS; `runcal`: a runcal=k
    already split off): (the settings, a PluginSettings; canonical name; VllmRun); ValueError if bad."""
    given = parse_spec("hybrid-vllm", PluginSettings, params, PLUGIN_OPTIONS)
    if runcal is not None:
        given["runcal"] = float(runcal)
    v = PluginSettings(**given)
    # vLLM runs it as DSpark with adaptive verification at num_speculative_tokens = W (the block when not given),
    # through the plugin; plugin_config: the plugin's field names (an integral k as an integer, as a user types it)
    written = tuple((k, int(x) if k == "runcal" and float(x).is_integer() else x)
                    for k, x in spec_written(PluginSettings, given))
    run = VllmRun("dspark", k=v.slots or None, adaptive=True, only_vllm=True, plugin=True, plugin_config=written)
    return v, spec_name("hybrid-vllm", PluginSettings, given), run
