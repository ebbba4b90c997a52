"""Where a simulated policy can run, and the `vllm serve` flags that run it: the tiers of sim.run's verdict.

A policy's tier comes from what it declares (sim/core/policies/registry.py `Policy`), never from its name:

  tier     condition                         meaning for a vLLM user
  vllm     Policy.vllm, not the plugin       runs in vLLM as released, with the flags `serve_flags` prints
  plugin   Policy.vllm.plugin                runs in vLLM with this project's plugin installed (hybrid-vllm over
                                             the plugin's chains, PLUGIN_DRAFTERS; over more: engine)
  engine   Policy.vllm is None               simulated only: vLLM's engine would need changes (its scheduler
                                             charges a request every scheduled draft slot, one chain each)
  newer    Policy.vllm.release               in a vLLM build the simulator does not model (vLLM main, Arctic
                                             Inference's plugin): not served by the release the user names
  tree     Policy.tree                       needs tree attention (two chains verified as branches)
  bound    Policy.needs_truth                an upper bound: reads the true accepted lengths

The flags (`speculative_config`), for K = num_speculative_tokens:
  none, K = 0          no --speculative-config (vLLM's num_speculative_tokens must be > 0)
  dspark               {"method": "dspark", "model": CKPT, "num_speculative_tokens": K}
                       + "enable_adaptive_verification": true for `adaptive` (Policy.vllm.adaptive)
  eagle, eagle3        the model-drafter profile stands for an EAGLE head (EAGLE_PROFILES): that method, its CKPT;
                       with adaptive verification only as `adaptive:online` (Policy.vllm.estimator: no head)
  mtp                  the profile stands for the target's MTP module (MTP_PROFILE): {"method": "mtp",
                       "num_speculative_tokens": K}, no CKPT (the module ships with the target)
  any of the above     + "num_speculative_tokens_per_batch_size": [[start, end, K], ...] for a `dyn=` policy
  ngram                {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": n_min,
                        "prompt_lookup_max": n_max}: the n range the n-gram calibrator was fitted for
  suffix               {"method": "suffix", "num_speculative_tokens": K} + the suffix_decoding_* settings that
                       differ from vLLM's defaults (SuffixConfig's defaults are vLLM's); needs arctic-inference
  plugin               dspark with adaptive verification at K = W, plus --additional-config
                       {"hybrid_spec": {the plugin settings that differ from its defaults, the run's calibrator}}
The line starts with SERVE_ENV, VLLM_USE_V2_MODEL_RUNNER=1, for every method Model Runner V2 runs: vLLM 0.33 picks
V2 by default but falls back to V1 (with a warning) when a config asks for a feature V2 lacks, and the plugin hooks
V2's speculator (real/vllm_plugin) while the simulator models V2's scheduling; the variable makes the runner a
choice, not a default. Methods V2 does not run (V1_METHODS: suffix in 0.33) get no prefix: V1 is what runs them.
The validation prints this same line for each of its cells (real/validation/vllm/config.py, serve_line).
CKPT: the drafter checkpoint published for the target (DRAFTER_CHECKPOINTS, by models/llms name and method; a
Deployment's `checkpoint` names another, e.g. a validation's --vllm-drafter); a
target without one gets no flags but the reason, and so do `adaptive` and the plugin on an EAGLE run (they need
DSpark's confidence head) and `adaptive:online` on a DSpark run (vLLM ranks by the head there). A setup without
flags is not recommended (sim/api/console.py).

Every method here is in vLLM 0.32 and 0.33 (VLLM_VERSIONS), the plugin is written against 0.33 and runs on the
0.32 CPU build.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Mapping

from sim.core.vllm import (ADDITIONAL_CONFIG_KEY, EAGLE_PROFILES, MODEL_METHODS, MTP_PROFILE, PER_BATCH_FIELD,
                           PLUGIN_DRAFTERS, SUFFIX_FIELDS, VllmRun)

TIERS: Mapping[str, str] = {  # tier -> how the verdict names it ({version}: the vLLM release)
    "vllm": "in vLLM {version} today",
    "plugin": "with hybridspec's vLLM plugin",
    "engine": "simulated only (vLLM's engine would need changes)",
    "newer": "in a vLLM build the simulator does not model, not vLLM {version}",
    "tree": "needs tree attention",
    "bound": "upper bound",
}
DEPLOYABLE = ("vllm", "plugin")  # the tiers a user can serve
MAIN_TIER = "vLLM main, unreleased"  # the reports' name for the 'newer' policies of vLLM's main branch (on_vllm_main)

# Published drafter checkpoints, by (models/llms name, vLLM method). A DSpark or EAGLE head reads its own target's
# hidden states and vocabulary: a checkpoint never stands in for another target's.
DRAFTER_CHECKPOINTS: Mapping[tuple[str, str], str] = {
    ("qwen3-8b", "dspark"): "deepseek-ai/dspark_qwen3_8b_block7",
    ("llama-3.1-8b", "eagle"): "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    ("llama-3.1-8b", "eagle3"): "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
}


# The environment of a `vllm serve` line whose method Model Runner V2 runs (module docstring), and the methods it does
# not run in vLLM 0.33 (vllm/config/vllm.py _get_v2_model_runner_unsupported_features: they fall back to V1)
SERVE_ENV: Mapping[str, str] = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
V1_METHODS = ("suffix",)

# what a vLLM method needs installed beside vLLM (vllm/config/speculative.py: suffix decoding imports Arctic Inference)
METHOD_NEEDS: Mapping[str, str] = {"suffix": "pip install arctic-inference==0.1.1"}


def drafter_checkpoint(model: str, method: str) -> str | None:
    """The published `method` drafter checkpoint for the target `model` (a models/llms name), or None."""
    return DRAFTER_CHECKPOINTS.get((model, method))


def tier(policy) -> str:
    """The policy's tier (module docstring); `policy`: a sim.core.policies Policy."""
    if policy.needs_truth:
        return "bound"
    if policy.tree:
        return "tree"
    if policy.vllm is None:
        return "engine"
    if policy.vllm.release is not None:
        return "newer"
    if policy.vllm.plugin and set(policy.drafters) - set(PLUGIN_DRAFTERS):
        return "engine"  # hybrid-vllm over a chain the plugin does not run (the suffix tree): simulated only
    return "plugin" if policy.vllm.plugin else "vllm"


