"""The vLLM plugin's own step in the simulator's cost (sim/core/cost/profiled.py "plugin", CostModel.plugin_ms): the
field round-trips and is checked in one line, the plugin's policy pays it (less what the draft table holds) in
every engine form alike, and other policies and tables without the field pay nothing."""
import dataclasses

import numpy as np
import pytest

from real.vllm_plugin.timing import StepClock, table_field
from sim.api.run import SimSetup, prepare
from sim.core.cost.profiled import ProfiledCost, cost_table_from_dict, plugin_fit, tables_from_cost_model
from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.infra.errors import ConfigError

TABLE = {"llm": "qwen3-8b", "gpu": "h100-sxm", "verify": {"num_tokens": [1, 64], "ms": [5.0, 6.0]}}


def test_the_plugin_field_round_trips_and_is_checked_in_one_line():
    field = {"a_ms": 0.25, "b_ms_per_req": 0.01, "steps": 40, "in_draft": {"a_ms": 0.1, "b_ms_per_req": 0.002}}
    t = cost_table_from_dict({**TABLE, "plugin": field}, "t.json")
    assert cost_table_from_dict(t.to_json()).plugin == t.plugin == field
    c = ProfiledCost(t)
    assert c.plugin_ms(0) == 0.0
    assert c.plugin_ms(8) == pytest.approx(0.25 + 0.08 - (0.1 + 0.016))
    # no in_draft: the whole line; an in_draft above the live line: nothing (never negative)
    assert ProfiledCost(cost_table_from_dict({**TABLE, "plugin": {"a_ms": 0.2, "b_ms_per_req": 0.0}})).plugin_ms(3) \
        == pytest.approx(0.2)
    over = {"a_ms": 0.1, "b_ms_per_req": 0.0, "in_draft": {"a_ms": 0.3, "b_ms_per_req": 0.0}}
    assert ProfiledCost(cost_table_from_dict({**TABLE, "plugin": over})).plugin_ms(3) == 0.0
    assert ProfiledCost(cost_table_from_dict(TABLE)).plugin_ms(8) == 0.0  # a table without the field: 0
    bad = [({"a_ms": 0.1}, "must be an object with a_ms and b_ms_per_req"),
           ({"a_ms": -1, "b_ms_per_req": 0}, "plugin.a_ms' must be a number in 0"),
           ({"a_ms": 1, "b_ms_per_req": 0, "slope": 2}, "must be an object"),
           ({"a_ms": 1, "b_ms_per_req": 0, "in_draft": {"a_ms": 1}}, "'plugin.in_draft' must be an object"),
           ({"a_ms": 1, "b_ms_per_req": 0, "steps": 0}, "plugin.steps' must be an integer in 1"),
           ("fast", "must be an object")]
    for v, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            cost_table_from_dict({**TABLE, "plugin": v}, "t.json")
        assert "\n" not in str(e.value) and "t.json" in str(e.value)


def test_the_fit_is_the_least_squares_line_kept_monotone():
    assert plugin_fit([(1, 0.3), (2, 0.4), (4, 0.6)]) == {"a_ms": 0.2, "b_ms_per_req": 0.1, "steps": 3}
    assert plugin_fit([(1, 0.5), (4, 0.2)]) == {"a_ms": 0.35, "b_ms_per_req": 0.0, "steps": 2}  # falling: the mean
    got = plugin_fit([(2, 0.1), (4, 0.5)])  # a < 0: the line through the origin
    assert got["a_ms"] == 0.0 and got["b_ms_per_req"] == pytest.approx(2.2 / 20)
    assert plugin_fit([(3, 0.7)]) == {"a_ms": 0.7, "b_ms_per_req": 0.0, "steps": 1}
    assert plugin_fit([]) is None and plugin_fit([(0, 1.0)]) is None


