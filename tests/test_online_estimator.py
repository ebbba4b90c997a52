"""vLLM's online acceptance estimator, simulated (sim/core/drafters/acceptance_estimator.py), the policy that runs
adaptive verification on it (`adaptive:online`), vLLM's dynamic speculation length (`dyn=`,
num_speculative_tokens_per_batch_size) and how --speculative-config reaches both: the refit recovers known
coefficients, only verified slots are evidence, nothing on the allocation path reads a tensor on the host, the engine
keeps the estimator and hands the policy its coefficients, and what vLLM does not have is one line, exit 2."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_cli_inprocess
from sim.core.drafters import acceptance_estimator as ae
from sim.core.policies import get_policy
from sim.core.policies.adaptive import (alloc_online, allocate_adaptive, allocate_online, plan_adaptive,
                                        plan_online)
from sim.core.policies.base import host_view
from sim.core.policies.testing import random_batch, replace_chain
from sim.core.scheduler import SCHEDULED, SlotCharge
from sim.core.vllm import speculative_config
from sim.infra.errors import ConfigError

TINY = "tests/fixtures/sim/tiny.jsonl"


# ------------------------------------------------------------------------------------------------ the estimator
def _chains(rng: np.random.Generator, coef: np.ndarray, rows: int, k: int):
    """Chains drawn from the estimator's own model: features f ~ N(0.5, 1.5), slot j accepted with probability
    sigmoid(w f_j + b_j) given the slots before it were; every slot admitted. Returns (conf, admitted, accepted)."""
    f = rng.normal(0.5, 1.5, size=(rows, k))
    p = 1.0 / (1.0 + np.exp(-(coef[0] * f + coef[1:1 + k])))
    acc = np.cumprod(rng.random((rows, k)) < p, axis=1).sum(1)
    conf = torch.sigmoid(torch.from_numpy(f))  # q with logit(q) = f
    return conf, torch.full((rows,), k, dtype=torch.int64), torch.from_numpy(acc)


def test_the_refit_recovers_known_coefficients():
    """Rounds of chains drawn with w = 1.3 and intercepts 0.9, 0.3, -0.2, -0.6 (K = 4): from vLLM's cold start
    (0.5, -0.2) the damped Newton refits reach them within a few rounds, then move only by each round's sampling
    noise (one Newton step per round of fresh data), so the last rounds' mean sits on them."""
    rng = np.random.default_rng(0)
    truth = np.array([1.3, 0.9, 0.3, -0.2, -0.6])
    st = ae.EstimatorState(4, interval=1)
    assert torch.equal(st.coef, ae.cold_start(4)) and st.coef[0] == 0.5 and (st.coef[1:] == -0.2).all()
    seen = []
    for _ in range(40):
        conf, adm, acc = _chains(rng, truth, 4000, 4)
        st.observe(None, {"dspark": (conf, adm)}, {"dspark": acc}, None, admitted={"dspark": adm})
        seen.append(st.coef.numpy().copy())
    assert st.refits == 40
    assert abs(seen[4][0] - 1.3) < 0.15  # five rounds from the cold start's 0.5
    mean = np.mean(seen[20:], axis=0)
    assert abs(mean[0] - 1.3) < 0.03 and np.allclose(mean[1:], truth[1:], atol=0.06), mean


def test_a_refit_waits_for_its_interval_and_damps_thin_positions():
    rng = np.random.default_rng(1)
    st = ae.EstimatorState(3, interval=3)
    conf, adm, acc = _chains(rng, np.array([1.0, 2.0, 2.0, 2.0]), 50, 3)
    for i in range(2):
        st.observe(None, {"dspark": (conf, adm)}, {"dspark": acc}, None, admitted={"dspark": adm})
        assert st.refits == 0 and torch.equal(st.coef, ae.cold_start(3))  # statistics only, until the third step
    st.observe(None, {"dspark": (conf, adm)}, {"dspark": acc}, None, admitted={"dspark": adm})
    assert st.refits == 1 and st.steps == 0 and not st.stats.any()  # refit, and the round starts afresh
    assert torch.equal(st.coef_host, ae.cold_start(3))  # the host's coefficients: one step older
    # a position nobody reached keeps its intercept (n = 0: no step), an empty round moves nothing
    st2 = ae.EstimatorState(3, interval=1)
    st2.observe(None, {"dspark": (conf, adm)}, {"dspark": torch.zeros(50, dtype=torch.int64)}, None,
                admitted={"dspark": adm})  # every chain rejected at slot 0: slots 1, 2 never seen
    assert st2.coef[2] == st2.coef[3] == -0.2 and st2.coef[1] < -0.2
    before = st2.coef.clone()
    st2.observe(None, {}, {}, None, admitted={})
    assert torch.equal(st2.coef, before)


