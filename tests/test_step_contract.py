"""The step contract (sim/core/policies/base.py): plan on the host from a HostView, propose only the planned
drafters, allocate on the device with the Plan. A plan is host values; a skipped drafter's chain is never read
nor proposed nor charged; a policy's one-view fn is its two phases; the simulator engine runs the phases in
order (its numpy step, the definition the real engine shares)."""
import dataclasses

import numpy as np
import pytest
import torch

from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.core.policies.base import HostView, Plan, host_view
from sim.core.policies.testing import random_batch, replace_chain
from sim.api.run import SimSetup, prepare

PHASED = ["adaptive", "hybrid", "hybrid:forecast=min", "hybrid:hyst=0.2:margin=0.5", "hybrid:fixed-point",
          "hybrid-price", "hybrid-price:model-opt", "hybrid-price:fixed-point", "hybrid-price:margin=0"]


def _batches(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        R = int(rng.choice([1, 3, 4, 17, 64]))
        b = random_batch(rng, R, int(rng.choice([3, 7])), int(rng.choice([4, 32])), max_tokens=R * 40 + 2)
        b = dataclasses.replace(b, draft_ms_of={**b.draft_ms_of, "dspark": float(rng.uniform(0, b.draft_cost_ms))},
                                means={**b.means,
                                       "ngram": torch.tensor(rng.random(tuple(b.chains["ngram"][0].shape)))})
        yield b


@pytest.mark.parametrize("spec", PHASED)
def test_fn_is_plan_then_allocate_and_the_plan_is_host_values(spec):
    pol = sim_policy(spec)
    assert pol.phased
    for b in _batches(60, 1):
        plan = pol.plan(host_view(b))
        assert type(plan.drafters) is frozenset and plan.drafters <= set(pol.drafters)
        assert plan.budget is None or (plan.budget.device.type == "cpu" and plan.budget.dim() == 0)
        a, want = pol.allocate(b, plan), pol.fn(b)
        assert torch.equal(a.chain, want.chain) and torch.equal(a.admitted, want.admitted)


@pytest.mark.parametrize("spec", ["hybrid", "hybrid:hyst=0.2:margin=0.5", "hybrid:fixed-point"])
def test_a_skipped_model_pass_is_never_read(spec):
    """Where hybrid's plan skips the model pass, its allocate gives the same answer with the model chains
    poisoned (NaN confidences, any length): they were not drafted. Both kinds of plan occur."""
    pol = sim_policy(spec)
    kinds = set()
    for b in _batches(200, 2):
        plan = pol.plan(host_view(b))
        kinds.add(plan.runs("dspark"))
        if plan.runs("dspark"):
            continue
        poisoned = replace_chain(b, "dspark", conf=torch.full_like(b.chains["dspark"][0], float("nan")),
                                 length=torch.full_like(b.chains["dspark"][1], b.chains["dspark"][0].shape[1]))
        a, p = pol.allocate(b, plan), pol.allocate(poisoned, plan)
        assert torch.equal(a.chain, p.chain) and torch.equal(a.admitted, p.admitted)
        assert not (a.chain == 1).any()  # no model slot
    assert kinds == {True, False}


def test_single_phase_policies_plan_every_drafter_they_use():
    for spec, want in (("none", (False, False)), ("model-fixed:3", (True, False)), ("ngram-fixed:8", (False, True)),
                       ("ngram-first", (True, True)), ("oracle", (True, True)), ("hybrid-tree", (True, True))):
        pol = sim_policy(spec)
        assert not pol.phased
        b = next(_batches(1, 3))
        plan = pol.plan(host_view(b))
        assert (plan.runs("dspark"), plan.runs("ngram")) == want and plan.budget is None, spec


def test_a_copy_with_a_replaced_fn_is_single_phase():
    """Tests inject bugs with dataclasses.replace(pol, fn=...): the engine must then run that fn, not the
    policy's own phases."""
    pol = sim_policy("hybrid")
    bad = dataclasses.replace(pol, fn=lambda b: pol.fn(b))
    assert pol.phased and not bad.phased and bad.plan(host_view(next(_batches(1, 4)))) == Plan(frozenset(("dspark", "ngram")))


class _Phases(Engine):
    """The numpy step (a subclass overriding the hooks runs the definition), recording each phase."""

    def _plan(self, view):
        assert isinstance(view, HostView)
        plan = super()._plan(view)
        self.log.append(["plan", plan])
        return plan

    def _propose(self, reqs, rows, plan):
        chains = super()._propose(reqs, rows, plan)
        self.log[-1] += ["propose", chains]
        return chains

    def _allocate(self, batch, plan):
        self.log[-1].append("allocate")
        return super()._allocate(batch, plan)


def test_engine_plans_before_it_proposes_only_the_planned_drafters():
    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=10, seed=3))
    skipped = 0
    for spec in ("hybrid", "adaptive", "hybrid-price"):
        eng = _Phases(prep.tables, prep.arrivals, sim_policy(spec), prep.cost, EngineConfig(batch_size=4))
        eng.log = []
        res = eng.run()
        assert res.lossless, res.violation
        dec = res.steps["num_decode"] > 0
        assert len(eng.log) == dec.sum()
        for (tag, plan, tag2, chains, tag3), draft_ms in zip(eng.log, res.steps["draft_ms"][dec]):
            assert (tag, tag2, tag3) == ("plan", "propose", "allocate")
            if not plan.runs("dspark"):
                skipped += 1
                assert (chains["model_len"] == 0).all() and draft_ms == 0.0
            if not plan.runs("ngram"):
                assert (chains["ngram_len"] == 0).all()
            if spec == "adaptive":
                assert not plan.runs("ngram") and plan.budget is not None
    assert skipped > 0


def test_each_drafter_prices_itself_through_the_registry(monkeypatch):
    """The engine quotes a table drafter's price from its registry entry (DrafterSpec.price), not from a cost-model
    method named for it: a changed entry changes the view's price of that drafter and of no other."""
    from sim.core.drafters import registry
    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=4, seed=3))
    pol = sim_policy("hybrid-price")
    eng = Engine(prep.tables, prep.arrivals, pol, prep.cost, EngineConfig(batch_size=4))
    before = eng.step_prices(3)
    assert before.draft == prep.cost.draft_ms(3, prep.tables.k_model) and before.ngram == prep.cost.ngram_ms(3)
    spec = registry.drafters()["ngram"]
    monkeypatch.setitem(registry._REGISTRY, "ngram", dataclasses.replace(spec, price=lambda R, cost, p: 0.125 * R))
    after = Engine(prep.tables, prep.arrivals, pol, prep.cost, EngineConfig(batch_size=4)).step_prices(3)
    assert (after.draft, after.ngram) == (before.draft, 0.375)