def test_the_clock_keeps_live_and_profiling_steps_apart_and_makes_the_table_field():
    """On the CPU the clock is the wall clock around each segment; a step's sample is the sum of its segments,
    kept by kind; a discarded step (an observe with no live propose after it) leaves nothing."""
    c = StepClock("cpu")
    for R in (1, 2, 4):
        for _ in range(2):  # two segments: observe and the chain choice
            t = c.start()
            sum(range(2000 * R))
            c.stop(t)
        c.commit(R)
    t = c.start()
    c.stop(t)
    c.discard()
    t = c.start("profiled")
    c.stop(t)
    c.commit(4, "profiled")
    live, prof = c.samples(), c.samples("profiled")
    assert [r for r, _ in live] == [1, 2, 4] and all(ms > 0 for _, ms in live) and [r for r, _ in prof] == [4]
    st = c.stats()
    assert st["live"]["fit"] == plugin_fit(live) and st["profiled"]["fit"]["steps"] == 1
    field = table_field({"workers": [{"loaded": True, "plugin_ms": st}]})["plugin"]
    assert field["in_draft"] == st["profiled"]["fit"] and field["a_ms"] == st["live"]["fit"]["a_ms"]
    assert cost_table_from_dict({**TABLE, **table_field({"workers": [{"plugin_ms": st}]})}).plugin is not None
    assert table_field(None) == {} and table_field({"workers": [{"loaded": False}]}) == {}
    capped = StepClock("cpu", capacity=2)
    for R in (1, 2, 3):
        t = capped.start()
        capped.stop(t)
        capped.commit(R)
    assert [r for r, _ in capped.samples()] == [2, 3]  # the newest `capacity` steps


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=10, seed=5))


def _profiled(prep, plugin=None):
    """prep's cost as a profiled table (roofline-sampled verify and draft, the rest from the roofline), with or
    without a "plugin" field."""
    d = tables_from_cost_model(prep.cost).to_json()
    if plugin is not None:
        d["plugin"] = plugin
    return ProfiledCost(cost_table_from_dict(d), fallback=prep.cost)


def _run(prep, spec, cost):
    eng = Engine(prep.tables, prep.arrivals, sim_policy(spec), cost, EngineConfig(batch_size=4, scheduler="vllm"))
    return eng.run()


@pytest.mark.parametrize("spec", ["hybrid-vllm", "hybrid-vllm:slots=16:skip"])
def test_the_plugins_policy_pays_its_step_in_every_engine_form(prep, spec, monkeypatch):
    """With the field, every decoding step of a plugin policy pays a + b R more allocation time and its step
    grows (ms = max(gpu, cpu)); the fast forms and the reference engine agree bit for bit; adaptive pays nothing."""
    field = {"a_ms": 0.3, "b_ms_per_req": 0.05}
    base, charged = _profiled(prep), _profiled(prep, field)
    r0, r1 = _run(prep, spec, base), _run(prep, spec, charged)
    assert r0.lossless and r1.lossless
    dec = np.asarray(r1.steps["num_decode"])
    assert (dec > 0).sum() > 10
    pol = sim_policy(spec)
    alloc = np.asarray([base.alloc_ms(int(R), policy=pol.name, adaptive=True) if R else 0.0 for R in dec])
    assert np.allclose(np.asarray(r1.steps["alloc_ms"]) - alloc, np.where(dec > 0, 0.3 + 0.05 * dec, 0.0), atol=1e-9)
    assert np.allclose(np.asarray(r0.steps["alloc_ms"]), [base.alloc_ms(int(R), policy=pol.name, adaptive=True)
                                                         if R else 0.0 for R in r0.steps["num_decode"]])
    assert np.sum(r1.steps["step_ms"]) > np.sum(r0.steps["step_ms"])
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1")
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_POLICIES", "1")
    ref = _run(prep, spec, charged)
    for k, v in r1.steps.items():
        assert np.asarray(v).tobytes() == np.asarray(ref.steps[k]).tobytes(), f"step column {k} differs"
    monkeypatch.delenv("HYBRIDSPEC_REFERENCE_ENGINE")
    monkeypatch.delenv("HYBRIDSPEC_REFERENCE_POLICIES")
    a0, a1 = _run(prep, "adaptive", base), _run(prep, "adaptive", charged)
    assert np.asarray(a0.steps["alloc_ms"]).tobytes() == np.asarray(a1.steps["alloc_ms"]).tobytes()