def test_the_slope_never_turns_negative():
    """Outcomes that fall as the feature rises (a slope below 0 would fit) leave w at >= 0 (vLLM's guard)."""
    rng = np.random.default_rng(2)
    st = ae.EstimatorState(2, interval=1)
    for _ in range(10):
        conf, adm, acc = _chains(rng, np.array([-2.0, 0.5, 0.5]), 2000, 2)
        st.observe(None, {"dspark": (conf, adm)}, {"dspark": acc}, None, admitted={"dspark": adm})
    assert float(st.coef[0]) >= 0.0


def test_only_verified_slots_are_evidence():
    """vLLM observes the accepted slots and the first rejected one where it was verified; trimmed slots never."""
    coef = ae.cold_start(4)
    conf = torch.full((3, 4), 0.8)
    adm = torch.tensor([0, 2, 3])
    acc = torch.tensor([4, 5, 1])  # the target would accept 4, 5, 1 leading tokens of each chain
    n = ae.statistics(coef, conf, adm, acc)[5]
    # row 0 verified nothing; row 1 verified 2 (both accepted, nothing past them seen); row 2: 1 accepted + 1 rejected
    assert n.tolist() == [2.0, 2.0, 0.0, 0.0]
    g_b = ae.statistics(coef, conf[2:], adm[2:], acc[2:])[4]
    p = float(ae.predict(conf[:1], coef)[0, 0])
    assert torch.allclose(g_b, torch.tensor([1 - p, -p, 0.0, 0.0], dtype=torch.float64), atol=1e-6)


def test_predictions_are_the_logistic_of_the_confidence_logit():
    conf = torch.tensor([[0.5, 0.9, 0.0, 1.0]], dtype=torch.float64)
    cold = ae.predict(conf, None)
    assert cold.dtype == torch.float64
    assert torch.allclose(cold[0, 0], torch.sigmoid(torch.tensor(-0.2, dtype=torch.float64)))
    assert ae.feature(conf)[0, 2:].tolist() == [-40.0, 40.0]  # |logit| clamped at 40: finite, never NaN
    assert 0 < cold[0, 2] < 1e-8 and 1 - 1e-8 < cold[0, 3] < 1
    coef = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert torch.allclose(ae.predict(conf[:, :2], coef), conf[:, :2])  # w = 1, b = 0: the confidence itself


class _HostReads(TorchDispatchMode):
    """Records every aten op that reads a tensor's value on the host or makes a shape from tensor data (what forces
    a device-to-host sync on a GPU)."""

    SYNCS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item", "equal")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(s in str(func) for s in self.SYNCS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_no_host_sync_on_the_allocation_path_nor_the_refit():
    rng = np.random.default_rng(3)
    b = random_batch(rng, 6, 5, 4)
    coef = torch.tensor([0.9, 0.4, 0.2, 0.0, -0.3, -0.5], dtype=torch.float64)
    b = dataclasses.replace(b, estimator={"dspark": coef}, stale_estimator={"dspark": ae.cold_start(5)})
    view = host_view(b)
    plan = plan_online(view)  # the host's phase: its budget is host data by contract
    with _HostReads() as mode:
        alloc = allocate_online(b, plan)
        stats = ae.statistics(coef, b.chains["dspark"][0], alloc.admitted, b.chains["dspark"][1])
        ae.refit(coef, stats)
        ae.estimated(b)
    assert mode.seen == [], mode.seen


def test_the_policy_is_adaptive_verification_on_the_predictions():
    """adaptive:online = adaptive's two phases on the estimator's predictions: the plan from the HostView's (older)
    coefficients, the allocation from the StepBatch's; without coefficients, from the cold start."""
    rng = np.random.default_rng(4)
    pol = get_policy("adaptive:online")
    assert pol.name == "adaptive:online" and pol.adaptive_verification and pol.vllm.estimator and pol.vllm.adaptive
    assert pol.online is not None and pol.recal is None
    for _ in range(20):
        b = random_batch(rng, int(rng.integers(1, 9)), 7, 4)
        new, old = ae.cold_start(7) + 0.3, ae.cold_start(7)
        b = dataclasses.replace(b, estimator={"dspark": new}, stale_estimator={"dspark": old})
        p = pol.plan(host_view(b))
        ref_p = plan_adaptive(dataclasses.replace(replace_chain(
            host_view(b), "dspark", conf=ae.predict(b.stale_chains["dspark"][0], old), stale=True), estimator={}))
        assert torch.equal(p.budget, ref_p.budget)
        got = pol.allocate(b, p)
        ref = allocate_adaptive(replace_chain(b, "dspark", conf=ae.predict(b.chains["dspark"][0], new)), p)
        assert torch.equal(got.admitted, ref.admitted) and torch.equal(got.chain, ref.chain)
        bare = dataclasses.replace(b, estimator={}, stale_estimator={})
        assert torch.equal(alloc_online(bare).admitted, alloc_online(dataclasses.replace(
            bare, estimator={"dspark": ae.cold_start(7)}, stale_estimator={"dspark": ae.cold_start(7)})).admitted)