def on_vllm_main(policy) -> bool:
    """Whether the policy runs in vLLM's main branch and no release (Policy.vllm.main): the reports' MAIN_TIER, a
    tier of its own beside the verdict's, never recommended; `policy`: a sim.core.policies Policy."""
    return tier(policy) == "newer" and policy.vllm.main


@dataclass(frozen=True)
class Deployment:
    """What the flags need besides the policy: the target (models/llms name and Hugging Face id), the vLLM
    release, the model drafter's profile (a DSpark block drafter, or an EAGLE profile: `drafter` NAME[:K]), the
    n-gram calibrator's n range and the suffix drafter's settings (SuffixConfig field -> value)."""

    model: str
    hf_id: str
    version: str
    drafter: str = ""  # the model-drafter profile's own name (ModelDrafterProfile.name), not the path given
    block: int = 7
    ngram_range: tuple[int, int] = (1, 1)
    suffix: Mapping[str, object] = field(default_factory=dict)
    suffix_defaults: Mapping[str, object] = field(default_factory=dict)
    plugin_ngram: Mapping[str, object] = field(default_factory=dict)  # hybrid_spec's calibrator settings, if not its defaults
    checkpoint: str = ""  # the model drafter's checkpoint to serve; "": the one published for the target (CKPT)

    @property
    def model_method(self) -> str:
        """The vLLM method the model-drafter profile stands for (EAGLE_PROFILES, the table --speculative-config
        maps through): eagle/eagle3 for their profiles, mtp for MTP_PROFILE, else dspark."""
        base = self.drafter.split(":")[0]
        return next((m for m, prof in {**EAGLE_PROFILES, "mtp": MTP_PROFILE}.items() if prof == base), "dspark")


