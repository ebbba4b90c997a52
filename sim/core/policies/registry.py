"""The policy registry: the Policy type and `register`, which the policy families call on import.

A family registers itself with `@register(name, usage, summary)` on a factory that takes the spec's
parameters (the strings after the first ':') and returns a `Policy`. Factories raise ValueError on a bad
parameter; `get_policy` (sim/core/policies/catalog.py, which imports the families: this module imports none of
them) turns that into a one-line ConfigError naming the valid choices.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from sim.core import settings
from sim.core.settings import setting, spec_name, spec_written  # noqa: F401 (the families read them here)
from sim.infra.errors import ConfigError
from sim.infra.registry import Registry
from sim.core.drafters.recalibration import RecalState
from sim.core.policies.base import MODEL, NGRAM, Allocation, HostView, Plan, StepBatch
from sim.core.vllm import DYN_OPTION, VllmRun, parse_per_batch_option, per_batch_option


@dataclass(frozen=True)
class Policy:
    """An allocation policy: a pure batched-tensor function StepBatch -> Allocation, plus what it needs.

    uses_model / uses_ngram: which drafters must run this step (the engine charges their cost).
    uses_extra: the other registered drafters it uses (names, sim/core/drafters/registry.py); `drafters` is all of them.
    needs_truth: reads the true accepted lengths, StepBatch.true_acc (only the oracle).
    host_sync: needs a device-to-host copy of current-step values (False for every policy here).
    tree: may verify both chains as two branches (Allocation.second); engines that verify chains only
        (the real torch engine) refuse it.
    sim_fn: a faster form of `fn` that the simulator runs instead (sim.engine.policy_fast, fast_multi, checked
        against `fn` by tests/test_fast_forms.py); where it has `plan` and `allocate` (a form over any drafters)
        the simulator's engine runs those as the two phases. None = the simulator runs `fn`. Real engines
        always run `fn`.
    sim_for: the `fn` that sim_fn is a form of; a copy whose fn was replaced (dataclasses.replace(pol,
        fn=...), as tests do to inject a bug) no longer matches it, and the simulator then runs that fn.
    vllm: how vLLM runs the policy (sim.core.vllm.VllmRun: its method, num_speculative_tokens, adaptive
        verification, and whether the policy exists only as vLLM runs it); None: vLLM has no counterpart.
        The engine charges the token budget as vLLM's scheduler does from it (sim.core.vllm.slot_charge).
    recal: the prior precision k of the online recalibration of the drafters' confidences (the `recal=k` option,
        sim/core/drafters/recalibration.py): the engine then keeps each request's offsets and hands them to the policy
        (StepBatch.recal / stale_recal), and runs the definitions (no fast form transcribes it); None: off.
    recal_shared: the offsets are one per drafter for the whole run, not per request (the `runcal=k` option).
    online: a factory of another online state the engine keeps in recalibration's place, (K_m) -> state with
        RecalState's `offsets` and `observe` (`adaptive:online`: vLLM's acceptance estimator,
        sim/core/drafters/acceptance_estimator.py); None: recalibration's, if `recal` is set (`online_state`).
    adaptive_verification: the policy runs inside vLLM's adaptive verification (variable per-request verify
        lengths, the confidence-ranking kernel, varlen graphs), so the cost model charges that machinery's own
        per-step work (sim/core/cost: alloc_ms); the fixed-K policies and `none` run vLLM's uniform decode path.
        Declared by the family (register(..., adaptive_verification=True)); get_policy sets it.
    step_table: the policy prices verify slots with the step's own table (the `table=step` option): the engine
        hands it verify_cost_ms = CostModel.charged_verify_table at the step's token count, KV context and
        sequences (host-known before launch) instead of vLLM's start-up profile, and runs the definitions.
    verifies_past: its Allocations may carry `verified` / `past_chain` (slots vLLM verifies past the chosen chain,
        hybrid-vllm's fill=vllm): the simulator then runs the numpy step, the one that charges and accepts them.
    plan_fn / alloc_fn: the policy's two phases (sim.core.policies.base: plan on the host from a HostView,
        allocate on the device from the StepBatch and the Plan); fn must then be alloc_fn(batch,
        plan_fn(host_view(batch))). None: a single-phase policy, whose plan is every drafter it uses and no
        budget and whose allocate is fn.
    """

    name: str
    fn: Callable[[StepBatch], Allocation] = field(repr=False, compare=False)
    uses_model: bool
    uses_ngram: bool
    needs_truth: bool = False
    host_sync: bool = False
    tree: bool = False
    sim_fn: Optional[Callable[[StepBatch], Allocation]] = field(default=None, repr=False, compare=False)
    sim_for: Optional[Callable[[StepBatch], Allocation]] = field(default=None, repr=False, compare=False)
    plan_fn: Optional[Callable[[HostView], Plan]] = field(default=None, repr=False, compare=False)
    alloc_fn: Optional[Callable[[StepBatch, Plan], Allocation]] = field(default=None, repr=False, compare=False)
    phases_of: Optional[Callable[[StepBatch], Allocation]] = field(default=None, repr=False, compare=False)
    vllm: Optional[VllmRun] = field(default=None, compare=False)
    uses_extra: tuple = ()
    recal: Optional[float] = None
    recal_shared: bool = False
    online: Optional[Callable[[int], Any]] = field(default=None, repr=False, compare=False)
    step_table: bool = False
    adaptive_verification: bool = False
    verifies_past: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_default_plan", Plan(frozenset(self.drafters)))  # made once: per-step use
        if (self.plan_fn is None) != (self.alloc_fn is None):
            raise TypeError(f"policy '{self.name}': plan_fn and alloc_fn go together")
        if self.plan_fn is not None and self.phases_of is None:
            object.__setattr__(self, "phases_of", self.fn)  # the fn the two phases are (sim_for's rule)

    @property
    def drafters(self) -> tuple:
        """Every drafter the policy uses, by registered name (dspark, ngram, then the others)."""
        return ("dspark",) * self.uses_model + ("ngram",) * self.uses_ngram + tuple(self.uses_extra)

    def online_state(self, n: int, k_model: int):
        """The online state the engine keeps for a run of n requests whose model chains hold k_model slots and hands
        the policy each step (StepBatch.recal): the `online` factory's, recalibration's (RecalState) where `recal`
        is set, else None."""
        if self.online is not None:
            return self.online(k_model)
        return None if self.recal is None else RecalState(self.drafters, n, self.recal, self.recal_shared)

    @property
    def runs_plugin(self) -> bool:
        """Whether vLLM runs the policy through this project's plugin (VllmRun.plugin): the engine then charges the
        plugin's own per-step work (CostModel.plugin_ms) with the allocation."""
        return self.vllm is not None and self.vllm.plugin

    @property
    def phased(self) -> bool:
        """Whether the engine runs the policy's two phases: it has them and fn is still the one they make (a
        copy whose fn was replaced, as tests do to inject a bug, is single-phase: fn decides alone)."""
        return self.plan_fn is not None and self.phases_of is self.fn

    @property
    def default_plan(self) -> Plan:
        """The plan of a single-phase policy: every drafter it uses runs, no budget."""
        return self._default_plan

    def plan(self, view: HostView) -> Plan:
        """Phase 1 (host): which drafters run this step and its budget, from what the host knows."""
        return self.plan_fn(view) if self.phased else self.default_plan

    def allocate(self, batch: StepBatch, plan: Plan) -> Allocation:
        """Phase 3 (device): the allocation of this step's chains under `plan` (Policy.plan of its HostView)."""
        if not self.phased:
            return self(batch)
        self._check_truth(batch)
        return self.alloc_fn(batch, plan)

    def _check_truth(self, batch: StepBatch) -> None:
        if self.needs_truth and (batch.true_acc.get(MODEL) is None or batch.true_acc.get(NGRAM) is None):
            raise ConfigError(f"policy '{self.name}' needs the true accepted lengths, which this engine "
                              "does not provide")

    @property
    def sim_callable(self) -> Callable[[StepBatch], Allocation]:
        """What the simulator runs: sim_fn while it is the form of this policy's fn, else the policy itself."""
        return self.sim_fn if self.sim_fn is not None and self.sim_for is self.fn else self

    def __call__(self, batch: StepBatch) -> Allocation:
        self._check_truth(batch)
        return self.fn(batch)


