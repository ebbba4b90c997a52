"""Settings of the hybrid speculator inside vLLM: the `hybrid_spec` entry of vLLM's `--additional-config`.

    vllm serve Qwen/Qwen3-8B \
      --speculative-config '{"method": "dspark", "model": "...", "num_speculative_tokens": 7,
                             "enable_adaptive_verification": true}' \
      --additional-config '{"hybrid_spec": {"method": "sweep", "margin": 1.0}}'

vLLM forbids unknown keys in the speculative config and a new `method` name, so the hybrid rides on a
DSpark config and takes its own settings from `additional_config["hybrid_spec"]` (a JSON object; an empty
object enables the hybrid with the defaults below). Every field is validated here, once, in every process
that loads the plugin; a bad value is one ConfigError naming the field.

What the plugin runs per step is the simulator's policy `HybridSpecConfig.sim_policy()` (`hybrid-vllm`,
sim/policies/hybrid.py), so `python -m sim.run --policy <that>` predicts the same engine.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from sim.drafters.calibration import DEFAULT_CALIBRATOR
from sim.drafters.ngram import NgramConfig
from sim.errors import ConfigError
from sim.policies.hybrid import DEFAULT_METHOD, METHODS, NGRAM_MARGIN

ADDITIONAL_CONFIG_KEY = "hybrid_spec"
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

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"hybrid_spec.method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not (isinstance(self.margin, (int, float)) and not isinstance(self.margin, bool)
                and 0.0 <= float(self.margin) < float("inf")):
            raise ConfigError(f"hybrid_spec.margin must be a finite number >= 0, got {self.margin!r}")
        for name in ("n_min", "n_max", "ext_max", "online_window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"hybrid_spec.{name} must be a non-negative integer, got {v!r}")
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"hybrid_spec.enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.calibrator, str) or not self.calibrator:
            raise ConfigError(f"hybrid_spec.calibrator must be a calibrator name or path, got {self.calibrator!r}")
        NgramConfig(n_min=self.n_min, n_max=self.n_max, k=_NG.k, ext_max=self.ext_max)  # range checks

    def ngram(self, k: int) -> NgramConfig:
        """The n-gram drafter's settings for chains of k tokens (vLLM's num_speculative_tokens)."""
        return NgramConfig(n_min=self.n_min, n_max=self.n_max, k=k, ext_max=self.ext_max)

    def sim_policy(self) -> str:
        """The simulator's policy spec that predicts this engine."""
        spec = "hybrid-vllm" + ("" if self.method == DEFAULT_METHOD else f":{self.method}")
        return spec + ("" if float(self.margin) == NGRAM_MARGIN else f":margin={float(self.margin):g}")

    def to_additional_config(self) -> dict:
        """{"hybrid_spec": {...}}: what to pass as vLLM's additional_config (only non-default fields)."""
        default = HybridSpecConfig()
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}
        return {ADDITIONAL_CONFIG_KEY: body}

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
