"""Online recalibration (sim/core/drafters/recalibration.py, the `recal=k` option of hybrid / hybrid-price): the update's
invariants, the policy wrapper (one code path, no fast form), and the engine keeping the state on the definitions."""
import dataclasses

import numpy as np
import pytest
import torch

from sim.core.drafters.recalibration import observe, recalibrate, recalibrated
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy
from sim.core.policies.base import host_view
from sim.core.policies.testing import random_batch


def _obs(conf, length, acc, e, b=0.0, P=4.0):
    R = len(length)
    return observe(torch.full((R,), b, dtype=torch.float64), torch.full((R,), P, dtype=torch.float64),
                   torch.tensor(conf, dtype=torch.float32), torch.tensor(length), torch.tensor(acc), torch.tensor(e))


def test_the_update_moves_the_offset_the_way_the_evidence_says():
    conf = [[0.6, 0.6, 0.6, 0.6]] * 4
    # rows: nothing observed (e = 0), all 4 accepted, first rejected, 2 accepted then rejected
    b, P = _obs(conf, [4, 4, 4, 4], [0, 4, 0, 2], [0, 5, 1, 3])
    assert b[0] == 0.0 and P[0] == 4.0  # no slot observed: unchanged
    assert b[1] > 0 and b[2] < 0  # accepted beyond expectation raises it, a first rejection lowers it
    assert (P[1:] > 4.0).all()  # the posterior only sharpens
    # 2 + 1 observed (2 accepted at p = 0.6, then a rejection): g = 2 - 1.8 = 0.2, h = 0.72
    assert b[3].item() == pytest.approx(0.2 / 4.72)
    # evidence caps what is seen: the same chain with only the bonus token emitted sees slot 1 alone
    b1, P1 = _obs(conf[:1], [4], [4], [1])
    assert P1.item() == pytest.approx(4.0 + 0.24) and b1.item() == pytest.approx(0.4 / 4.24)
    # |step| <= m / k, and repeated all-accepted evidence saturates: each step adds less
    b, P, steps = torch.zeros(1, dtype=torch.float64), torch.full((1,), 1.0, dtype=torch.float64), []
    for _ in range(30):
        nb, P = observe(b, P, torch.tensor([[0.6] * 4]), torch.tensor([4]), torch.tensor([4]), torch.tensor([5]))
        steps.append((nb - b).item())
        b = nb
    assert all(0 < s <= 4.0 for s in steps) and steps[-1] < steps[0] / 10


def test_recalibrate_keeps_0_and_1_and_is_monotone():
    conf = torch.tensor([[0.0, 0.2, 0.5, 0.9, 1.0]])
    assert torch.allclose(recalibrate(conf, torch.zeros(1)), conf, atol=1e-6)
    up = recalibrate(conf, torch.tensor([1.5]))
    assert up[0, 0] == 0.0 and up[0, -1] == 1.0 and (up[0, 1:4] > conf[0, 1:4]).all()
    assert (up[0, 1:] >= up[0, :-1]).all() and up.dtype == conf.dtype
    assert recalibrate(conf, None) is conf


def _batch(seed, offsets=True):
    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 9))
    b = random_batch(rng, R, 7, 16, max_tokens=int(rng.choice([64, 400])))
    d = float(b.draft_cost_ms)
    b = dataclasses.replace(b, means={**b.means, "ngram": b.chains["ngram"][0].clone()},
                            draft_ms_of={**b.draft_ms_of, "dspark": d * 0.5, "ngram": d * 0.05})
    if offsets:
        off = lambda: torch.tensor(rng.normal(0, 2, size=R))  # noqa: E731
        b = dataclasses.replace(b, recal={"dspark": off(), "ngram": off()}, stale_recal={"dspark": off(), "ngram": off()})
    return b


def test_the_policy_is_the_plain_policy_on_recalibrated_views():
    for spec in ("hybrid", "hybrid-price"):
        plain, rec = sim_policy(spec), sim_policy(spec + ":recal=4")
        assert rec.recal == 4.0 and rec.name == spec + ":recal=4" and rec.sim_fn is None and plain.sim_fn is not None
        for seed in range(40):
            b = _batch(seed)
            p = rec.plan(host_view(b))
            want_p = plain.plan_fn(recalibrated(host_view(b)))  # the HostView's offsets: one step older
            assert (p.drafters, int(p.budget)) == (want_p.drafters, int(want_p.budget))
            got, want = rec.allocate(b, p), plain.alloc_fn(recalibrated(b), p)
            assert torch.equal(got.chain, want.chain) and torch.equal(got.admitted, want.admitted)
            one = rec.fn(b)
            assert torch.equal(one.chain, got.chain) and torch.equal(one.admitted, got.admitted)
            twice = recalibrated(recalibrated(b))  # idempotent: the offsets are spent
            assert torch.equal(twice.chains["ngram"][0], recalibrated(b).chains["ngram"][0]) and not twice.recal
        # without offsets the views are the plain ones
        b = _batch(0, offsets=False)
        assert torch.equal(rec.fn(b).admitted, plain.fn(b).admitted)