@dataclass(frozen=True)
class _Family:
    usage: str
    summary: str
    factory: Callable[[List[str]], Policy]
    over: Optional[Callable[[List[str], tuple], Policy]] = None  # (params, the run's drafters) -> Policy
    adaptive_verification: bool = False  # Policy.adaptive_verification of every policy of the family
    settings: tuple = ()  # ((settings class, the names its spec spells or None), ...): its declared settings


def over_drafters(name: str):
    """Decorator: register the form of family `name` over any set of drafters, `factory(params, drafters)`
    (drafters: the run's, registered names in registry order). get_policy builds it for every set but the
    default two (sim/core/drafters/registry.py: DEFAULT_DRAFTERS), which keep the family's own definition."""

    def deco(factory: Callable[[List[str], tuple], Policy]):
        _REGISTRY.replace(name, dataclasses.replace(_REGISTRY[name], over=factory))
        return factory

    return deco


_REGISTRY: Registry[_Family] = Registry("policy family")


def families() -> Dict[str, _Family]:
    """The registered families, name -> (usage, summary, factory), in registration order."""
    return _REGISTRY


def register(name: str, usage: str, summary: str, *, adaptive_verification: bool = False, settings: tuple = ()):
    """Decorator: register `factory(params: list[str]) -> Policy` under the family `name`; adaptive_verification:
    the family's policies run inside vLLM's adaptive verification (Policy.adaptive_verification); settings: the
    classes that declare its spec's settings (sim/core/settings.py; a class or (class, names)), listed by --help."""
    settings = tuple(c if isinstance(c, tuple) else (c, None) for c in settings)

    if name in _ALIASES:
        raise RuntimeError(f"policy family '{name}' registered twice")
    return _REGISTRY.register(name, lambda factory: _Family(usage, summary, factory,
                                                            adaptive_verification=adaptive_verification,
                                                            settings=settings))


