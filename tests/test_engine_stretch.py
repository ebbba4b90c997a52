"""Steady stretches (sim/engine/stretch.py) against the same engine stepping every step through Engine._step:
every step and request column bit for bit, the emitted tokens and the per-request state, with arrivals
(--rate: stretches end at simpy's next event), preemption (a small KV cache), synchronous scheduling, tight
token budgets, a cost model that prices logit rows, a short held-step list, a policy that skips a drafter (its say changes the prices), confidences a fast form
declines (NaN), an over-admitting policy (the violation) and the gates; and that stretches really ran."""
import dataclasses
import shutil

import numpy as np
import pytest

import sim.engine.engine as engine_mod
from conftest import LinearCost, plausible_calibrator, random_requests
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.stream import StreamingTables
from sim.engine.engine import Engine, EngineConfig
import sim.engine.choice as choice_mod
from sim.engine.choice import stretch_ok
from sim.engine.policies import sim_policy
from sim.core.policies.base import Allocation
from sim.api.run import SimSetup, prepare

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: no native step, no stretches")

STATE = ("pos", "prev_pos", "model_pos", "m_conf_sum", "m_conf_cnt", "ng_conf_sum", "ng_conf_cnt", "n_steps",
         "emitted_tokens", "n_preempt", "fresh", "t_first", "t_done")


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=12, seed=7))


def _run(tables, prep, pol, cfg, monkeypatch, stretch: bool):
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "0")
    ran = []
    inner = engine_mod.steady_steps

    def counting(eng, now, nxt, room):
        out = inner(eng, now, nxt, room)
        assert out is None or 1 <= len(out[0]) <= room
        ran.append(0 if out is None else len(out[0]))
        return out

    monkeypatch.setattr(engine_mod, "steady_steps", counting)
    monkeypatch.setattr(choice_mod, "stretch_ok", stretch_ok if stretch else (lambda eng: False))
    pol = sim_policy(pol) if isinstance(pol, str) else pol
    eng = Engine(tables, prep.arrivals, pol, prep.cost, cfg)
    res = eng.run()
    assert eng._fast is not None
    return eng, res, sum(ran)


def _same(a, b, what: str) -> None:
    (ea, ra, _), (eb, rb, _) = a, b
    assert ra.lossless == rb.lossless and ra.violation == rb.violation, what
    for cols in ("steps", "requests"):
        x, y = getattr(ra, cols), getattr(rb, cols)
        assert x.keys() == y.keys(), what
        for k, v in x.items():
            v, w = np.asarray(v), np.asarray(y[k])
            assert v.dtype == w.dtype and v.shape == w.shape and v.tobytes() == w.tobytes(), \
                f"{what}: {cols} column {k} differs"
    for k in STATE:
        x, y = getattr(ea, k), getattr(eb, k)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{what}: {k} differs"  # NaN: the same bits
    assert ea.n_written == eb.n_written and ra.sim_time_s == rb.sim_time_s, what


def _kv_small(prep) -> int:
    tb = prep.tables
    return int((tb.prompt_len + tb.out_len).max()) + max(tb.k_model, tb.k_ngram) + 64


def _check(tables, prep, pol, cfg, monkeypatch, what, min_share=0.25):
    on = _run(tables, prep, pol, cfg, monkeypatch, stretch=True)
    off = _run(tables, prep, pol, cfg, monkeypatch, stretch=False)
    steps = len(on[1].steps["emitted"])
    assert on[2] >= min_share * steps and off[2] == 0, f"{what}: {on[2]} of {steps} steps in stretches"
    _same(on, off, what)
    return on


POLICIES = ("hybrid-price", "hybrid", "hybrid-tree", "oracle", "adaptive", "model-fixed:7", "ngram-first",
            "ngram-threshold")  # `none` fast-forwards its stretches instead (sim/engine/fast_forward.py)


@pytest.mark.parametrize("spec", POLICIES)
@pytest.mark.parametrize("batch,rate,small_kv,sync", [
    (4, None, False, False), (4, 2.0, True, False), (32, 8.0, False, True)])