def test_recal_over_three_drafters_and_bad_values():
    pol = sim_policy("hybrid:recal=2.5", "dspark,ngram,suffix")
    assert pol.recal == 2.5 and pol.drafters == ("dspark", "ngram", "suffix")
    for bad in ("hybrid:recal=0", "hybrid:recal=x", "hybrid-price:recal=-1"):
        with pytest.raises(ConfigError, match="recal"):
            sim_policy(bad)


def test_the_engine_keeps_the_state_and_runs_the_definitions():
    from sim.engine.engine import Engine, EngineConfig
    from sim.api.run import SimSetup, prepare

    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=6, seed=0))
    eng = Engine(prep.tables, prep.arrivals, sim_policy("hybrid:recal=4"), prep.cost, EngineConfig(batch_size=4))
    assert eng.native_step() is None and eng.array_form() is None  # no fast form ignores the recalibration
    res = eng.run()
    assert res.lossless, res.violation
    st = eng.recal
    assert st.names == ("dspark", "ngram") and (st.P >= 4.0).all() and (st.P > 4.0).any()
    # code edits copy more than general text: the n-gram drafter's offsets end up raised on the whole
    assert st.b[:, 1].mean() > 0
    plain = Engine(prep.tables, prep.arrivals, sim_policy("hybrid"), prep.cost, EngineConfig(batch_size=4))
    assert plain.recal is None and plain.run().lossless


def test_a_run_starts_from_a_given_run_level_state():
    """--runcal-start (a real run's state after its warm-up): the run-level offsets start there, not at the prior,
    which changes what the policy publishes from the first step; per-request recalibration and policies without it
    refuse the option in one line."""
    from sim.api.run import SimSetup, prepare, run_one
    from sim.core.drafters.recalibration import parse_runcal_start, runcal_start_of
    from sim.engine.engine import Engine, EngineConfig

    assert parse_runcal_start(" dspark=-0.5/90 , ngram=0.25/70") == "dspark=-0.5/90.0,ngram=0.25/70.0"
    assert runcal_start_of(parse_runcal_start("ngram=1/2")) == {"ngram": (1.0, 2.0)}
    for bad in ("dspark=-0.5", "dspark=x/3", "dspark=0/0", "dspark=0/-1", "=0/1", "dspark=inf/1",
                "dspark=0/1,dspark=0/2"):
        with pytest.raises(ConfigError, match="--runcal-start"):
            parse_runcal_start(bad)
    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=6, seed=0, scheduler="vllm"))
    start = parse_runcal_start("dspark=-1.5/90,ngram=0.75/80")
    cfg = EngineConfig(batch_size=4, scheduler="vllm", runcal_start=start)
    eng = Engine(prep.tables, prep.arrivals, sim_policy("hybrid-vllm:runcal=64"), prep.cost, cfg)
    assert eng.recal.b.tolist() == [[-1.5, 0.75]] and eng.recal.P.tolist() == [[90.0, 80.0]]
    assert eng.recal.b_host.tolist() == [[-1.5, 0.75]]  # the host plans its first step from the same state
    primed = run_one(dataclasses.replace(prep, setup=dataclasses.replace(prep.setup, runcal_start=start)),
                     "hybrid-vllm:runcal=64", 4)[1]
    fresh = run_one(prep, "hybrid-vllm:runcal=64", 4)[1]
    assert primed.lossless and fresh.lossless
    assert not np.array_equal(primed.steps["tokens"], fresh.steps["tokens"])  # another budget from step one
    for pol, sched, msg in (("hybrid:recal=4", "hybridspec", "this policy's is per request"),
                            ("hybrid-vllm", "vllm", "for a policy with runcal")):
        with pytest.raises(ConfigError, match=msg):
            Engine(prep.tables, prep.arrivals, sim_policy(pol), prep.cost, dataclasses.replace(cfg, scheduler=sched))
    with pytest.raises(ConfigError, match="recalibrates dspark, ngram, not suffix"):
        Engine(prep.tables, prep.arrivals, sim_policy("hybrid-vllm:runcal=64"), prep.cost,
               dataclasses.replace(cfg, runcal_start="suffix=0.0/1.0"))
