"""The native engine step hands the policy's fast form the gathered arrays (sim.engine.policy_fast.Arrays) with no
StepBatch (Engine.array_form), and the scheduler returns the same plan through steady stretches
(sim/core/scheduler.py): both give exactly the runs of the paths they stand in for -- the StepBatch path (an
engine subclass that overrides _allocate sees every batch, so it keeps it) and the scheduler without the
output lengths (which never takes the steady plan)."""
import shutil

import numpy as np
import pytest

from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.api.run import SimSetup, prepare
from sim.core.scheduler import Scheduler

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the engine runs the numpy step")

POLICIES = ["none", "model-fixed:7", "ngram-fixed:32", "adaptive", "ngram-first", "ngram-threshold", "hybrid",
            "hybrid-price", "hybrid-tree", "oracle"]


class _BatchPath(Engine):
    def _allocate(self, batch, plan):
        return super()._allocate(batch, plan)


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/codeedit.jsonl", sample=12, seed=7))


def _same(a, b, what):
    for k, v in a.steps.items():
        assert np.asarray(v).tobytes() == np.asarray(b.steps[k]).tobytes(), f"{what}: step column {k} differs"
    for k in ("decode_steps", "preemptions", "finish_s"):
        assert np.asarray(a.requests[k]).tobytes() == np.asarray(b.requests[k]).tobytes(), f"{what}: {k} differs"
    assert a.lossless and b.lossless


@pytest.mark.parametrize("spec", POLICIES)
def test_array_forms_equal_the_batch_path(prep, spec):
    tb = prep.tables
    need = int((tb.prompt_len + tb.out_len).max()) + max(tb.k_model, tb.k_ngram) + 32
    for cfg in (EngineConfig(batch_size=4), EngineConfig(batch_size=8, kv_capacity_tokens=need)):
        fast = Engine(tb, prep.arrivals, sim_policy(spec), prep.cost, cfg)
        res = fast.run()
        assert fast.array_form() is not None, f"{spec}: the array form is not used"
        slow = _BatchPath(tb, prep.arrivals, sim_policy(spec), prep.cost, cfg)
        ref = slow.run()
        assert slow.array_form() is None
        _same(res, ref, f"{spec} bs={cfg.batch_size}")


class _NoSteady(Scheduler):
    def __init__(self, *a, out_len=None, **k):
        super().__init__(*a, **k)  # without the output lengths: never steady


class _Counting(Scheduler):
    n_steady = 0

    def schedule(self):
        if self.steady():
            type(self).n_steady += 1
        return super().schedule()


@pytest.mark.parametrize("spec", ["none", "adaptive", "hybrid-price"])
def test_steady_plans_equal_scheduling_every_step(prep, spec, monkeypatch):
    import sim.engine.engine

    tb = prep.tables
    need = int((tb.prompt_len + tb.out_len).max()) + max(tb.k_model, tb.k_ngram) + 32
    rng = np.random.default_rng(11)
    arrivals = np.sort(rng.uniform(0, 5.0, len(tb.out_len)))  # arrivals during the run: admissions interleave
    for cfg in (EngineConfig(batch_size=4), EngineConfig(batch_size=3, kv_capacity_tokens=need),
                EngineConfig(batch_size=16, max_num_batched_tokens=256)):
        for arr in (prep.arrivals, arrivals):
            _Counting.n_steady = 0
            monkeypatch.setattr(sim.engine.engine, "Scheduler", _Counting)
            res = Engine(tb, arr, sim_policy(spec), prep.cost, cfg).run()
            assert _Counting.n_steady > 0, "no steady stretch: the test would not cover the steady plan"
            monkeypatch.setattr(sim.engine.engine, "Scheduler", _NoSteady)
            ref = Engine(tb, arr, sim_policy(spec), prep.cost, cfg).run()
            monkeypatch.undo()
            _same(res, ref, f"{spec} {cfg}")


@pytest.mark.parametrize("spec", ["hybrid-price", "hybrid", "adaptive", "ngram-threshold", "hybrid-tree", "oracle"])
def test_nan_confidences_run_the_definition(prep, spec, monkeypatch):
    """Tables with NaN confidences in some rows: the gather flags them (Gathered.has_nan), the policy's form
    declines those steps and the definition runs, so the run equals the reference engine's (numpy step, the
    definitions' own NaN semantics). `oracle` reads no confidence: its form runs on, with the same result."""
    import dataclasses

    import sim.engine.native_step

    tb = prep.tables
    rng = np.random.default_rng(3)
    m_conf, ng_conf = tb.m_conf.copy(), tb.ng_conf.copy()
    m_conf[rng.random(len(m_conf)) < 0.05, 1] = np.nan
    ng_conf[rng.random(len(ng_conf)) < 0.05, 0] = np.nan
    odd = dataclasses.replace(tb, m_conf=m_conf, ng_conf=ng_conf)
    flags = []
    gather = sim.engine.native_step.NativeStep.gather

    def spy(self, *a, **k):
        g = gather(self, *a, **k)
        flags.append(g.has_nan)
        return g

    monkeypatch.setattr(sim.engine.native_step.NativeStep, "gather", spy)
    cfg = EngineConfig(batch_size=4)
    res = Engine(odd, prep.arrivals, sim_policy(spec), prep.cost, cfg).run()
    assert any(flags), f"{spec}: no step gathered a NaN"
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1")
    ref = Engine(odd, prep.arrivals, sim_policy(spec), prep.cost, cfg).run()
    _same(res, ref, f"{spec} with NaN confidences")
