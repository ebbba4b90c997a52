"""The `vllm.general_plugins` entry point (pyproject: hybridspec = real.vllm_plugin.plugin:register).

vLLM loads general plugins in every process before it builds workers. `register` wraps two names the
Model Runner V2 module imported from elsewhere (vllm/v1/worker/gpu/model_runner.py):
  init_speculator                              -> builds `HybridSpeculator` instead of DSpark's when
                                                  additional_config has a `hybrid_spec` entry; it also
                                                  gives the runner a GPU-resident token history (vLLM
                                                  keeps it in host memory unless its n-gram drafter is on)
  maybe_create_adaptive_verification_manager   -> hands the manager (its profiled cost tables) to the
                                                  speculator, which prices chains with them
Without a `hybrid_spec` entry both wrappers only call through, so installing the plugin changes nothing.
"""
from __future__ import annotations

import weakref

from real.vllm_plugin.config import ADDITIONAL_CONFIG_KEY, SUPPORTED_VLLM, HybridSpecConfig
from sim.errors import ConfigError

_ACTIVE: list = []  # weak references to the speculators built in this process (one per model runner)


def vllm_version() -> str:
    """The installed vLLM's version, or a ConfigError saying how to install the supported one."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"vLLM is not installed ({exc}); the hybrid plugin needs vLLM {SUPPORTED_VLLM}.x: "
                          "pip install -e '.[vllm]' (and a CUDA GPU to run it)") from None
    return str(getattr(vllm, "__version__", "unknown"))


def check_version(version: str) -> None:
    if not (version == SUPPORTED_VLLM or version.startswith(SUPPORTED_VLLM + ".")):
        raise ConfigError(f"hybridspec's vLLM plugin is written for vLLM {SUPPORTED_VLLM}.x, found {version}; "
                          f"pip install 'vllm=={SUPPORTED_VLLM}.0' or remove '{ADDITIONAL_CONFIG_KEY}' from "
                          "--additional-config")


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
    return cfg


def make_init_speculator(orig):
    """Wrap model_runner.init_speculator (see the module docstring)."""

    def init_speculator(vllm_config, device, req_states):
        cfg = hybrid_config(vllm_config)
        if cfg is None:
            return orig(vllm_config, device, req_states)
        import torch
        from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

        from real.vllm_plugin.speculator import HybridSpeculator

        # no request is in yet: swap the host-memory history for a dense device one the n-gram scan reads
        req_states.all_token_ids = StagedWriteTensor((req_states.max_num_reqs, req_states.max_model_len),
                                                     dtype=torch.int32, device=device, uva_instead_of_gpu=False)
        sp = HybridSpeculator(vllm_config, device, req_states, cfg)
        _ACTIVE.append(weakref.ref(sp))
        return sp

    init_speculator.__wrapped__ = orig
    return init_speculator


def make_manager_factory(orig):
    """Wrap model_runner.maybe_create_adaptive_verification_manager (see the module docstring)."""

    def maybe_create_adaptive_verification_manager(*args, **kwargs):
        manager = orig(*args, **kwargs)
        for ref in _ACTIVE:
            sp = ref()
            if sp is not None and sp.adaptive_manager is None:
                sp.adaptive_manager = manager
        return manager

    maybe_create_adaptive_verification_manager.__wrapped__ = orig
    return maybe_create_adaptive_verification_manager


def register() -> None:
    """Entry point: install the wrappers into vLLM's Model Runner V2 module (idempotent)."""
    version = vllm_version()
    from vllm.v1.worker.gpu import model_runner as mr

    if getattr(mr, "_hybridspec_registered", False):
        return
    try:
        check_version(version)
    except ConfigError as exc:
        refuse = exc

        def init_speculator(vllm_config, device, req_states, _orig=mr.init_speculator):
            if hybrid_config(vllm_config) is not None:
                raise refuse
            return _orig(vllm_config, device, req_states)

        mr.init_speculator = init_speculator
    else:
        mr.init_speculator = make_init_speculator(mr.init_speculator)
        mr.maybe_create_adaptive_verification_manager = make_manager_factory(
            mr.maybe_create_adaptive_verification_manager)
    mr._hybridspec_registered = True