_ALIASES: Dict[str, str] = {}


def deprecated_alias(old: str, new: str) -> None:
    """Accept the family name `old` as a deprecated spelling of the registered family `new` (get_policy warns once
    per process and builds `new`)."""
    if old in _REGISTRY or old in _ALIASES or new not in _REGISTRY:
        raise RuntimeError(f"alias '{old}' -> '{new}': '{old}' is taken or '{new}' is not registered")
    _ALIASES[old] = new


def aliases() -> Dict[str, str]:
    """Deprecated family names -> the registered family each stands for."""
    return _ALIASES


def spec_fields(cls, only: tuple | None = None) -> list:
    """The fields of a settings class `cls` (sim/core/settings.py) that a spec spells, in declaration order (`only`:
    those names)."""
    return [f for f in dataclasses.fields(cls) if only is None or f.name in only]


def spec_usage(family: str, cls, only: tuple | None = None) -> str:
    """The usage of a family's spec, made from its declaration: `family[:METHOD][:flag][:key=V]...`, a setting
    declared as an alternative of another (`alt=`) beside it, `[:recal=k|:runcal=k]`."""
    parts, alts = [], {}
    for f in spec_fields(cls, only):
        part = ":" + "|:".join(_spelt(cls, f).split("|"))
        if f.metadata.get("alt") in alts:
            alts[f.metadata["alt"]].append(part)
            continue
        alts[f.name] = [part]
        parts.append(alts[f.name] if not f.metadata.get("required") else part)  # a required one: no brackets
    return family + "".join(p if isinstance(p, str) else f"[{'|'.join(p)}]" for p in parts)


