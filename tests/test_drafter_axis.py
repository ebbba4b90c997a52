"""The drafter axis (sim/core/drafters/registry.py, sim/core/policies/multi.py, sim/engine/live.py): the policies over any
drafters make the two-drafter definitions' allocations on two drafters; a run with the live suffix drafter is
lossless and its policies use only the drafters they name; bad drafter input is one line, exit 2."""
import dataclasses

import numpy as np
import pytest
import torch

from sim.core.drafters.registry import parse_drafters
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy
from sim.core.policies.base import host_view
from sim.core.policies.testing import random_batch

TWO = ("dspark", "ngram")


def _batch(seed):
    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 9))
    b = random_batch(rng, R, 7, int(rng.choice([4, 8, 32])), max_tokens=int(rng.choice([64, 400])))
    mean = torch.tensor(rng.beta(4.0, 1.0, size=b.chains["ngram"][0].shape), dtype=torch.float32)
    d = float(b.draft_cost_ms)
    return dataclasses.replace(b, means={**b.means, "ngram": mean}, draft_ms_of={**b.draft_ms_of,
                                                                                 "dspark": d * rng.uniform(0, 0.9),
                                                                                 "ngram": d * rng.uniform(0, 0.1)},
                               num_sampling_reqs=R + int(rng.integers(0, 3)))


@pytest.mark.parametrize("spec", ["hybrid", "hybrid:fixed-point", "hybrid:model-opt:hyst=0.1", "hybrid-price",
                                  "hybrid-price:current", "hybrid-price:model-opt", "oracle", "hybrid-tree",
                                  "hybrid-tree:fixed-point:discount=0.8", "hybrid-vllm", "hybrid-vllm:slots=16",
                                  "hybrid-vllm:skip", "hybrid-vllm:model-opt:slots=12:skip"])
def test_the_general_form_on_two_drafters_is_the_two_drafter_definition(spec):
    from sim.core.policies.registry import families

    name, *params = spec.split(":")
    general = families()[name].over(params, TWO)
    defn = sim_policy(spec)
    for seed in range(150):
        b = _batch(seed)
        if defn.phased:
            p1, p2 = defn.plan(host_view(b)), general.plan(host_view(b))
            budget = lambda p: None if p.budget is None else int(p.budget)  # noqa: E731
            assert (p1.drafters, budget(p1)) == (p2.drafters, budget(p2)), seed
        want, got = defn.fn(b), general.fn(b)
        assert torch.equal(want.chain, got.chain) and torch.equal(want.admitted, got.admitted), (spec, seed)
        if want.second is not None:  # the tree's second branch: the other chain, as many slots
            assert torch.equal(want.second, got.second), (spec, seed)
            other = torch.where(want.chain == 1, 2, 1)
            assert torch.equal(got.second_chain[want.second > 0], other[want.second > 0]), (spec, seed)
        for name in ("dspark", "ngram"):
            if want.said(name) is not None:
                assert bool(want.said(name)) == bool(got.said(name)), (spec, seed, name)