def test_only_the_plugins_policies_say_they_run_as_the_plugin():
    assert sim_policy("hybrid-vllm").runs_plugin and sim_policy("hybrid-vllm:slots=32:skip").runs_plugin
    for spec in ("adaptive", "hybrid", "vllm-ngram:7", "none", "model-fixed:7"):
        assert not sim_policy(spec).runs_plugin, spec
    p = sim_policy("hybrid-vllm")
    assert dataclasses.replace(p, vllm=None).runs_plugin is False


def test_the_skip_residual_is_charged_every_step_and_is_not_saved_by_a_skip(prep, monkeypatch):
    """The plugin's skip table ("skip"): what DSpark's step still costs when its block pass is skipped. A plugin
    policy pays it every step (in alloc) and DSpark's pass price is the rest, so a skipped step still pays it and
    the skip's forecast saves draft - skip (as HybridDrafter.plan_skip prices it); with a residual as large as the
    pass nothing is saved and the skip never fires; adaptive and tables without the field are unchanged."""
    assert table_field({"workers": [{"skip_table": [0.0, 1.5, 2.0]}]}) == \
        {"skip": {"num_reqs": [1, 2], "ms": [1.5, 2.0]}}
    assert table_field({"workers": [{"skip_table": None}]}) == {}
    d = tables_from_cost_model(prep.cost).to_json()
    d["draft"]["ms"] = [20 * x for x in d["draft"]["ms"]]  # a dear pass: the skip pays often
    full = ProfiledCost(cost_table_from_dict(d), fallback=prep.cost)
    big = {"num_reqs": [1, 256], "ms": [1e4, 1e4]}  # at least the pass: a skip saves nothing
    t = cost_table_from_dict({**d, "skip": big})
    assert cost_table_from_dict(t.to_json()).skip == t.skip
    held = ProfiledCost(t, fallback=prep.cost)
    assert full.skip_residual_ms(4) == 0.0 and held.skip_residual_ms(4) == 1e4
    spec = "hybrid-vllm:slots=16:skip"
    e0 = Engine(prep.tables, prep.arrivals, sim_policy(spec), full, EngineConfig(batch_size=4, scheduler="vllm"))
    e1 = Engine(prep.tables, prep.arrivals, sim_policy(spec), held, EngineConfig(batch_size=4, scheduler="vllm"))
    p0, p1 = e0.step_prices(4), e1.step_prices(4)
    assert p1.draft == 0.0 and p1.alloc == pytest.approx(p0.alloc + p0.draft)  # all of DSpark's step stays
    assert p1.total() == pytest.approx(p0.total())  # vLLM's budget sees the same drafting cost
    from sim.core.policies import hybrid
    from sim.core.policies.base import MODEL

    plan, skips = hybrid.plan_hybrid_vllm_skip, []

    def counted(view, *a, **k):
        p = plan(view, *a, **k)
        skips[-1] += MODEL not in p.drafters
        return p
    monkeypatch.setattr(hybrid, "plan_hybrid_vllm_skip", counted)
    for e in (e0, e1):
        skips.append(0)
        assert e.run().lossless
    assert skips[0] > 20 * max(skips[1], 1), skips  # (a rare skip stays: the chain choice is a heuristic)
    a0 = Engine(prep.tables, prep.arrivals, sim_policy("adaptive"), full, EngineConfig(batch_size=4)).run()
    a1 = Engine(prep.tables, prep.arrivals, sim_policy("adaptive"), held, EngineConfig(batch_size=4)).run()
    assert np.asarray(a0.steps["step_ms"]).tobytes() == np.asarray(a1.steps["step_ms"]).tobytes()
