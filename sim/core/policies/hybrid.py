"""The hybrids: the seed's `hybrid-price` (both drafters' chains on one scale via a price per verified
slot) and the project's default `hybrid`, which also prices the model drafter's pass (`price_skip`).

Math (docs/simulator.md, "Policies"). Survivals a^m = cumprod(model_conf), a^n = cumprod(ngram_conf), 0 past each
chain's length. Given a price lambda (a survival, i.e. expected accepted tokens per slot), request r
takes for each chain the prefix l = #{j : a_j > lambda} and its value V = sum_{j<=l} (a_j - lambda)
= sum_j relu(a_j - lambda), and keeps the n-gram chain only if V_n > V_m + NGRAM_MARGIN (else model).
The margin (expected tokens) corrects the winner's curse: picking the larger of two noisy estimates
selects the over-estimated one (on general text the n-gram slots chosen by max-V accept less than
estimated). NGRAM_MARGIN = 1 was chosen on general text only (`python -m sim.sweep --preset tune`, 400
sampled requests of traces/general.jsonl, batch 1/4/32/128), measured with `hybrid` while its forecast was
still `min`: geometric-mean throughput over adaptive 1.0039 (margin 0), 1.0034 (0.25), 1.0067 (0.5),
1.0085 (1), 1.0063 (1.5), 1.0061 (2). `hybrid`'s forecast `avg` was then chosen on 150 sampled general
requests at batch 1/4/32 (geometric means 1.0133 avg, 1.0099 min, 1.0085 mean); the preset reruns both
comparisons with the current code. The batch goodput
of the resultThe batch goodput
of the result is G = (N + sum admitted survivals) / (draft_ms + verify_ms[T + admitted slots]) [tokens/ms].
At the optimum lambda = G* x (marginal step cost of one slot): a slot pays only if its survival beats
what the slot would earn elsewhere in the batch.

How lambda is found (`hybrid-price:METHOD`); all batched torch, no host sync, a fixed op count:
  model-opt    lambda = the survival of the first slot *left out* by adaptive's model-only optimum
               B* (computed from current values): on a batch with no n-gram match this reproduces
               adaptive's top-B* exactly.
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

Budget consistency (what runs where in vLLM, `hybrid-price:METHOD`, the default):
  * CPU, stale values (one-step-old model and n-gram confidences and lengths, as adaptive's budget):
    run METHOD and take its total admitted slots as the step's draft budget B. Like adaptive's B*, this is what sizes
    the verify forward pass (the number of tokens must be known on the host before launch).
  * GPU, current values: run METHOD to get each request's chain choice (larger V; if both V are 0, the
    chain with the larger first survival, then model), then admit the global top-B slots of the chosen
    chains by current survival (the same stable-sort top-B kernel as adaptive). B is already paid for, so
    the GPU fills it even if the current lambda would take fewer slots.
  The CPU part is the policy's plan (`plan_price`, on the HostView), the GPU part its allocate
  (`allocate_price`, with the Plan's budget): the step contract of sim/core/policies/base.py, so nothing on the
  device waits for the host and the host never reads a device value. (The simulator's C form,
  sim/engine/policy_fast.py, runs both sides in one call with the same results.)
  `hybrid-price:METHOD:current` skips the stale budget and admits the current lambda-prefixes directly
  (the idealised allocation; its token count is data dependent, so in vLLM it would need a host sync or
  padding to the maximum). The optimality tests measure this core.

Online recalibration (`hybrid:...:recal=k`, `hybrid-price:...:recal=k`, and their forms over any drafters in
sim/core/policies/multi.py; off by default): the same two phases on the view's confidences corrected per request and
drafter by the offsets the engine keeps from each request's own outcomes (`with_recal`; the math, the prior
precision k and the invariants in sim/core/drafters/recalibration.py). No fast form transcribes it (get_policy attaches
none), so the simulator runs these definitions.
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

from sim.core.drafters.recalibration import recalibrated
from sim.core.policies.adaptive import alloc_adaptive
from sim.core.policies.base import Allocation, HostView, Plan, StepBatch, host_view
from sim.core.policies.common import (CONST, CHAIN_MODEL, CHAIN_NGRAM, best_budget, cap_budget, count_above, finish,
                                 goodput, prefix_sum, rank_scores, slot_valid, survival, top_b_counts, verify_ms)
from sim.core.drafters.calibration import DEFAULT_CALIBRATOR
from sim.core.drafters.ngram import NgramConfig
from sim.core.policies.registry import (Policy, TableOption, parse_spec, register, spec_name, spec_usage, spec_written,
                                        split_option, with_table)
from sim.core.settings import setting
from sim.core.vllm import VllmRun
from sim.infra.errors import ConfigError

METHODS = ("model-opt", "fixed-point", "sweep")
DEFAULT_METHOD = "sweep"
FP_ITERS = 4
FP_MIN_WINDOW = 4
SWEEP_EXACT_MAX = 256  # up to this many slots, the sweep tries every survival as the price (exact)
SWEEP_COARSE = 48
SWEEP_FINE = 32
NGRAM_MARGIN = 1.0  # expected tokens; see the module docstring
# Largest W (`hybrid-vllm:slots=W`, the plugin's hybrid_spec.slots). vLLM 0.32/0.33 has no cap of its own on
# num_speculative_tokens for DSpark (its start-up checks refuse a token budget that cannot hold a decode step's W + 1
# tokens per request); 64 is the plugin's bound and what its tests cover.
MAX_SLOTS = 64
# hybrid's host-side forecast of a request's n-gram chain from (previous proposal, mean proposal)
FORECAST_RULES = {"avg": lambda last, mean: 0.5 * (last + mean), "min": torch.minimum,
              "mean": lambda last, mean: mean, "stale": lambda last, mean: last}
FORECASTS = tuple(FORECAST_RULES)  # the first is the default
RUNCAL_RANGE = (1e-3, 1e6)  # the plugin's runcal=k, prior precision k [1 / logit^2], when on (0 = off)
_NG = NgramConfig()

# ---- The families' settings, declared once (sim/core/settings.py): the spec grammar, its usage, its errors and the
# canonical names are made from these (registry.parse_spec, spec_usage, spec_name).
_METHOD_HELP = "how the price lambda is found"
_MARGIN_HELP = "expected tokens the n-gram chain must win by (0 = the pure price rule)"


@dataclass(frozen=True)
class HybridSettings:
    """`hybrid`'s own settings (its options recal/runcal/table: RecalOptions, TableOption)."""

    method: str = setting(DEFAULT_METHOD, _METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD")
    margin: float = setting(NGRAM_MARGIN, _MARGIN_HELP, lo=0.0, metavar="M")
    hyst: float = setting(0.0, "expected tokens by which skipping the model drafter's pass must win (makes skipping "
                               "harder)", lo=0.0, metavar="H")
    forecast: str = setting(FORECASTS[0], "the host's forecast of a request's n-gram chain from its last and mean "
                                          "proposals", choices=FORECASTS, metavar="F")


@dataclass(frozen=True)
class HybridPriceSettings:
    """`hybrid-price`'s own settings (its options: RecalOptions, TableOption)."""

    method: str = setting(DEFAULT_METHOD, _METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD")
    current: bool = setting(False, "no stale budget: admit the current lambda-prefixes (idealised)")
    margin: float = setting(NGRAM_MARGIN, _MARGIN_HELP, lo=0.0, metavar="M")


@dataclass(frozen=True)
class RecalOptions:
    """The online recalibration options of `hybrid` and `hybrid-price` (with_recal): one or the other."""

    recal: float = setting(None, "online recalibration of the drafters' confidences from each request's outcomes, "
                                 "prior precision k", lo=0.0, strict=True, metavar="k")
    runcal: float = setting(None, "the same with one offset per drafter learnt from every request of the run",
                            lo=0.0, strict=True, metavar="k", alt="recal")


# What a plugin setting is in the simulator (PluginSettings' `sim`): every field has one, or the plugin refuses to
# load it (tests/test_plugin_settings.py).
SIM_COUNTERPARTS = {
    "option": "the hybrid-vllm spec option of the same name (--policy hybrid-vllm:NAME=V)",
    "ngram": "the n-gram drafter's setting: must be the run's n-gram calibrator's (--calibrator)",
    "switch": "turns the plugin on (false: vLLM runs plain DSpark with adaptive verification: policy adaptive)",
    "engine_only": "how the plugin runs its step, not what it chooses: no effect on what the simulator predicts",
}


@dataclass(frozen=True)
class PluginSettings:
    """The vLLM plugin's settings (vLLM's --additional-config '{"hybrid_spec": {...}}'; units: tokens unless stated),
    declared once: real/vllm_plugin/config.py's HybridSpecConfig is this class, sim.core.vllm.plugin_settings reads
    --additional-config by it, the `hybrid-vllm` spec's options are its `sim="option"` fields (plugin_spec), and
    real/validate.py's `hybrid:FIELD=V` parses it. `sim`: its counterpart in the simulator (SIM_COUNTERPARTS)."""

    enabled: bool = setting(True, "run the hybrid (false: plain DSpark)", sim="switch")
    method: str = setting(DEFAULT_METHOD, _METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD",
                          sim="option")
    margin: float = setting(NGRAM_MARGIN, _MARGIN_HELP, lo=0.0, metavar="M", sim="option")
    n_min: int = setting(_NG.n_min, "shortest suffix the n-gram drafter matches", lo=1, sim="ngram")
    n_max: int = setting(_NG.n_max, "longest suffix the n-gram drafter matches", lo=1, sim="ngram")
    ext_max: int = setting(_NG.ext_max, "cap on the extended match length (a calibrator feature)", lo=0, sim="ngram")
    calibrator: str = setting(DEFAULT_CALIBRATOR, "n-gram calibrator: a name under models/calibrators or a JSON path",
                              sim="ngram")
    online_window: int = setting(256, "steps between refreshes of the online n-gram acceptance statistics' host copy "
                                      "(0 = never)", lo=0, sim="engine_only")
    slots: int = setting(0, "W: draft slots per request vLLM verifies; must equal num_speculative_tokens, at least "
                            "DSpark's block", lo=1, hi=MAX_SLOTS, off=0, off_means="num_speculative_tokens",
                         metavar="W", sim="option")
    skip: bool = setting(False, "skip DSpark's block pass for a step when the n-gram chains alone pay more (the "
                                "simulator's `hybrid` rule, decided on the host from the last step's values); one rank "
                                "only (docs/real.md, 'The skip')", sim="option")
    runcal: float = setting(0.0, "online recalibration of both drafters' confidences: the prior precision k of one "
                                 "logit offset per drafter, learnt on the device from every graded slot of the run "
                                 "(sim/core/drafters/recalibration.py)", lo=RUNCAL_RANGE[0], hi=RUNCAL_RANGE[1],
                            off=0, what="a prior precision", metavar="k", sim="option")
    compile: bool = setting(False, "run the plugin's per-step work as compiled graphs (torch.compile at warm-up: "
                                   "observe and propose each one fused kernel on the CPU); CPU build only "
                                   "(docs/real.md, 'A cheap step')", sim="engine_only")


def check_counterparts(cls) -> None:
    """TypeError unless every field of the plugin's declaration `cls` names its counterpart in the simulator
    (`sim=`, a SIM_COUNTERPARTS key), an `option` one being a setting hybrid-vllm's spec can spell (not a str
    without choices): a plugin field the simulator would not know what to do with is refused where it is declared."""
    bad = [f.name for f in dataclasses.fields(cls) if f.metadata.get("sim") not in SIM_COUNTERPARTS]
    if bad:
        raise TypeError(f"plugin setting(s) {', '.join(bad)}: declare the simulator's counterpart, sim= one of "
                        f"{', '.join(SIM_COUNTERPARTS)} (sim/core/policies/hybrid.py)")


check_counterparts(PluginSettings)


def plugin_fields(sim: str) -> tuple:
    """The plugin settings whose counterpart is `sim` (a SIM_COUNTERPARTS key), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(PluginSettings) if f.metadata["sim"] == sim)


PLUGIN_OPTIONS = plugin_fields("option")  # the hybrid-vllm spec's options


def plugin_slots(slots: int, k: int | None, block: int) -> int:
    """W, the draft slots per request vLLM verifies with the plugin, from hybrid_spec.slots (0: num_speculative_tokens),
    vLLM's num_speculative_tokens `k` (None: not given, so vLLM sets it to DSpark's block) and DSpark's trained
    `block`: the one check of slots against a launch, for the plugin at start-up (HybridSpecConfig.resolve_slots) and
    for --additional-config beside --speculative-config (sim.core.vllm). ConfigError (one line naming the fix)."""
    if slots and k is not None and slots != k:
        raise ConfigError(f"hybrid_spec.slots = {slots} but --speculative-config has num_speculative_tokens = {k}: "
                          f"vLLM sizes its buffers from num_speculative_tokens, so set it to {slots}")
    if slots and k is None and slots != block:
        raise ConfigError(f"hybrid_spec.slots = {slots} needs --speculative-config's num_speculative_tokens = {slots} "
                          f"(vLLM otherwise sets it to DSpark's block, {block})")
    w = k if k is not None else slots or block
    if w < block:
        raise ConfigError(f"num_speculative_tokens = {w} is smaller than DSpark's trained block ({block}): the hybrid "
                          f"needs W >= {block} slots (DSpark drafts its whole block)")
    if w > MAX_SLOTS:
        raise ConfigError(f"num_speculative_tokens = {w}: the hybrid supports W <= {MAX_SLOTS} slots")
    return w


def plugin_spec(values) -> str:
    """The `hybrid-vllm` spec that predicts the plugin run with the settings `values` (a mapping of some
    PluginSettings fields): every option field not at its default (a default METHOD not written)."""
    given = {k: values[k] for k in PLUGIN_OPTIONS if k in values and values[k] != _default(k)}
    return spec_name("hybrid-vllm", PluginSettings, given)


def _default(name: str):
    return next(f.default for f in dataclasses.fields(PluginSettings) if f.name == name)


class Chains:
    """Both chains' survivals for S "sides" at once (S = 1: current values; S = 2: current and stale,
    evaluated by the same ops in one pass). surv_m [S, R, K_m] and surv_n [S, R, K_n] (0 on absent
    slots); neg_* = -survival (ascending along a row, for searchsorted); cs_* = prefix sums with a
    leading 0, so cs[..., l] = sum of the first l survivals. draft_ms: None (every side pays the batch's
    draft_cost_ms) or [S, 1], each side's drafter cost [ms] (sides that skip the model pass pay less)."""

    def __init__(self, batch: StepBatch, with_stale: bool):
        if with_stale:
            dt = batch.model_conf.dtype
            conf_m = torch.stack([batch.model_conf, batch.stale_model_conf.to(dt)])
            conf_n = torch.stack([batch.ngram_conf.to(dt), batch.stale_ngram_conf.to(dt)])
            len_m = torch.stack([batch.model_len, batch.stale_model_len])
            len_n = torch.stack([batch.ngram_len, batch.stale_ngram_len])
        else:
            conf_m, conf_n = batch.model_conf[None], batch.ngram_conf[None].to(batch.model_conf.dtype)
            len_m, len_n = batch.model_len[None], batch.ngram_len[None]
        self._set(conf_m, len_m, conf_n, len_n, None)

    @classmethod
    def of(cls, conf_m, len_m, conf_n, len_n, draft_ms=None) -> "Chains":
        """Chains of explicit [S, R, K] confidences and [S, R] lengths."""
        ch = cls.__new__(cls)
        ch._set(conf_m, len_m, conf_n.to(conf_m.dtype), len_n, draft_ms)
        return ch

    def _set(self, conf_m, len_m, conf_n, len_n, draft_ms) -> None:
        self.len_m, self.len_n, self.draft_ms = len_m, len_n, draft_ms
        self.surv_m = survival(conf_m, self.len_m)
        self.surv_n = survival(conf_n, self.len_n)
        self.neg_m, self.neg_n = -self.surv_m, -self.surv_n
        self.cs_m = torch.nn.functional.pad(prefix_sum(self.surv_m), (1, 0))
        self.cs_n = torch.nn.functional.pad(prefix_sum(self.surv_n), (1, 0))

    def num_slots(self) -> int:
        """R * (K_m + K_n): the slots of one side."""
        return self.surv_m[0].numel() + self.surv_n[0].numel()

    def all_survivals(self) -> torch.Tensor:
        """[S, R * (K_m + K_n)]: every slot's survival (0 for absent slots)."""
        return torch.cat([self.surv_m, self.surv_n], -1).flatten(1)