def test_three_drafter_policies_choose_any_chain_and_the_oracle_bounds_them():
    from sim.core.policies.multi import oracle_n
    from sim.core.policies.testing import expected_goodput  # noqa: F401  (same goodput definition)
    from sim.core.policies.common import goodput

    names = ("dspark", "ngram", "suffix")
    hyb = sim_policy("hybrid", names)
    chose = set()
    for seed in range(120):
        rng = np.random.default_rng(1000 + seed)
        b = _batch(seed)
        R = b.num_reqs
        conf = torch.tensor(rng.beta(8.0, 1.0, size=(R, 16)))
        n = torch.tensor(rng.integers(0, 17, size=R))
        b = dataclasses.replace(b, chains={**b.chains, "suffix": (conf, n)},
                                stale_chains={**b.stale_chains, "suffix": (conf, n)},
                                draft_ms_of={**b.draft_ms_of, "suffix": 0.05},
                                draft_cost_ms=b.draft_cost_ms + 0.05,
                                true_acc={**b.true_acc, "suffix": torch.tensor(rng.integers(0, 17, size=R))})
        a = hyb.fn(b)
        assert ((a.chain == 0) == (a.admitted == 0)).all()
        chose |= set(a.chain.tolist())
        # the oracle's step goodput bounds the policy's realised one (accepted slots of its allocation)
        o = oracle_n(b, names)
        acc = {1: b.true_acc["dspark"], 2: b.true_acc["ngram"], 3: b.true_acc["suffix"]}
        got = sum(int(min(int(a.admitted[r]), int(acc[int(a.chain[r])][r]))) for r in range(R) if a.chain[r] > 0)
        ran = [names[i] for i in range(3) if (i != 0 or bool(a.said("dspark")))]
        cost = b.draft_cost_ms - (0 if bool(a.said("dspark")) else b.price("dspark"))
        t = dataclasses.replace(b, verify_cost_ms=b.verify_cost_ms)
        g_pol = float(goodput(t, torch.tensor(float(got)), a.admitted.sum(), cost))
        oacc = sum(min(int(o.admitted[r]), int(acc[int(o.chain[r])][r])) for r in range(R) if o.chain[r] > 0)
        ocost = sum(p for nm, p in b.draft_ms_of.items() if bool(o.ran[nm]))
        alloc_ms = b.draft_cost_ms - b.price("dspark") - b.price("ngram") - 0.05
        ocost += alloc_ms if int(o.admitted.sum()) or ocost else 0.0
        g_or = float(goodput(t, torch.tensor(float(oacc)), o.admitted.sum(), ocost))
        assert oacc == int(o.admitted.sum())  # the oracle admits accepted slots only
        assert g_or >= g_pol - 1e-9, (seed, g_or, g_pol, ran)
    assert {1, 2, 3} <= chose


def _three(seed, suffix_hi=8.0):
    """A random batch with a third (suffix) chain of 16 slots, confidences beta(suffix_hi, 1)."""
    rng = np.random.default_rng(2000 + seed)
    b = _batch(seed)
    R = b.num_reqs
    conf = torch.tensor(rng.beta(suffix_hi, 1.0, size=(R, 16)), dtype=torch.float32)
    n = torch.tensor(rng.integers(0, 17, size=R))
    return dataclasses.replace(b, chains={**b.chains, "suffix": (conf, n)},
                               stale_chains={**b.stale_chains, "suffix": (conf, n)},
                               means={**b.means, "suffix": conf},
                               draft_ms_of={**b.draft_ms_of, "suffix": 0.05}, draft_cost_ms=b.draft_cost_ms + 0.05,
                               true_acc={**b.true_acc, "suffix": torch.tensor(rng.integers(0, 17, size=R))})


def _realised(b, chain, adm):
    """Tokens a single-chain allocation accepts (the true accepted lengths of its chains, capped)."""
    acc = {0: torch.zeros_like(adm), 1: b.true_acc["dspark"], 2: b.true_acc["ngram"], 3: b.true_acc["suffix"]}
    return torch.stack([torch.minimum(adm[r], acc[int(chain[r])][r]) for r in range(len(adm))])


@pytest.mark.parametrize("spec", ["hybrid-tree", "hybrid-vllm", "hybrid-vllm:skip"])
def test_tree_and_vllm_over_three_drafters(spec):
    """hybrid-tree and hybrid-vllm over (dspark, ngram, suffix): the contract (a chain's slots within its length,
    a tree's second branch another chain within its length), every chain chosen somewhere, the suffix chain
    chosen where it is the only good one, and the per-step oracle over three drafters bounds the step's realised
    goodput (the tree accepting the longer of its two branches)."""
    from sim.core.policies.common import goodput
    from sim.core.policies.multi import oracle_n

    names = ("dspark", "ngram", "suffix")
    pol = sim_policy(spec, names)
    assert pol.drafters == names
    chose, second = set(), set()
    for seed in range(120):
        b = _three(seed)
        a = pol.fn(b)
        lens = {0: torch.zeros_like(b.chains["dspark"][1]),
                **{i: b.chains[n][1] for i, n in ((1, "dspark"), (2, "ngram"), (3, "suffix"))}}
        assert ((a.admitted >= 0) & (a.admitted <= torch.stack([lens[int(c)][r] for r, c in enumerate(a.chain)]))).all()
        chose |= set(a.chain[a.admitted > 0].tolist())
        got = _realised(b, a.chain, a.admitted)
        slots = a.admitted.sum()
        if a.second is not None:
            sc = a.second_chain
            assert ((a.second == 0) | (sc != a.chain)).all(), seed
            assert (a.second <= torch.stack([lens[int(c)][r] for r, c in enumerate(sc)])).all(), seed
            second |= set(sc[a.second > 0].tolist())
            got = torch.maximum(got, _realised(b, sc, a.second))
            slots = slots + a.second.sum()
        cost = b.draft_cost_ms - (0.0 if a.said("dspark") is None or bool(a.said("dspark")) else b.price("dspark"))
        g_pol = float(goodput(b, got.sum().to(torch.float64), slots, cost))
        o = oracle_n(b, names)
        ocost = sum(p for nm, p in b.draft_ms_of.items() if bool(o.ran[nm]))
        ocost += (b.draft_cost_ms - sum(b.draft_ms_of.values())) if int(o.admitted.sum()) or ocost else 0.0
        g_or = float(goodput(b, o.admitted.sum().to(torch.float64), o.admitted.sum(), ocost))
        assert g_or >= g_pol - 1e-9, (spec, seed, g_or, g_pol)
    assert {1, 2, 3} <= chose, chose
    if spec == "hybrid-tree":
        assert {1, 2, 3} <= second, second
    # the suffix chain long and sure, the others short and unsure: it is the chain verified
    b = _three(7, suffix_hi=60.0)
    b.chains["suffix"][1][:] = 16
    b.chains["dspark"][0].mul_(0.2)
    b.chains["ngram"][0].mul_(0.2)
    b.stale_chains["dspark"][0].mul_(0.2)
    b.stale_chains["ngram"][0].mul_(0.2)
    b = dataclasses.replace(b, verify_cost_ms=torch.full_like(b.verify_cost_ms, 5.0),
                            means={**b.means, "ngram": b.chains["ngram"][0]})
    a = pol.fn(b)
    assert (a.chain == 3).all() and (a.admitted > 0).all(), (spec, a)