def _spelt(cls, f) -> str:
    """How a spec spells the setting `f` of `cls`: its metavar (default NAME) where positional, or its choices
    `a|b` where it has no metavar; `name` for a flag (a bool); `name=METAVAR` otherwise."""
    mv = f.metadata.get("metavar") or f.name.upper()
    if settings.is_positional(f):
        return f.metadata.get("metavar") or "|".join(f.metadata.get("choices") or ()) or mv
    return f.name if settings.setting_types(cls)[f.name] is bool else f"{f.name}={mv}"


def parse_spec(family: str, cls, params: List[str], only: tuple | None = None) -> dict:
    """The settings a spec's parameters give (name -> typed value), read by the family's declaration `cls`
    (sim/core/settings.py `setting`; `only`: those of its fields): `key=value` for a setting, a bare `flag` for a
    bool one (true), a bare value for the one declared `positional` (one of its choices), in any order. A value is
    checked by its declared type and range, an off value refused (a spec leaves the option out). ValueError (one
    line naming the setting and its rule) for an unknown setting, a bad value, or one given twice."""
    fields = {f.name: f for f in spec_fields(cls, only)}
    types = settings.setting_types(cls)
    positional = next((f for f in fields.values() if settings.is_positional(f)), None)
    given: dict = {}
    for p in params:
        key, eq, text = p.partition("=")
        if eq and key in fields and types[key] is not bool and not settings.is_positional(fields[key]):
            name = key
        elif not eq and key in fields and types[key] is bool:
            name, text = key, "true"
        elif not eq and positional is not None:
            name, text = positional.name, p
        elif eq and key in fields and types[key] is bool:
            raise ValueError(f"'{family}': {key} is a flag, written bare (':{key}'), not with a value ('{p}')")
        else:
            usage = _REGISTRY[family].usage if family in _REGISTRY else spec_usage(family, cls, only)
            raise ValueError(f"'{family}' has no setting '{key}'; it takes {usage}")
        try:  # the value first: a bare word that is no choice of the positional is named as such, not as twice
            value = settings.parse_text(cls, name, text, name, off=False)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if name in given:
            raise ValueError(f"'{family}': {name} is given twice")
        alt = fields[name].metadata.get("alt")
        if alt is not None and alt in given:
            raise ValueError(f"{alt} and {name} are alternatives: give one")
        given[name] = value
    missing = [f.name for f in fields.values() if f.metadata.get("required") and f.name not in given]
    if missing:  # a setting without a default (model-fixed's K)
        mv = fields[missing[0]].metadata.get("metavar") or missing[0]
        raise ValueError(f"'{family}' needs one parameter {mv}, e.g. '{family}:7'")
    return given


def describe_settings(fam: _Family) -> list[str]:
    """One line per declared setting of a family, as --help lists it: `key=V  rule; default D: help`."""
    out = []
    for cls, only in fam.settings:
        types = settings.setting_types(cls)
        for f in spec_fields(cls, only):
            default = f.metadata.get("off_means", "off") if f.default is None \
                or f.default == f.metadata.get("off", object()) else f.default
            rule = "a flag; default off" if types[f.name] is bool else f"{settings.rule(cls, f.name, off=False)}; " \
                + ("required" if f.metadata.get("required") else f"default {default}")
            out.append(f"{_spelt(cls, f)}: {rule}: {f.metadata.get('help', '')}")
    return out


TABLES = ("startup", "step")  # the `table=` option's values; the first is the default


@dataclass(frozen=True)
class TableOption:
    """The `table=T` option of the price-based families (with_table)."""

    table: str = setting(TABLES[0], "price verify slots with vLLM's start-up profile (startup) or the step's own "
                                    "verify table (step)", choices=TABLES, metavar="T")