def speculative_config(run: VllmRun, dep: Deployment) -> tuple[dict | None, list[str], str | None]:
    """(vLLM's --speculative-config for `run`, --additional-config or [], why no flags can be given or None);
    the config is None for no speculation."""
    if run.method is None or run.k == 0:  # K = 0: no speculation (vLLM's num_speculative_tokens must be > 0)
        return None, [], None
    k = dep.block if run.k is None else run.k
    dyn = {PER_BATCH_FIELD: [list(e) for e in run.per_batch]} if run.per_batch else {}
    if run.method == "ngram":
        return ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": dep.ngram_range[0],
                 "prompt_lookup_max": dep.ngram_range[1], **dyn}, [], None)
    if run.method == "suffix":
        k = dep.suffix.get("max_spec_tokens", dep.suffix_defaults.get("max_spec_tokens")) if run.k is None else run.k
        cfg: dict = {"method": "suffix", "num_speculative_tokens": k}
        vllm_name = {v: f for f, v in SUFFIX_FIELDS.items()}
        for name, value in dep.suffix.items():
            if name in vllm_name and value != dep.suffix_defaults.get(name):
                cfg[vllm_name[name]] = value
        odd = [n for n, v in dep.suffix.items() if n not in vllm_name and n != "max_spec_tokens"
               and v != dep.suffix_defaults.get(n)]
        notes = [f"needs {METHOD_NEEDS['suffix']}"] + [f"the suffix setting {n} has no vLLM field" for n in odd[:1]]
        return cfg, [], "; ".join(notes)
    method = dep.model_method
    head = method in MODEL_METHODS  # a drafter with a confidence head, which adaptive verification then ranks by
    if (run.plugin or (run.adaptive and not run.estimator)) and not head:
        return None, [], (f"the run's model drafter stands for method {method!r}: the plugin and adaptive verification "
                          "on a confidence head need method 'dspark' (adaptive:online is vLLM's adaptive verification "
                          "without one)")
    if run.estimator and head:
        return None, [], (f"adaptive:online ranks by vLLM's acceptance estimator, which vLLM runs for a drafter "
                          f"without a confidence head (eagle, eagle3); the run's drafter stands for {method!r}, whose "
                          "head vLLM ranks by instead")
    ckpt = (dep.checkpoint or None) if method != "mtp" else None
    ckpt = ckpt or drafter_checkpoint(dep.model, method)
    if ckpt is None and method != "mtp":  # an MTP module ships inside its target's checkpoint
        return None, [], f"no published {method} drafter checkpoint for {dep.model} is known (sim/core/deploy.py)"
    cfg = {"method": method, **({"model": ckpt} if ckpt else {}), "num_speculative_tokens": k}
    if run.adaptive:
        cfg["enable_adaptive_verification"] = True
    cfg.update(dyn)
    extra = []
    if run.plugin:
        extra = ["--additional-config", _json({ADDITIONAL_CONFIG_KEY: {**dict(run.plugin_config), **dep.plugin_ngram}})]
    return cfg, extra, None


def _json(obj) -> str:
    return shlex.quote(json.dumps(obj, separators=(",", ":")))


def serve_flags(policy, dep: Deployment, batch_size: int) -> tuple[str | None, str | None]:
    """(the `vllm serve` line that runs `policy` at `batch_size` concurrent requests, why none can be given);
    for a policy outside the deployable tiers: (None, its tier's name)."""
    if tier(policy) not in DEPLOYABLE:
        return None, TIERS[tier(policy)]
    cfg, extra, why = speculative_config(policy.vllm, dep)
    if why is not None and cfg is None:
        return None, why
    env = [] if cfg is not None and cfg["method"] in V1_METHODS else [f"{k}={v}" for k, v in SERVE_ENV.items()]
    line = env + ["vllm", "serve", shlex.quote(dep.hf_id or dep.model), "--max-num-seqs", str(batch_size)]
    if cfg is not None:
        line += ["--speculative-config", _json(cfg)]
    line += extra
    return " ".join(line), why


PLUGIN_INSTALL = "install this project into vLLM's environment (pip install -e .; docs/real.md)"