@pytest.mark.parametrize("names", [("dspark", "suffix"), ("dspark", "ngram", "suffix")])
def test_the_plugin_skip_runs_every_model_free_drafter(names):
    """hybrid-vllm:...:skip plans only DSpark's pass: every model-free drafter runs every step (the plugin's n-gram
    one always does), whatever the forecast says of it -- even a model-free chain that never ran before (empty stale
    chain, no history) is drafted, so it can be chosen at all. (It was left out when the forecast did not want it,
    and over dspark,suffix the step then never drafted the suffix chain: the policy equalled adaptive.)"""
    from sim.core.policies.hybrid import plan_hybrid_vllm_skip

    for seed in range(20):
        b = _three(seed)
        b = dataclasses.replace(b, chains={n: b.chains[n] for n in names},
                                stale_chains={n: (c, torch.zeros_like(n_)) for n, (c, n_) in b.stale_chains.items()
                                              if n in names},
                                means={n: torch.zeros_like(m) for n, m in b.means.items() if n in names})
        plan = plan_hybrid_vllm_skip(host_view(b), names=names)
        assert set(names) - {"dspark"} <= plan.drafters <= set(names), (seed, plan.drafters)

def test_drafter_names():
    assert parse_drafters("suffix, dspark") == ("dspark", "suffix")
    for bad in ("dspark,eagle", "", "ngram,ngram", "dspark,,ngram"):
        with pytest.raises(ConfigError):
            parse_drafters(bad)
    with pytest.raises(ConfigError, match="does not enable"):
        sim_policy("suffix")
    with pytest.raises(ConfigError, match="does not enable"):
        sim_policy("adaptive", ("ngram", "suffix"))
    assert sim_policy("hybrid", ("ngram", "suffix")).drafters == ("ngram", "suffix")
    assert sim_policy("adaptive", ("dspark", "ngram", "suffix")).drafters == ("dspark",)