def evaluate(batch: StepBatch, ch: Chains, lam: torch.Tensor, margin: float = 0.0):
    """Allocation at candidate prices lam [S, C]: returns (use_ngram [S, R, C] bool, admitted
    [S, R, C] int64, goodput [S, C]). Per chain l = #{j : a_j > lam} (a binary search, since a is
    non-increasing), gain = a_1 + ... + a_l and V = gain - l * lam; the chain with the larger V wins
    (ties -> model). Cost O(S R C log K), so large candidate sets stay cheap. Chains of any number of drafters
    (sim.core.policies.multi.ChainsN) evaluate by their own rule; their choice is an index, not a bool."""
    if type(ch) is not Chains:
        return ch.evaluate(batch, lam, margin)
    lam_r = lam[:, None, :].expand(-1, ch.surv_m.shape[1], -1)  # [S, R, C]
    neg = (-lam_r).contiguous()  # searchsorted on an expanded view takes a slow path (~20x)
    l_m = count_above(ch.neg_m, neg)  # #{-a < -lam} = #{a > lam}
    l_n = count_above(ch.neg_n, neg)
    g_m = ch.cs_m.gather(-1, l_m)
    g_n = ch.cs_n.gather(-1, l_n)
    use_ngram = (g_n - l_n * lam_r) > (g_m - l_m * lam_r) + margin
    admitted = torch.where(use_ngram, l_n, l_m)
    g = goodput(batch, torch.where(use_ngram, g_n, g_m).sum(1), admitted.sum(1), ch.draft_ms)
    return use_ngram, admitted, g


