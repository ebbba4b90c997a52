"""The vLLM plugin's settings, declared once: the `hybrid_spec` object of vLLM's `--additional-config`.

    vllm serve ... --speculative-config '{"method": "dspark", ...}' --additional-config '{"hybrid_spec": {"slots": 32}}'

`PluginSettings` declares every field (type, default, help, range: sim/core/settings.py) and its counterpart in the
simulator (`sim=`, SIM_COUNTERPARTS): a `hybrid-vllm` spec option of the same name, the n-gram drafter's setting, the
switch, or engine-only (no effect on what the simulator predicts). Every reader is made from it:
real/vllm_plugin/config.py's HybridSpecConfig (the plugin, which adds only its launch checks), sim.core.vllm's
`--additional-config` reading, the `hybrid-vllm` spec grammar (sim/core/policies/hybrid.py) and real/validate.py's
`hybrid:FIELD=V`. A new field is a one-file change here; one without a counterpart is refused at import
(check_counterparts). This module imports no policy, so the plugin's process and sim.core.vllm read it without
loading the simulator's families.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.core.drafters.calibration import DEFAULT_CALIBRATOR
from sim.core.drafters.ngram import NgramConfig
from sim.core.settings import setting, spec_name
from sim.infra.errors import ConfigError

METHODS = ("model-opt", "fixed-point", "sweep")  # how the hybrid's price lambda is found (hybrid.LAMBDA_METHODS)
DEFAULT_METHOD = "sweep"
NGRAM_MARGIN = 1.0  # expected tokens; the winner's-curse margin (sim/core/policies/hybrid.py's docstring)
# Largest W (`hybrid-vllm:slots=W`, the plugin's hybrid_spec.slots). vLLM 0.32/0.33 has no cap of its own on
# num_speculative_tokens for DSpark (its start-up checks refuse a token budget that cannot hold a decode step's W + 1
# tokens per request); 64 is the plugin's bound and what its tests cover.
MAX_SLOTS = 64
RUNCAL_RANGE = (1e-3, 1e6)  # the plugin's runcal=k, prior precision k [1 / logit^2], when on (0 = off)
TAIL_MAX = 0.5  # the largest confidence the plugin may publish past its chosen chain (hybrid_spec.tail)
METHOD_HELP = "how the price lambda is found"
MARGIN_HELP = "expected tokens the n-gram chain must win by (0 = the pure price rule)"
_NG = NgramConfig()


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
    """The vLLM plugin's settings (units: tokens unless stated; the module docstring says who reads them). `sim`: each
    field's counterpart in the simulator (SIM_COUNTERPARTS)."""

    enabled: bool = setting(True, "run the hybrid (false: plain DSpark)", sim="switch")
    method: str = setting(DEFAULT_METHOD, METHOD_HELP, choices=METHODS, positional=True, metavar="METHOD",
                          sim="option")
    margin: float = setting(NGRAM_MARGIN, MARGIN_HELP, lo=0.0, metavar="M", sim="option")
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
    tail: float = setting(0.0, "the conditional confidence published past the chosen chain (0: exact zeros, which "
                               "vLLM's top-B admits among ties when its one-step-old budget exceeds the positive "
                               "slots; c > 0: ranked below every chain slot, and sizes the next step's budget)",
                          lo=0.0, hi=TAIL_MAX, metavar="c", sim="option")
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
                        f"{', '.join(SIM_COUNTERPARTS)} (sim/core/plugin_settings.py)")


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
