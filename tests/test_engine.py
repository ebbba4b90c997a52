"""Engine invariants on random traces: every token emitted exactly once, lossless, preemption-safe."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import LinearCost, random_requests
from sim.drafters.calibration import _KNOTS, NgramCalibrator
from sim.drafters.model import ModelDrafterProfile
from sim.drafters.ngram import NgramConfig
from sim.drafters.tables import build_draft_tables
from sim.engine import Engine, EngineConfig, LosslessError
from sim.errors import ConfigError
from sim.policies import get_policy

POLICIES = ["none", "model-fixed:3", "ngram-fixed:4", "adaptive", "ngram-first", "suffix-threshold", "hybrid-price",
            "hybrid-tree", "oracle"]
CFG = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)
PROFILE = ModelDrafterProfile(name="t", block=4)


def _calib():
    # a fixed, plausible calibrator: acceptance rises with the match length, falls with depth
    w = np.zeros(len(_KNOTS) + 11)
    w[0], w[1], w[1 + len(_KNOTS)] = -0.5, 1.0, -0.3
    return NgramCalibrator(w, CFG)


def _tables(reqs, seed=0):
    return build_draft_tables(reqs, CFG, PROFILE, _calib(), seed=seed)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.integers(1, 6), policy=st.sampled_from(POLICIES),
       kv=st.sampled_from([None, 400, 900]), budget=st.sampled_from([8192, 48]))
def test_every_token_once_and_lossless(seed, bs, policy, kv, budget):
    rng = np.random.default_rng(seed)
    reqs = random_requests(rng, int(rng.integers(1, 8)))
    tb = _tables(reqs, seed)
    arrivals = np.sort(rng.uniform(0, 0.05, len(reqs))) if seed % 2 else np.zeros(len(reqs))
    cfg = EngineConfig(batch_size=bs, kv_capacity_tokens=kv, max_num_batched_tokens=budget)
    try:
        res = Engine(tb, arrivals, get_policy(policy), LinearCost(), cfg).run()
    except ConfigError as e:  # a request that can never fit the tiny cache is refused up front
        assert kv is not None and "can never run" in str(e)
        return
    assert res.lossless
    out = res.requests
    assert (out["finish_s"] >= out["first_token_s"]).all()
    assert (out["first_token_s"] >= out["arrival_s"]).all()
    st_ = res.steps
    # emitted tokens add up to the trace's output tokens exactly
    assert st_["emitted"].sum() == sum(r.output_len for r in reqs)
    assert (st_["accepted_model"] <= st_["verified_model"]).all()
    assert (st_["accepted_ngram"] <= st_["verified_ngram"]).all()
    # never more running than the batch size
    assert (st_["num_decode"] <= bs).all()


def test_preemption_happens_and_stays_lossless():
    rng = np.random.default_rng(5)
    reqs = random_requests(rng, 6, max_prompt=60, max_out=120)
    tb = _tables(reqs)
    cap = int(max(r.prompt_len + r.output_len for r in reqs)) + 64
    res = Engine(tb, np.zeros(len(reqs)), get_policy("hybrid-price"), LinearCost(),
                 EngineConfig(batch_size=6, kv_capacity_tokens=cap)).run()
    assert res.lossless
    assert res.requests["preemptions"].sum() > 0


def test_oracle_emits_at_least_as_much_per_step_as_adaptive():
    rng = np.random.default_rng(2)
    reqs = random_requests(rng, 6, max_out=200)
    tb = _tables(reqs)
    steps = {}
    for p in ("adaptive", "oracle", "none"):
        res = Engine(tb, np.zeros(len(reqs)), get_policy(p), LinearCost(), EngineConfig(batch_size=2)).run()
        steps[p] = res.requests["decode_steps"].sum()
    assert steps["oracle"] <= steps["adaptive"] < steps["none"]


def test_host_sync_adds_a_bubble():
    rng = np.random.default_rng(3)
    reqs = random_requests(rng, 3)
    tb = _tables(reqs)
    pol = get_policy("none")
    a = Engine(tb, np.zeros(3), pol, LinearCost(), EngineConfig(batch_size=3)).run()
    s = Engine(tb, np.zeros(3), pol, LinearCost(), EngineConfig(batch_size=3, async_scheduling=False)).run()
    assert s.sim_time_s > a.sim_time_s
    assert s.steps["bubble_ms"].sum() > 0


def test_corrupted_tables_are_caught():
    rng = np.random.default_rng(4)
    reqs = random_requests(rng, 2, copy=True)
    tb = _tables(reqs)
    hit = np.nonzero(tb.ng_acc > 0)[0]
    if len(hit) == 0:
        pytest.skip("no n-gram hit in this draw")
    tb.ng_start[hit] = np.maximum(tb.ng_start[hit] - 1, 0)  # point the copies at the wrong source
    tb.ng_acc[hit] = np.maximum(tb.ng_acc[hit], 3)
    with pytest.raises(LosslessError):
        Engine(tb, np.zeros(2), get_policy("ngram-fixed:6"), LinearCost(), EngineConfig(batch_size=2)).run()


def test_request_that_never_fits_is_refused():
    rng = np.random.default_rng(6)
    reqs = random_requests(rng, 2)
    with pytest.raises(ConfigError, match="can never run"):
        Engine(_tables(reqs), np.zeros(2), get_policy("none"), LinearCost(), EngineConfig(kv_capacity_tokens=8))