def test_the_engine_keeps_the_estimator_and_feeds_it():
    """A run keeps one estimator (Policy.online_state, in recalibration's place): it refits at its interval from the
    run's verified slots, the run stays lossless, and the coefficients move away from the cold start."""
    from sim.api.run import SimSetup, prepare
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.policies import sim_policy

    prep = prepare(SimSetup(trace="traces/chat.jsonl", sample=24))
    pol = dataclasses.replace(sim_policy("adaptive:online"), online=lambda k: ae.EstimatorState(k, interval=10))
    eng = Engine(prep.tables, prep.arrivals, pol, prep.cost, EngineConfig(batch_size=8))
    res = eng.run()
    assert res.lossless, res.violation
    assert isinstance(eng.recal, ae.EstimatorState) and eng.recal.refits >= 5
    assert not torch.equal(eng.recal.coef, ae.cold_start(eng.recal.k))
    assert float(eng.recal.coef[0]) > ae.INIT_SLOPE  # the profile's calibrated confidences: w heads for 1
    assert sim_policy("adaptive").online_state(4, 7) is None  # no online state for the plain policy


# ------------------------------------------------------------------------------------------------ dynamic K
def test_dynamic_k_follows_the_last_step_and_vllm_fills_gaps():
    c = SlotCharge(SCHEDULED, drafts=6, per_batch=((1, 4, 8), (6, 10, 3), (20, 30, 0)))
    assert [c.drafts_for(b) for b in (0, 1, 4, 5, 6, 10, 15, 20, 99)] == [6, 6, 6, 6, 3, 3, 3, 0, 0]
    with pytest.raises(ConfigError, match="per_batch.*belong to the 'scheduled' rule"):
        SlotCharge(drafts=3, per_batch=((1, 4, 2),))


def test_a_dynamic_run_schedules_and_verifies_k_of_the_previous_step():
    """model-fixed:7:dyn=1-8@7,9-64@2 at batch 16: after a step that scheduled more than 8 requests, every decoding
    request is scheduled and verified 1 + 2 tokens; lossless; a plain run under vLLM's charge verifies 1 + 7."""
    from sim.api.run import SimSetup, prepare
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.policies import sim_policy

    prep = prepare(SimSetup(trace="traces/chat.jsonl", sample=24))
    per = {}
    for spec in ("model-fixed:7", "model-fixed:7:dyn=1-8@7,9-64@2"):
        cfg = EngineConfig(batch_size=16, scheduler="vllm")  # (the dyn= policy gets vLLM's charge under either)
        res = Engine(prep.tables, prep.arrivals, sim_policy(spec), prep.cost, cfg).run()
        assert res.lossless, res.violation
        st = {k: np.asarray(v) for k, v in res.steps.items()}
        dec = st["num_decode"] > 0
        prev = np.r_[0, st["num_seqs"][:-1]]
        fwd = (st["tokens"] - st["prefill_tokens"]) / np.maximum(st["num_decode"], 1)
        per[spec] = (fwd[dec & (prev > 8)], fwd[dec & (prev <= 8) & (prev > 0)])
    assert (per["model-fixed:7"][0] == 8).all()
    assert len(per["model-fixed:7:dyn=1-8@7,9-64@2"][0]) and (per["model-fixed:7:dyn=1-8@7,9-64@2"][0] == 3).all()
    assert (per["model-fixed:7:dyn=1-8@7,9-64@2"][1] <= 8).all()


