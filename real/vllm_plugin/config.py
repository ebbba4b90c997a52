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

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from sim.core.drafters.calibration import DEFAULT_CALIBRATOR, calibrator_path
from sim.core.drafters.ngram import NgramConfig
from sim.infra.errors import ConfigError
from sim.core.policies.hybrid import DEFAULT_METHOD, MAX_SLOTS, METHODS, NGRAM_MARGIN  # noqa: F401 (MAX_SLOTS: the plugin's bound)
from sim.core.vllm import ADDITIONAL_CONFIG_KEY, RUNCAL_RANGE, check_runcal, plugin_spec  # noqa: F401 (defined beside the flags that carry it)
SUPPORTED_VLLM = "0.33"  # major.minor the plugin is written against (vllm==0.33.x)

_NG = NgramConfig()


def _meta(help_text: str) -> dict:
    return {"help": help_text}


@dataclass(frozen=True)
class HybridSpecConfig:
    """The hybrid speculator's settings (units: tokens unless stated)."""

    enabled: bool = field(default=True, metadata=_meta("run the hybrid (false: plain DSpark)"))
    method: str = field(default=DEFAULT_METHOD, metadata=_meta(f"how the price lambda is found: {', '.join(METHODS)}"))
    margin: float = field(default=NGRAM_MARGIN, metadata=_meta(
        "expected tokens the n-gram chain must win by (0 = the pure price rule)"))
    n_min: int = field(default=_NG.n_min, metadata=_meta("shortest suffix the n-gram drafter matches"))
    n_max: int = field(default=_NG.n_max, metadata=_meta("longest suffix the n-gram drafter matches"))
    ext_max: int = field(default=_NG.ext_max, metadata=_meta("cap on the extended match length (a calibrator feature)"))
    calibrator: str = field(default=DEFAULT_CALIBRATOR, metadata=_meta(
        "n-gram calibrator: a name under models/calibrators or a JSON path"))
    online_window: int = field(default=256, metadata=_meta(
        "steps between refreshes of the online n-gram acceptance statistics' host copy (0 = never)"))
    slots: int = field(default=0, metadata=_meta(
        "W: draft slots per request vLLM verifies; must equal num_speculative_tokens, at least DSpark's block "
        f"and at most {MAX_SLOTS} (0 = num_speculative_tokens)"))
    skip: bool = field(default=False, metadata=_meta(
        "skip DSpark's block pass for a step when the n-gram chains alone pay more (the simulator's `hybrid` "
        "rule, decided on the host from the last step's values); one rank only (docs/real.md, 'The skip')"))
    runcal: float = field(default=0.0, metadata=_meta(
        "online recalibration of both drafters' confidences: the prior precision k of one logit offset per drafter, "
        "learnt on the device from every graded slot of the run (sim/core/drafters/recalibration.py, the simulator's "
        f"runcal=k; 0 = off, else {RUNCAL_RANGE[0]:g} <= k <= {RUNCAL_RANGE[1]:g})"))
    compile: bool = field(default=False, metadata=_meta(
        "run the plugin's per-step work as compiled graphs (torch.compile at warm-up: observe and propose each one "
        "fused kernel on the CPU); CPU build only (docs/real.md, 'A cheap step')"))

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"hybrid_spec.method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not (isinstance(self.margin, (int, float)) and not isinstance(self.margin, bool)
                and 0.0 <= float(self.margin) < float("inf")):
            raise ConfigError(f"hybrid_spec.margin must be a finite number >= 0, got {self.margin!r}")
        for name in ("n_min", "n_max", "ext_max", "online_window", "slots"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"hybrid_spec.{name} must be a non-negative integer, got {v!r}")
        for name in ("enabled", "skip", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"hybrid_spec.{name} must be true or false, got {getattr(self, name)!r}")
        check_runcal(self.runcal, "hybrid_spec.runcal")
        if self.slots > MAX_SLOTS:
            raise ConfigError(f"hybrid_spec.slots must be at most {MAX_SLOTS} (0 = num_speculative_tokens), "
                              f"got {self.slots}")
        if not isinstance(self.calibrator, str) or not self.calibrator:
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
        return plugin_spec(None if self.method == DEFAULT_METHOD else self.method,
                           None if float(self.margin) == NGRAM_MARGIN else self.margin, self.slots, self.skip,
                           self.runcal)

    @staticmethod
    def dspark_block(draft_hf_config, default: int) -> int:
        """DSpark's trained block K_b: the drafter config's block_size (or dspark_block_size); `default` (vLLM's
        num_speculative_tokens) when the checkpoint names none."""
        block = getattr(draft_hf_config, "block_size", None)
        if block is None:
            block = getattr(draft_hf_config, "dspark_block_size", None)
        if block is None:
            return int(default)
        if not isinstance(block, int) or isinstance(block, bool) or block < 1:
            raise ConfigError(f"the DSpark drafter's config has block_size {block!r}; expected a positive integer")
        return block

    def resolve_slots(self, num_speculative_tokens: int, block: int) -> int:
        """W for a vLLM config with `num_speculative_tokens` and a DSpark drafter trained at `block`: one
        ConfigError naming the fix when slots disagrees with num_speculative_tokens or W < block."""
        k = int(num_speculative_tokens)
        if self.slots and self.slots != k:
            raise ConfigError(f"hybrid_spec.slots = {self.slots} but --speculative-config has num_speculative_tokens "
                              f"= {k}: vLLM sizes its buffers from num_speculative_tokens, so set it to {self.slots}")
        if k < block:
            raise ConfigError(f"num_speculative_tokens = {k} is smaller than DSpark's trained block ({block}): the "
                              f"hybrid needs W >= {block} slots (DSpark drafts its whole block)")
        if k > MAX_SLOTS:
            raise ConfigError(f"num_speculative_tokens = {k}: the hybrid supports W <= {MAX_SLOTS} slots")
        return k

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