def _pick(use_ngram, admitted, g):
    """The candidate with the best goodput on each side: ([S, R] bool, [S, R] int64, best G [S])."""
    best = torch.argmax(g, dim=-1)
    idx = best[:, None, None].expand(-1, use_ngram.shape[1], 1)
    return use_ngram.gather(2, idx)[..., 0], admitted.gather(2, idx)[..., 0], g.gather(1, best[:, None])[:, 0]


def model_opt_lambda(batch: StepBatch, ch: Chains) -> torch.Tensor:
    """lambda = survival of the first slot left out by the model-only optimum B* (0 if all are in): [S, 1]."""
    budget, sorted_scores = best_budget(batch, rank_scores(ch.surv_m, ch.len_m), ch.draft_ms)
    padded = torch.nn.functional.pad(sorted_scores.clamp(min=0.0), (0, 1))
    return padded.gather(-1, budget[:, None])


def lambda_model_opt(batch: StepBatch, ch: Chains, margin: float = 0.0):
    return _pick(*evaluate(batch, ch, model_opt_lambda(batch, ch), margin))


def lambda_fixed_point(batch: StepBatch, ch: Chains, margin: float = 0.0, iters: int = FP_ITERS):
    lam = model_opt_lambda(batch, ch)
    uses, adms, gs = [], [], []
    for _ in range(iters + 1):  # fixed trip count: unrolled under compile, no data-dependent control
        use_ngram, admitted, g = evaluate(batch, ch, lam, margin)
        uses.append(use_ngram)
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