# ------------------------------------------------------------------------------------------------ the mapping
@pytest.mark.parametrize("cfg,policy,drafter", [
    ({"method": "eagle3", "num_speculative_tokens": 3, "enable_adaptive_verification": True},
     "adaptive:online", "eagle3-llama3.1-8b:3"),
    ({"method": "eagle", "num_speculative_tokens": 5, "enable_adaptive_verification": True,
      "num_speculative_tokens_per_batch_size": [[9, 64, 1], [1, 8, 5]]}, "adaptive:online:dyn=1-8@5,9-64@1",
     "eagle-llama3.1-8b:5"),
    ({"method": "dspark", "enable_adaptive_verification": True, "num_speculative_tokens_per_batch_size": [[1, 16, 7]]},
     "adaptive:dyn=1-16@7", None),
    ({"method": "dspark", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 9, 1]]},
     "model-fixed:4:dyn=1-2@4,3-9@1", None),
    ({"method": "ngram", "num_speculative_tokens": 8, "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 64, 2]]},
     "vllm-ngram:8:dyn=1-4@8,5-64@2", None),
])
def test_vllm_fields_map_onto_the_policies(cfg, policy, drafter):
    m = speculative_config(json.dumps(cfg), (2, 5), 7)
    assert (m.policy, m.drafter) == (policy, drafter)
    assert get_policy(m.policy).name == policy  # a spec the registry builds, named as mapped


@pytest.mark.parametrize("cfg,needle", [
    ({"method": "ngram", "num_speculative_tokens": 3, "enable_adaptive_verification": True}, "not n-gram"),
    ({"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 4, 3]]}, "does not go with method 'suffix'"),
    ({"method": "dspark", "num_speculative_tokens_per_batch_size": [[2, 4, 3]]}, "must start at batch size 1"),
    ({"method": "dspark", "num_speculative_tokens_per_batch_size": [[1, 4, 3], [4, 8, 1]]}, "overlap"),
    ({"method": "dspark", "num_speculative_tokens_per_batch_size": []}, "non-empty list"),
    ({"method": "dspark", "num_speculative_tokens_per_batch_size": [[1, 4]]}, "three integers"),
    ({"method": "dspark", "num_speculative_tokens_per_batch_size": [[1, 4, -1]]}, "num_speculative_tokens >= 0"),
])
def test_what_vllm_does_not_have_is_refused(cfg, needle):
    with pytest.raises(ConfigError) as ei:
        speculative_config(json.dumps(cfg), (2, 5), 7)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_the_command_runs_the_mapping_and_prints_flags_that_map_back():
    r = run_cli_inprocess("sim.run", "--trace", TINY, "--batch-size", "4", "--workers", "1", "--format", "json",
                          "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3, '
                          '"enable_adaptive_verification": true, "num_speculative_tokens_per_batch_size": '
                          '[[1, 2, 3], [3, 64, 1]]}', "--baseline", "adaptive")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["policy"] for row in rows] == ["adaptive", "adaptive:online:dyn=1-2@3,3-64@1"]
    assert all(row["lossless"] for row in rows) and "online acceptance estimator" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "enable_adaptive_verification": true}'],
     "not n-gram"),
    (["--speculative-config", '{"method": "dspark", "enable_adaptive_verification": true, '
      '"num_speculative_tokens_per_batch_size": [[1, 4, 7]]}', "--additional-config", '{"hybrid_spec": {}}'],
     "does not go with --additional-config"),
    (["--policy", "adaptive:early-stop:dyn=1-4@3"], "goes with a policy vLLM runs"),
    (["--policy", "adaptive:online:table=step:dyn=1-4@3"], "give one"),
])
def test_the_command_refuses_in_one_line(args, needle):
    r = run_cli_inprocess("sim.run", "--trace", TINY, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and r.stdout == "", r.stderr


def test_a_refusal_from_a_real_process_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "sim.run", "--trace", TINY, "--speculative-config",
                        '{"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 4, 3]]}'],
                       capture_output=True, text=True, timeout=120, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "num_speculative_tokens_per_batch_size" in lines[0]
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------ the anchor
def test_the_pr52228_anchor_states_its_setting_and_compares_on_over_off():
    from sim.api import anchors as A

    a = A.ANCHORS["pr52228-online-estimator"]
    assert a.fitted.startswith("none") and "nspec 8" in a.source and "concurrency 64" in a.source
    assert A.PR52228 == {"mean over five datasets": 1.19, "MT-Bench": 1.14} and A.PR52228_TOL == 0.10
    figs = a.run()
    assert len(figs) == 2 and all(f.tolerance == 0.10 and f.tolerance_kind == "absolute" for f in figs)
    assert figs[0].simulated == figs[1].simulated and 0.9 < figs[0].simulated < 1.5  # one simulated ratio, two targets