def test_stretches_equal_step_by_step(prep, spec, batch, rate, small_kv, sync, monkeypatch):
    cfg = EngineConfig(batch_size=batch, rate=rate, async_scheduling=not sync,
                       kv_capacity_tokens=_kv_small(prep) if small_kv else None)
    on = _check(prep.tables, prep, spec, cfg, monkeypatch, f"{spec} batch {batch} rate {rate} kv {small_kv}")
    if small_kv:
        assert on[1].requests["preemptions"].sum() > 0


def test_tight_token_budget(prep, monkeypatch):
    """A token budget that the draft reservation squeezes: the next full schedule reads the stretch's last
    verified draft count (Scheduler.last_draft), so a stretch must leave it as the last step did."""
    for budget in (256, 96, 48):
        _check(prep.tables, prep, "hybrid-price", EngineConfig(batch_size=4, max_num_batched_tokens=budget),
               monkeypatch, f"budget {budget}")


def test_cost_model_pricing_logit_rows(prep, monkeypatch):
    """A profiled cost table, whose verify time depends on the logit rows (RooflineCost's does not): the
    stretch charges the step's logit rows as Engine._finish_step does."""
    from sim.core.cost import ProfiledCost
    from test_cost_profiled import full_table

    p = dataclasses.replace(prep, cost=ProfiledCost(full_table()))
    for spec in ("hybrid-price", "oracle"):
        _check(p.tables, p, spec, EngineConfig(batch_size=4, rate=2.0), monkeypatch, f"profiled cost {spec}")


def test_short_held_list(prep, monkeypatch):
    """A stretch also ends when the engine's held-step list is full (HELD_MAX)."""
    monkeypatch.setattr(engine_mod, "HELD_MAX", 3)
    _check(prep.tables, prep, "hybrid-price", EngineConfig(batch_size=4), monkeypatch, "HELD_MAX 3")


def test_declined_batches(prep, monkeypatch):
    """NaN model confidences: the fast form declines those batches and the definition runs (Engine.decide)."""
    tb = prep.tables
    m_conf = tb.m_conf.copy()
    m_conf[::7, 1] = np.nan
    _check(dataclasses.replace(tb, m_conf=m_conf), prep, "hybrid-price", EngineConfig(batch_size=4), monkeypatch,
           "NaN confidences")


def test_over_admitting_policy(prep, monkeypatch):
    """A policy with no fast form that admits one token more than a chain holds: the same first violation."""
    base = sim_policy("model-fixed:4")

    def greedy(batch):
        a = base.fn(batch)
        return Allocation(a.chain, a.admitted + (a.admitted > 0).long(), a.second)

    pol = dataclasses.replace(base, fn=greedy)
    on = _check(prep.tables, prep, pol, EngineConfig(batch_size=4), monkeypatch, "over-admitting")
    assert not on[1].lossless and "more draft tokens than its chain holds" in on[1].violation


def test_gates(prep, monkeypatch):
    """A subclass overriding a hook the stretch stands in for, HYBRIDSPEC_REFERENCE_ENGINE and streamed tables
    step every step."""
    cfg = EngineConfig(batch_size=4)
    pol = sim_policy("hybrid-price")
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "0")
    assert stretch_ok(Engine(prep.tables, prep.arrivals, pol, prep.cost, cfg))

    class Hooked(Engine):
        def _charge(self, *a, **kw):
            return super()._charge(*a, **kw)

    assert not stretch_ok(Hooked(prep.tables, prep.arrivals, pol, prep.cost, cfg))
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1")
    assert not stretch_ok(Engine(prep.tables, prep.arrivals, pol, prep.cost, cfg))
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "0")
    ng = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)
    reqs = random_requests(np.random.default_rng(0), 6)
    streamed = StreamingTables(reqs, ng, ModelDrafterProfile(name="t", block=4), plausible_calibrator(ng), seed=0)
    assert not stretch_ok(Engine(streamed, np.zeros(len(reqs)), pol, LinearCost(), cfg))