def test_a_run_with_the_suffix_drafter_is_lossless_and_uses_what_it_names():
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=6, seed=0, drafters="dspark,ngram,suffix"))
    rows = {}
    for pol in ("suffix", "hybrid", "oracle", "adaptive", "hybrid-tree", "hybrid-vllm"):
        row, res = run_one(prep, pol, 4)
        assert res.lossless, (pol, res.violation)
        rows[pol] = (row, res)
    st = rows["suffix"][1].steps
    # each drafter its own step columns: the suffix drafter's slots and time in verified_suffix / suffix_ms
    assert st["verified_model"].sum() == 0 and st["verified_ngram"].sum() == 0 and st["verified_suffix"].sum() > 0
    assert 0 < st["accepted_suffix"].sum() <= st["verified_suffix"].sum()
    assert st["draft_ms"].sum() == 0 and st["ngram_ms"].sum() == 0 and st["suffix_ms"].sum() > 0
    assert ((st["suffix_ms"] > 0) == (st["num_decode"] > 0)).all()  # charged on every decode step, only there
    assert rows["suffix"][0]["ngram_share_verified"] == 1.0  # the summary: model-free drafters together, as before
    hy = rows["hybrid"][1].steps
    assert (hy["verified_suffix"][hy["suffix_ms"] == 0] == 0).all()  # no slot of a drafter on a step it did not run
    assert rows["adaptive"][1].steps["ngram_ms"].sum() == 0  # an enabled drafter a policy does not use: not charged
    assert "suffix_ms" not in rows["adaptive"][1].steps  # nor given a column
    for pol in ("suffix", "hybrid", "oracle", "hybrid-tree", "hybrid-vllm"):  # every drafter's verified slots
        s = rows[pol][1].steps
        assert np.array_equal(s["tokens"], s["num_decode"] + s["prefill_tokens"] + s["verified_model"]
                              + s["verified_ngram"] + s["verified_suffix"]), pol
    assert rows["oracle"][0]["output_throughput_tok_s"] >= rows["hybrid"][0]["output_throughput_tok_s"] * 0.98
    tr = rows["hybrid-tree"][1].steps  # the tree verifies suffix slots (as a first or a second branch) and keeps some
    assert tr["verified_suffix"].sum() > 0 and 0 < tr["accepted_suffix"].sum() <= tr["verified_suffix"].sum()


def _cli(*args):
    from conftest import run_cli_inprocess  # in this process: the same error boundary, no interpreter start-up

    return run_cli_inprocess("sim.api.run", "--trace", "traces/codeedit.jsonl", "--sample", "2", "--batch-size", "1",
                             "--no-progress", *args)


@pytest.mark.parametrize("args,what", [
    (("--drafters", "dspark,medusa"), "unknown drafter 'medusa'"),
    (("--policy", "suffix"), "does not enable"),
    (("--drafters", "ngram,suffix", "--policy", "adaptive"), "does not enable"),
    (("--drafters", "dspark,suffix", "--suffix-config", '{"max_depth": 1}'), "--suffix-max-depth must be in 2..256"),
    (("--drafters", "dspark,ngram,suffix", "--policy", "hybrid-tree", "--suffix-config", '{"max_depth": 1}'),
     "--suffix-max-depth must be in 2..256"),
    (("--drafters", "ngram,suffix", "--policy", "hybrid-vllm"), "must enable dspark"),
    (("--drafters", "dspark,ngram", "--policy", "hybrid-tree:sweep:x"), "unknown policy"),
    (("--speculative-config", '{"method": "suffix", "suffix_decoding_min_token_prob": 2}'), "suffix-min-token-prob"),
    (("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, '
      '"suffix_decoding_max_tree_depth": 8}'), "goes with method 'suffix'"),
])
def test_bad_drafter_input_is_one_line_exit_2(args, what):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    assert what in p.stderr and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("error")]) == 1, p.stderr


def test_the_suffix_calibrator():
    from sim.core.drafters.suffix import SMOOTH, SuffixCalibrator, fit

    p = np.array([1.0, 1.0, 1.0, 0.1])
    e = np.array([1, 1, 20, 3])
    y = np.array([False, True, True, False])
    table, n = fit(p, e, y)
    prior = 0.5
    assert n[-1, 0] == 2 and table[-1, 0] == pytest.approx((1 + SMOOTH * prior) / (2 + SMOOTH))
    assert table[0, 3] == pytest.approx(prior)  # an empty cell: the prior
    cal = SuffixCalibrator(table)
    assert cal(np.array([1.0, 0.1]), np.array([1, 3])).tolist() == [table[-1, 0], table[0, 1]]
    bundled = SuffixCalibrator.load()  # made on general text; a long match is more reliable than a short one
    assert bundled(np.array([1.0]), np.array([16]))[0] > bundled(np.array([1.0]), np.array([1]))[0] + 0.3


def test_an_engine_without_the_live_drafter_refuses_a_policy_that_needs_it():
    from sim.engine.engine import Engine, EngineConfig
    from sim.api.run import SimSetup, prepare

    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=2))
    with pytest.raises(ConfigError, match="does not run"):
        Engine(prep.tables, prep.arrivals, sim_policy("hybrid", "dspark,ngram,suffix"), prep.cost, EngineConfig())