@dataclass(frozen=True)
class DynOption:
    """The `dyn=START-END@K,...` option of the policies vLLM runs with a speculative method (with_dynamic_k)."""

    dyn: tuple = setting((), "vLLM's num_speculative_tokens_per_batch_size: K per number of requests a step "
                             "schedules", parse=parse_per_batch_option, metavar="S-E@K,...")


def split_option(cls, params: List[str]) -> tuple[List[str], dict]:
    """The parameters that set a setting of the option class `cls` (key=value, anywhere), read by its declaration
    (parse_spec), and the other parameters; ValueError if bad."""
    keys = {f.name for f in dataclasses.fields(cls)}
    mine = [p for p in params if p.partition("=")[0] in keys and "=" in p]
    return [p for p in params if p not in mine], parse_spec("policy", cls, mine)


def split_table(params: List[str]) -> tuple[List[str], bool]:
    """The `table=T` option (anywhere in the parameters; TableOption) and the other parameters: whether the policy
    prices with the step's own verify table (Policy.step_table); ValueError if T is not one of TABLES."""
    rest, given = split_option(TableOption, params)
    return rest, given.get("table", TABLES[0]) == "step"


def with_table(pol: Policy, step: bool) -> Policy:
    """`pol` pricing verify slots with the step's own table (`table=step`, Policy.step_table): the same functions,
    handed the table of this step's token count, KV context and sequences instead of vLLM's start-up profile
    (docs/design.md). Why: the start-up profile times x tokens with min(x, max_num_seqs) dummy requests at
    8,192 tokens of context each, so below max_num_seqs tokens each further slot is priced as one more long
    request (at batch 128 the 37 slots from 37 to 74 tokens cost 18.9 ms there, and nothing at a step of 37
    requests with 1,000 tokens of context each: 9.6 ms either way, one CUDA-graph bucket): a price-based policy
    then trims chains whose slots would pay. Named
    `NAME:table=step`; no fast form transcribes it; vLLM runs no such policy (its adaptive verification keeps the
    start-up table), so `vllm` is dropped. `pol` itself when step is False."""
    if not step:
        return pol
    return dataclasses.replace(pol, name=f"{pol.name}:table=step", step_table=True, sim_fn=None, sim_for=None,
                               vllm=None)


def split_dyn(params: List[str]) -> tuple[List[str], tuple]:
    """The `dyn=START-END@K,...` option (anywhere in the parameters; DynOption, sim.core.vllm.parse_per_batch_option)
    and the other parameters: vLLM's num_speculative_tokens_per_batch_size, or () without it; ValueError if
    malformed."""
    rest, given = split_option(DynOption, params)
    return rest, given.get(DYN_OPTION, ())


def with_dynamic_k(pol: Policy, per_batch: tuple) -> Policy:
    """`pol` under vLLM's dynamic speculation length (`dyn=`, the schedule of split_dyn): the same functions, named
    `NAME:dyn=...`; its VllmRun carries the schedule and exists only as vLLM runs it (only_vllm: the engine always
    charges it as vLLM's scheduler, which schedules each decoding request K(b) drafts, b the requests the previous
    step scheduled: SlotCharge.drafts_for), so the engine cuts every chain to K(b) before the policy sees it
    (StepPlan.draft_cap). On a StepBatch outside an engine the policy is `pol`'s. `pol` itself without a
    schedule; ValueError for a policy vLLM does not run."""
    if not per_batch:
        return pol
    if pol.vllm is None or pol.vllm.method is None or pol.vllm.plugin:
        raise ValueError(f"{DYN_OPTION}= goes with a policy vLLM runs with a speculative method (not '{pol.name}')")
    return dataclasses.replace(pol, name=f"{pol.name}:{DYN_OPTION}={per_batch_option(per_batch)}",
                               vllm=dataclasses.replace(pol.vllm, per_batch=per_batch, only_vllm=True))


def no_params(name: str, params: List[str]) -> None:
    if params:
        raise ValueError(f"'{name}' takes no parameter")
