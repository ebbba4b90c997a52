"""Settings of the hybrid speculator inside vLLM: the `hybrid_spec` entry of vLLM's `--additional-config`.

    VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-8B \
      --speculative-config '{"method": "dspark", "model": "...", "num_speculative_tokens": 7,
                             "enable_adaptive_verification": true}' \
      --additional-config '{"hybrid_spec": {"method": "sweep", "margin": 1.0}}'

The variable keeps vLLM on Model Runner V2, whose speculator the plugin hooks: unset, vLLM 0.33 falls back to V1
when a config asks for a feature V2 lacks (sim/core/deploy.py SERVE_ENV, on every line the verdict and the
validation print).

W slots (docs/real.md, "W slots"): with "num_speculative_tokens": W > DSpark's trained block (e.g. 32) vLLM sizes
its scheduler, input buffers, target graphs, rejection sampler, adaptive verification and KV lookahead for W,
while the plugin builds DSpark's speculator at its block and pads its chain with confidence 0; the n-gram
chain keeps up to W tokens. `slots` names W explicitly (0: whatever num_speculative_tokens is); the plugin
checks it against the speculative config at start-up (`speculator.check_slots`).

vLLM forbids unknown keys in the speculative config and a new `method` name, so the hybrid rides on a
DSpark config and takes its own settings from `additional_config["hybrid_spec"]` (a JSON object; an empty
object enables the hybrid with the defaults below). Every field is validated here, once, in every process
that loads the plugin; a bad value is one ConfigError naming the field.

What the plugin runs per step is the simulator's policy `HybridSpecConfig.sim_policy()` (`hybrid-vllm`,
sim/core/policies/hybrid.py), so `python -m sim.run --policy <that>` predicts the same engine.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from sim.core import settings
from sim.core.drafters.calibration import calibrator_path
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.synthetic import length_to_rates
from sim.infra.errors import ConfigError
from sim.core.plugin_settings import MAX_SLOTS, PluginSettings, plugin_slots, plugin_spec  # noqa: F401 (MAX_SLOTS: the plugin's bound)
from sim.core.vllm import ADDITIONAL_CONFIG_KEY
SUPPORTED_VLLM = "0.33"  # major.minor the plugin is written against (vllm==0.33.x)

_NG = NgramConfig()


@dataclass(frozen=True)
class HybridSpecConfig(PluginSettings):
    """The hybrid speculator's settings: the fields, types, defaults, help and ranges are the core's one declaration
    (sim/core/plugin_settings.py PluginSettings, which also says each one's counterpart in the simulator); this class
    adds what only the engine checks against vLLM's launch (resolve_slots, check_vllm) and the calibrator file."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(PluginSettings):
            settings.check(PluginSettings, f.name, getattr(self, f.name), f"{ADDITIONAL_CONFIG_KEY}.{f.name}")
        if not self.calibrator:
            raise ConfigError(f"hybrid_spec.calibrator must be a calibrator name or path, got {self.calibrator!r}")
        try:  # here, at start-up, not when the first worker builds its drafter
            calibrator_path(self.calibrator)
        except ConfigError as e:
            raise ConfigError(f"hybrid_spec.calibrator: {e}") from None
        NgramConfig(n_min=self.n_min, n_max=self.n_max, k=_NG.k, ext_max=self.ext_max)  # range checks

    def ngram(self, k: int) -> NgramConfig:
        """The n-gram drafter's settings for chains of k tokens (vLLM's num_speculative_tokens)."""
        return NgramConfig(n_min=self.n_min, n_max=self.n_max, k=k, ext_max=self.ext_max)

    def sim_policy(self) -> str:
        """The simulator's policy spec that predicts this engine (`hybrid-vllm[:METHOD][:margin=M][:slots=W][:skip][:runcal=k]`;
        `:skip` is the twin of the plugin's skip: the same plan_skip decision, vLLM keeping its own budget)."""
        return plugin_spec(dataclasses.asdict(self))

    @staticmethod
    def dspark_block(draft_hf_config, default: int) -> int:
        """DSpark's trained block K_b: the drafter config's block (trained_block); `default` (vLLM's
        num_speculative_tokens) when the checkpoint names none."""
        block = trained_block(draft_hf_config)
        return int(default) if block is None else block

    def resolve_slots(self, num_speculative_tokens: int, block: int) -> int:
        """W for a vLLM config with `num_speculative_tokens` and a DSpark drafter trained at `block`: one
        ConfigError naming the fix when slots disagrees with num_speculative_tokens or W < block."""
        return plugin_slots(self.slots, int(num_speculative_tokens), block)

    def to_additional_config(self) -> dict:
        """{"hybrid_spec": {...}}: what to pass as vLLM's additional_config (only non-default fields)."""
        default = HybridSpecConfig()
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}
        return {ADDITIONAL_CONFIG_KEY: body}

    def check_vllm(self, num_speculative_tokens: int, block: int, cpu_build: bool, ranks: int = 1) -> int:
        """Start-up check against vLLM's launch: W (`resolve_slots`); the skip only on one rank (`ranks`: tensor x
        data parallel size); compile only on the CPU build. Returns W; one ConfigError otherwise."""
        W = self.resolve_slots(num_speculative_tokens, block)
        if self.skip and ranks > 1:
            raise ConfigError(f"hybrid_spec.skip needs tensor and data parallel size 1 (got {ranks} ranks): each rank "
                              "would decide the skip from its own profile while DSpark's pass runs on all of them "
                              "together; remove \"skip\"")
        if self.compile and not cpu_build:
            raise ConfigError("hybrid_spec.compile runs only on the CPU build: on CUDA it would trace the plugin's "
                              "Triton n-gram kernels (defined at first use, real/vllm_plugin/ngram_kernels.py), which "
                              "no GPU test has covered; remove \"compile\"")
        return W

    @classmethod
    def from_additional_config(cls, additional: Mapping[str, Any] | None) -> "HybridSpecConfig | None":
        """The settings in vLLM's additional_config, or None when it has no `hybrid_spec` entry."""
        if not additional or ADDITIONAL_CONFIG_KEY not in additional:
            return None
        body = additional[ADDITIONAL_CONFIG_KEY]
        if body is None or body is True:
            body = {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"additional_config.{ADDITIONAL_CONFIG_KEY} must be a JSON object, got {body!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ConfigError(f"additional_config.{ADDITIONAL_CONFIG_KEY}: unknown field(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        return cls(**dict(body))


# Where a DSpark checkpoint may keep its block, in vLLM 0.33's precedence (config/speculative.py reads a Qwen3 DSpark
# value from dflash_config, then eagle_config, then the top level); each name is looked up everywhere before the next.
BLOCK_SECTIONS = ("dflash_config", "eagle_config", None)
BLOCK_NAMES = ("block_size", "dspark_block_size")


def trained_block(draft_config) -> int | None:
    """DSpark's trained block named by a drafter config (a transformers config or a config.json's dict): the first
    of BLOCK_NAMES found in BLOCK_SECTIONS order; None when it names none; ConfigError unless a positive integer.
    Nested first: a checkpoint that keeps its block only in dflash_config must not be read as having none (the
    plugin would then build DSpark at W tokens, silently)."""
    def get(obj, name):
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    for name in BLOCK_NAMES:
        for section in BLOCK_SECTIONS:
            holder = draft_config if section is None else get(draft_config, section)
            block = None if holder is None else get(holder, name)
            if block is None:
                continue
            if not isinstance(block, int) or isinstance(block, bool) or block < 1:
                where = name if section is None else f"{section}.{name}"
                raise ConfigError(f"the DSpark drafter's config has {where} {block!r}; expected a positive integer")
            return block
    return None


def block_config(vllm_config, block: int):
    """A shallow copy of vllm_config whose speculative config drafts `block` tokens (DSpark's own view, W > block); the
    runner keeps the original, W wide. vLLM validates the copy again when DSpark builds its model from it
    (load_dspark_model's `replace(vllm_config, ...)` re-runs SpeculativeConfig's validator), which wants exactly
    num_speculative_tokens synthetic_acceptance_rates: W-long rates (synthetic rejection sampling) are cut to their
    first `block` (the unconditional rates of DSpark's positions, those the W-wide verify applies to them); a length
    not yet resolved to rates is resolved at W first (vLLM's schedule, synthetic.length_to_rates), so the copy holds
    rates only. The rates are set before num_speculative_tokens, each with object.__setattr__ (a frozen or
    assignment-validated config would otherwise check the rates against the old width)."""
    out = copy.copy(vllm_config)
    spec = copy.copy(vllm_config.speculative_config)
    rates = getattr(spec, "synthetic_acceptance_rates", None)
    length = getattr(spec, "synthetic_acceptance_length", None)
    if rates is None and length is not None:
        rates = length_to_rates(float(length), int(spec.num_speculative_tokens))
    if rates is not None:
        object.__setattr__(spec, "synthetic_acceptance_rates", [float(r) for r in list(rates)[:int(block)]])
        if length is not None:
            object.__setattr__(spec, "synthetic_acceptance_length", None)
    object.__setattr__(spec, "num_speculative_tokens", int(block))
    object.__setattr__(out, "speculative_config", spec)
    return out