def _chain_ids(use_ngram: torch.Tensor) -> torch.Tensor:
    return use_ngram.to(torch.int64) * (CHAIN_NGRAM - CHAIN_MODEL) + CHAIN_MODEL


def price_core(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> Allocation:
    """The idealised allocation: each request's lambda-prefix of its better chain, current values only."""
    use_ngram, admitted, _ = LAMBDA_METHODS[method](batch, Chains(batch, with_stale=False), margin)
    return finish(_chain_ids(use_ngram[0]), admitted[0])


def plan_price(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> Plan:
    """Host phase of `hybrid-price`: METHOD on the stale chains; their total admitted slots are the step's
    budget B (capped by vLLM's logits buffer). Both drafters run. Computed in the stale confidences' dtype."""
    dt = view.stale_model_conf.dtype
    ch = Chains.of(view.stale_model_conf[None], view.stale_model_len[None], view.stale_ngram_conf[None].to(dt),
                   view.stale_ngram_len[None])
    _, admitted, _ = LAMBDA_METHODS[method](view, ch, margin)
    return Plan(model=True, ngram=True, budget=cap_budget(view, admitted[0].sum()))


def allocate_price(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD,
                   margin: float = NGRAM_MARGIN) -> Allocation:
    """Device phase of `hybrid-price`: METHOD on the current chains chooses each request's chain (if both
    lambda-prefixes are empty, the chain with the better first slot, then model), then the global top-B
    (B = plan.budget) of the chosen chains' current survivals."""
    ch = Chains(batch, with_stale=False)
    use_ngram, admitted, _ = LAMBDA_METHODS[method](batch, ch, margin)
    use_ngram = torch.where(admitted[0] == 0, ch.surv_n[0, :, 0] > ch.surv_m[0, :, 0], use_ngram[0])
    scores_m = rank_scores(ch.surv_m[0], ch.len_m[0]).masked_fill(use_ngram[:, None], float("-inf"))
    scores_n = rank_scores(ch.surv_n[0], ch.len_n[0]).masked_fill(~use_ngram[:, None], float("-inf"))
    scores = torch.cat([scores_m, scores_n], 1)
    return finish(_chain_ids(use_ngram), top_b_counts(scores, plan.budget))


def price_with_budget(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> Allocation:
    """vLLM-consistent hybrid on one view: the stale budget B (plan_price, CPU part), then the current chain
    choice by price and the global top-B of the chosen chains (allocate_price, GPU part)."""
    return allocate_price(batch, plan_price(host_view(batch), method, margin), method, margin)


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
               hysteresis: float = 0.0, forecast: str = FORECASTS[0]) -> Allocation:
    """`hybrid`: hybrid-price that also prices the model drafter's pass, and skips it for the whole step
    when the step is worth more without it.

    Host side (stale values only, known before the step is launched): price the batch twice,
      G_both = best goodput over both chains, paying draft_cost_ms,
      G_ngram = best goodput over the n-gram chains alone, paying draft_cost_ms - model_draft_ms,
    and skip the model pass iff G_ngram > G_both * (1 + hysteresis). The chosen scenario's total admitted
    slots are the step's budget B, as in `price_with_budget`. Device side (current values): the chain
    choice by price and the global top-B of the chosen chains, over the n-gram chains alone when the pass
    was skipped (the current model chains are then never read: they were not drafted). A request whose
    model chain is empty takes its n-gram chain.
    Host-side forecasts (all known before the step): a request's model chain is the previous step's when
    the pass ran then, else the mean of the chains drafted for it so far (the engine keeps it), so the
    decision never uses a chain that was not drafted; its n-gram chain is, slot by slot, the average
    (`forecast="avg"`, the default; or min / mean / stale) of the previous proposal and the request's mean
    proposal (`mean_ngram_conf`), because a copy that held at the last step predicts the next step well
    only in a request that keeps copying (an edit), not in one whose matches are short-lived (chat).
    The budget is capped like adaptive's by vLLM's logits buffer (`cap_budget`).
    """
    plan = plan_skip(host_view(batch), method, margin, hysteresis, forecast)
    out = allocate_skip(batch, plan, method, margin)
    return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(plan.model))


def plan_skip(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
              hysteresis: float = 0.0, forecast: str = FORECASTS[0]) -> Plan:
    """Host phase of `hybrid` (price_skip's docstring): METHOD on two stale scenarios in one pass, with the
    model pass (paying draft_cost_ms) and without it (draft_cost_ms - model_draft_ms, no model chain); the
    model drafter runs iff G_ngram <= G_both (1 + hysteresis); the chosen scenario's admitted slots, widened
    to the free ones and capped, are the budget B. Plan.model is read on the host: the view is host data."""
    dt = view.stale_model_conf.dtype
    zeros_m = torch.zeros_like(view.stale_model_len)
    conf_m = view.stale_model_conf[None].repeat(2, 1, 1)
    len_m = torch.stack([view.stale_model_len, zeros_m])
    stale_n = view.stale_ngram_conf.to(dt)
    if view.mean_ngram_conf is not None:  # forecast the n-gram chain from its last proposal and its history
        stale_n = FORECAST_RULES[forecast](stale_n, view.mean_ngram_conf.to(dt))
    conf_n = stale_n[None].repeat(2, 1, 1)
    len_n = view.stale_ngram_len[None].repeat(2, 1)
    full = torch.as_tensor(view.draft_cost_ms, dtype=torch.float64)
    skip = full - torch.as_tensor(view.model_draft_ms, dtype=torch.float64)
    ch = Chains.of(conf_m, len_m, conf_n, len_n, torch.stack([full, skip])[:, None])
    _, admitted, g = LAMBDA_METHODS[method](view, ch, margin)  # sides: with the model pass, without it
    run_model = g[1] <= g[0] * (1.0 + hysteresis)
    budget = cap_budget(view, free_budget(view, torch.where(run_model, admitted[0].sum(), admitted[1].sum())))
    return Plan(model=bool(run_model), ngram=True, budget=budget)


def allocate_skip(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD,
                  margin: float = NGRAM_MARGIN) -> Allocation:
    """Device phase of `hybrid`: the chain choice by price on the current chains -- the n-gram chains alone
    when the plan skipped the model pass (the model chains were not drafted and are not read) -- then the
    global top-B (B = plan.budget) of the chosen chains. A request whose model chain is empty takes its
    n-gram chain."""
    full = torch.as_tensor(batch.draft_cost_ms, dtype=torch.float64)
    if plan.model:
        conf_m, len_m, draft = batch.model_conf, batch.model_len, full
    else:
        len_m = torch.zeros_like(batch.ngram_len)
        conf_m = torch.zeros((len_m.shape[0], batch.model_conf.shape[-1]), dtype=batch.model_conf.dtype)
        draft = full - torch.as_tensor(batch.model_draft_ms, dtype=torch.float64)
    ch = Chains.of(conf_m[None], len_m[None], batch.ngram_conf[None], batch.ngram_len[None], draft.reshape(1, 1))
    use_ngram, admitted, _ = LAMBDA_METHODS[method](batch, ch, margin)
    surv_m, surv_n = ch.surv_m[0], ch.surv_n[0]
    # both prefixes empty at the current price: the chain with the better first slot, then model
    use_ngram = torch.where(admitted[0] == 0, surv_n[:, 0] > surv_m[:, 0], use_ngram[0]) | (len_m == 0)
    scores_m = rank_scores(surv_m, len_m).masked_fill(use_ngram[:, None], float("-inf"))
    scores_n = rank_scores(surv_n, batch.ngram_len).masked_fill(~use_ngram[:, None], float("-inf"))
    return finish(_chain_ids(use_ngram), top_b_counts(torch.cat([scores_m, scores_n], 1), plan.budget))


def choose_chain(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> torch.Tensor:
    """Per request, whether its n-gram chain is the one to verify (bool [R]), from the batch's current values:
    the chain with the larger value V at the best price lambda (METHOD), the n-gram chain only if it wins by
    `margin`; where both lambda-prefixes are empty, the chain with the larger first survival (then model).
    The chain-choice half of `price_with_budget`, without a budget: what the vLLM plugin runs per step."""
    ch = Chains(batch, with_stale=False)
    use_ngram, admitted, _ = LAMBDA_METHODS[method](batch, ch, margin)
    return torch.where(admitted[0] == 0, ch.surv_n[0, :, 0] > ch.surv_m[0, :, 0], use_ngram[0])


def published_view(batch: StepBatch, k: int, stale: bool = False) -> StepBatch:
    """The batch as the vLLM plugin sees it when it chooses (current or, with stale=True, last step's values):
    n-gram chains cut to the k slots vLLM drafts (num_speculative_tokens), and a decode-only step shape
    (T = N = R) because the plugin chooses right after a verify pass, before the next step is scheduled."""
    R = batch.num_reqs
    if stale:
        conf_m, len_m = batch.stale_model_conf, batch.stale_model_len
        conf_n, len_n = batch.stale_ngram_conf, batch.stale_ngram_len
    else:
        conf_m, len_m, conf_n, len_n = batch.model_conf, batch.model_len, batch.ngram_conf, batch.ngram_len
    conf_n, len_n = conf_n[:, :k], len_n.clamp(max=k)
    return dataclasses.replace(
        batch, model_conf=conf_m, model_len=len_m, ngram_conf=conf_n, ngram_len=len_n, stale_model_conf=conf_m,
        stale_model_len=len_m, stale_ngram_conf=conf_n, stale_ngram_len=len_n, num_nondraft_tokens=R,
        num_sampling_reqs=R, true_model_acc=None, true_ngram_acc=None, true_verify_cost_ms=None)


def publish(model_conf: torch.Tensor, model_len: torch.Tensor, ngram_conf: torch.Tensor, ngram_len: torch.Tensor,
            use_ngram: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """The confidences the plugin writes for vLLM's adaptive verification ([R, W], W = width or model_conf's
    width K): the chosen chain's per-slot conditional acceptance, 0 past that chain's length (survival 0:
    such a slot only fills a budget that has no better slot left)."""
    K = model_conf.shape[1]
    W = K if width is None else width
    pad = lambda x: torch.nn.functional.pad(x, (0, W - x.shape[1])) if x.shape[1] < W else x  # noqa: E731
    conf_n = ngram_conf[:, :W].to(model_conf.dtype) * slot_valid(ngram_len.clamp(max=W), ngram_conf[:, :W].shape[1])
    conf_m = (model_conf * slot_valid(model_len, K))[:, :W]
    return torch.where(use_ngram[:, None], pad(conf_n), pad(conf_m))


def alloc_hybrid_vllm(batch: StepBatch, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                      slots: int | None = None) -> Allocation:
    """`hybrid-vllm`: the hybrid as the vLLM plugin (real/vllm_plugin) runs it inside vLLM 0.33.

    The plugin chooses each request's chain (`choose_chain` on `published_view`: K-slot chains, T = N = R)
    and publishes that chain's confidences (`publish`); vLLM's adaptive verification then runs unchanged on
    them: the budget B* from the confidences published at the previous step (stale, on the CPU), the
    global top-B* of the current published survivals (on the GPU), i.e. `alloc_adaptive` on the published
    chains. The previous step's publication is re-derived here from the stale values with this step's
    shape (exact in steady decoding; when requests join or leave, the plugin chose with the old R).
    A slot past the chosen chain's length has survival 0 and is admitted only when B* exceeds the slots
    with positive survival; vLLM then verifies a filler token there, which the simulator does not charge
    (the admitted count is cut to the chain's length).

    slots = W > K (`hybrid-vllm:slots=W`, a what-if the plugin cannot run today: DSpark's speculator drafts
    exactly its block of K): vLLM schedules W draft slots per request, the model chain is padded with
    survival 0 and the n-gram chain keeps up to W tokens. Requests whose model chain is cut by the end of
    their output (model_len < K) are scheduled model_len slots, the others W."""
    return _alloc_published(batch, method, margin, slots, model_ran=True)


def _alloc_published(batch: StepBatch, method: str, margin: float, slots: int | None, model_ran: bool) -> Allocation:
    """`alloc_hybrid_vllm`'s body; model_ran=False: the plugin skipped DSpark's pass this step, so every request
    publishes its n-gram chain (the current model chains were not drafted and are not read)."""
    K = batch.model_conf.shape[1]
    W = K if slots is None else max(int(slots), K)
    cur, old = published_view(batch, W), published_view(batch, W, stale=True)
    use_ngram = choose_chain(cur, method, margin) if model_ran else torch.ones_like(batch.ngram_len, dtype=torch.bool)
    use_stale = choose_chain(old, method, margin)
    pub = publish(cur.model_conf, cur.model_len, cur.ngram_conf, cur.ngram_len, use_ngram, W)
    pub_stale = publish(old.model_conf, old.model_len, old.ngram_conf, old.ngram_len, use_stale, W)
    sched = scheduled_slots(batch.model_len, K, W, model_ran)
    view = dataclasses.replace(batch, model_conf=pub, model_len=sched,
                               stale_model_conf=pub_stale.to(batch.stale_model_conf.dtype))
    admitted = alloc_adaptive(view).admitted
    chain_len = torch.where(use_ngram, cur.ngram_len, batch.model_len)
    return finish(_chain_ids(use_ngram), torch.minimum(admitted, chain_len))


def scheduled_slots(model_len: torch.Tensor, K: int, W: int, model_ran: bool) -> torch.Tensor:
    """The draft slots vLLM schedules per request (int64 [R]) under the plugin: the model chain's scheduled length
    (min(K, output left)), W where W > K and the block is whole. After a skipped pass a request whose model
    chain was not proposed (length 0 in the engine's StepBatch) is scheduled W: vLLM schedules its
    num_speculative_tokens whatever the plugin drafts (a one-view batch keeps the scheduled lengths; the
    simulator's native step gathers them, its numpy step proposes none, and both now schedule the same)."""
    sched = model_len if W == K else torch.where(model_len < K, model_len, W)
    return sched if model_ran else torch.where(model_len > 0, sched, W)


def plan_hybrid_vllm_skip(view: HostView, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN) -> Plan:
    """Host phase of `hybrid-vllm:...:skip`: whether DSpark's pass runs, by `plan_skip` (the default `hybrid`'s
    rule, forecast `avg`, no hysteresis) on the stale values, as the plugin decides (HybridDrafter.plan_skip calls
    the same function); no budget: vLLM's adaptive verification keeps its own (from the published confidences,
    charging DSpark's full profiled draft cost), which the allocate phase computes."""
    return Plan(model=plan_skip(view, method, margin).model, ngram=True)


def alloc_hybrid_vllm_skip(batch: StepBatch, plan: Plan, method: str = DEFAULT_METHOD, margin: float = NGRAM_MARGIN,
                           slots: int | None = None) -> Allocation:
    """Device phase of `hybrid-vllm:...:skip`: `alloc_hybrid_vllm` when the pass ran; after a skipped pass every
    request publishes its n-gram chain (HybridDrafter.propose with ran_model=False) and vLLM's adaptive
    verification admits from those. model_ran = plan.model, so the engine charges the draft cost without the
    block pass when it was skipped."""
    out = _alloc_published(batch, method, margin, slots, model_ran=plan.model)
    return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(plan.model))


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
        return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(p.model))

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
    return Policy(name, lambda b: price_skip(b, method, margin, hyst, forecast), uses_model=True, uses_ngram=True,
                  plan_fn=lambda v: plan_skip(v, method, margin, hyst, forecast),
                  alloc_fn=lambda b, p: allocate_skip(b, p, method, margin))


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
    if current:  # no host budget: single-phase
        return Policy(name, lambda b: price_core(b, method, margin), uses_model=True, uses_ngram=True)
    return Policy(name, lambda b: price_with_budget(b, method, margin), uses_model=True, uses_ngram=True,
                  plan_fn=lambda v: plan_price(v, method, margin),
                  alloc_fn=lambda b, p: allocate_price(b, p, method, margin))


@register("hybrid-vllm", spec_usage("hybrid-vllm", PluginSettings, PLUGIN_OPTIONS),
          "the hybrid as the vLLM plugin runs it: per-request chain choice by price, the chosen chain's "
          "confidences published to vLLM's unchanged adaptive verification (stale budget, current top-B); "
          "slots=W > K: vLLM verifies W draft slots per request (the n-gram chain keeps up to W); skip: the "
          "plugin's skip of DSpark's pass (hybrid_spec.skip), vLLM keeping its own budget; runcal=k: the "
          "plugin's online recalibration (hybrid_spec.runcal): one offset per drafter learnt on the device from "
          "every graded slot of the run (both chains, verified or not), applied "
          "to the confidences it chooses with and publishes", adaptive_verification=True,
          settings=((PluginSettings, PLUGIN_OPTIONS),))
def _hybrid_vllm(params: List[str]) -> Policy:
    method, margin, slots, skip, name, run = parse_hybrid_vllm(params)
    k_run = dict(run.plugin_config).get("runcal")
    if not skip:
        pol = Policy(name, lambda b: alloc_hybrid_vllm(b, method, margin, slots), uses_model=True, uses_ngram=True,
                     vllm=run)
    else:
        plan = lambda v: plan_hybrid_vllm_skip(v, method, margin)  # noqa: E731
        alloc = lambda b, p: alloc_hybrid_vllm_skip(b, p, method, margin, slots)  # noqa: E731
        pol = Policy(name, lambda b: alloc(b, plan(host_view(b))), uses_model=True, uses_ngram=True, vllm=run,
                     plan_fn=plan, alloc_fn=alloc)
    # the plugin recalibrates what it chooses with and publishes: the same functions on corrected confidences,
    # so vLLM's adaptive verification (alloc_adaptive inside) budgets and admits on them too
    return dataclasses.replace(with_recal(pol, float(k_run), shared=True), name=name) if k_run is not None else pol


def parse_hybrid_vllm(params: List[str], runcal: float | None = None) -> tuple:
    """`hybrid-vllm`'s parameters, the plugin's option settings (PluginSettings, PLUGIN_OPTIONS; `runcal`: a runcal=k
    already split off): (method, margin, slots W or None, skip, canonical name, VllmRun); ValueError if bad."""
    given = parse_spec("hybrid-vllm", PluginSettings, params, PLUGIN_OPTIONS)
    if runcal is not None:
        given["runcal"] = float(runcal)
    v = PluginSettings(**given)
    # vLLM runs it as DSpark with adaptive verification at num_speculative_tokens = W (the block when not given),
    # through the plugin; plugin_config: the plugin's field names (an integral k as an integer, as a user types it)
    written = tuple((k, int(x) if k == "runcal" and float(x).is_integer() else x)
                    for k, x in spec_written(PluginSettings, given))
    run = VllmRun("dspark", k=v.slots or None, adaptive=True, only_vllm=True, plugin=True, plugin_config=written)
    return v.method, v.margin, v.slots or None, v.skip, spec_name("hybrid-vllm", PluginSettings, given), run
