"""Unit tests of the allocation policies on small hand-computed cases, and of the registry."""
import numpy as np
import pytest
import torch

from sim.infra.errors import ConfigError
from sim.core.policies import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, StepBatch, get_policy, list_policies
from sim.core.policies.testing import random_batch


def make_batch(model_conf, ngram_conf, model_len=None, ngram_len=None, table=None, draft=0.0, T=None,
               stale_model_conf=None, true_m=None, true_n=None):
    mc = torch.tensor(model_conf, dtype=torch.float32)
    nc = torch.tensor(ngram_conf, dtype=torch.float32)
    R = mc.shape[0]
    ml = torch.tensor(model_len if model_len is not None else [mc.shape[1]] * R)
    nl = torch.tensor(ngram_len if ngram_len is not None else [nc.shape[1]] * R)
    smc = torch.tensor(stale_model_conf, dtype=torch.float32) if stale_model_conf is not None else mc.clone()
    return StepBatch(
        chains={"dspark": (mc, ml), "ngram": (nc, nl)},
        stale_chains={"dspark": (smc, ml.clone()), "ngram": (nc.clone(), nl.clone())},
        num_nondraft_tokens=R if T is None else T,
        verify_cost_ms=torch.tensor(table if table is not None else [10.0 + t for t in range(64)], dtype=torch.float64),
        draft_cost_ms=draft, true_acc={"dspark": None if true_m is None else torch.tensor(true_m),
                                       "ngram": None if true_n is None else torch.tensor(true_n)},
    )


def lists(alloc):
    return alloc.chain.tolist(), alloc.admitted.tolist()


# --- registry -------------------------------------------------------------------------------------

def test_registry_lists_every_family():
    names = " ".join(list_policies())
    for fam in ["none", "model-fixed", "ngram-fixed", "adaptive", "ngram-first", "ngram-threshold",
                "hybrid-price", "oracle"]:
        assert fam in names


@pytest.mark.parametrize("spec", ["none", "model-fixed:7", "ngram-fixed:16", "adaptive", "adaptive:early-stop",
                                  "ngram-first", "ngram-threshold", "ngram-threshold:3.0", "hybrid-price",
                                  "hybrid-price:model-opt", "hybrid-price:fixed-point", "hybrid-price:sweep",
                                  "hybrid-price:sweep:current", "hybrid-price:current", "oracle"])
def test_every_spec_builds_and_runs(spec):
    pol = get_policy(spec)
    assert pol.host_sync is False
    b = random_batch(np.random.default_rng(1), 5, 7, 12)
    a = pol(b)
    assert a.chain.dtype == torch.int64 and a.admitted.dtype == torch.int64
    assert a.chain.shape == a.admitted.shape == (5,)


@pytest.mark.parametrize("spec", ["bogus", "model-fixed", "model-fixed:x", "model-fixed:-1", "none:3",
                                  "adaptive:nope", "hybrid-price:newton", "ngram-threshold:abc",
                                  "ngram-threshold:1:2", "oracle:1", "ngram-fixed:1:2"])
def test_bad_specs_raise_config_error(spec):
    with pytest.raises(ConfigError, match="unknown policy .*choose one of: "):
        get_policy(spec)


def test_flags():
    assert not get_policy("none").uses_model and not get_policy("none").uses_ngram
    assert get_policy("model-fixed:3").uses_model and not get_policy("model-fixed:3").uses_ngram
    assert get_policy("ngram-fixed:3").uses_ngram and not get_policy("ngram-fixed:3").uses_model
    assert get_policy("adaptive").uses_model and not get_policy("adaptive").uses_ngram
    hp = get_policy("hybrid-price")
    assert hp.uses_model and hp.uses_ngram and not hp.needs_truth
    assert get_policy("oracle").needs_truth


def test_oracle_without_truth_is_a_config_error():
    b = make_batch([[0.9]], [[0.9]])
    with pytest.raises(ConfigError):
        get_policy("oracle")(b)


# --- simple policies ------------------------------------------------------------------------------

def test_none():
    b = make_batch([[0.9, 0.9]] * 3, [[0.9] * 4] * 3)
    assert lists(get_policy("none")(b)) == ([CHAIN_NONE] * 3, [0] * 3)


def test_fixed():
    b = make_batch([[0.9] * 5] * 3, [[0.9] * 6] * 3, model_len=[5, 2, 3], ngram_len=[6, 0, 3])
    assert lists(get_policy("model-fixed:3")(b)) == ([CHAIN_MODEL] * 3, [3, 2, 3])
    assert lists(get_policy("ngram-fixed:4")(b)) == ([CHAIN_NGRAM, CHAIN_NONE, CHAIN_NGRAM], [4, 0, 3])
    assert lists(get_policy("model-fixed:0")(b)) == ([CHAIN_NONE] * 3, [0] * 3)


def test_ngram_first():
    b = make_batch([[0.9] * 4] * 3, [[0.1] * 8] * 3, model_len=[4, 4, 0], ngram_len=[8, 0, 0])
    assert lists(get_policy("ngram-first")(b)) == ([CHAIN_NGRAM, CHAIN_MODEL, CHAIN_NONE], [8, 4, 0])


def test_ngram_threshold():
    # expected n-gram accepted length: 0.9 + 0.81 + 0.729 = 2.439 (row 0); 0.5 + 0.25 + 0.125 = 0.875 (row 1)
    b = make_batch([[0.8] * 5] * 2, [[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]])
    assert lists(get_policy("ngram-threshold")(b)) == ([CHAIN_NGRAM, CHAIN_MODEL], [3, 5])
    assert lists(get_policy("ngram-threshold:2.5")(b)) == ([CHAIN_MODEL, CHAIN_MODEL], [5, 5])
    assert lists(get_policy("ngram-threshold:0.8")(b)) == ([CHAIN_NGRAM, CHAIN_NGRAM], [3, 3])


def test_oracle_picks_true_better_chain():
    b = make_batch([[0.5] * 4] * 4, [[0.5] * 6] * 4, ngram_len=[6, 6, 0, 2],
                   true_m=[2, 3, 0, 1], true_n=[5, 3, 0, 4])
    # row 3: n-gram chain has only 2 tokens, so its true accepted length is capped at 2
    assert lists(get_policy("oracle")(b)) == ([CHAIN_NGRAM, CHAIN_MODEL, CHAIN_NONE, CHAIN_NGRAM], [5, 3, 0, 2])


def test_oracle_admits_only_accepted_slots_and_all_of_them_when_slots_are_cheap():
    rng = np.random.default_rng(3)
    for _ in range(50):
        b = random_batch(rng, 6, 5, 9)
        acc_m = torch.minimum(b.true_acc.get("dspark"), b.chains["dspark"][1])
        acc_n = torch.minimum(b.true_acc.get("ngram"), b.chains["ngram"][1])
        a = get_policy("oracle")(b)
        best = torch.where(a.chain == CHAIN_NGRAM, acc_n, torch.where(a.chain == CHAIN_MODEL, acc_m, 0))
        assert bool((a.admitted <= best).all())  # never a rejected slot
        # a flat verify table and free drafters: every accepted slot of the better chain is worth taking
        b.verify_cost_ms = torch.full_like(b.verify_cost_ms, 5.0)
        b.draft_cost_ms = 0.0
        a = get_policy("oracle")(b)
        assert torch.equal(a.admitted, torch.maximum(acc_m, acc_n))
        assert bool(((a.chain == CHAIN_NGRAM) == (acc_n > acc_m)).all())


def test_oracle_skips_the_model_pass_when_the_ngram_chains_are_enough():
    b = make_batch([[0.5] * 4] * 2, [[0.5] * 6] * 2, true_m=[2, 3], true_n=[6, 5], draft=1.0)
    b.draft_ms_of["dspark"] = 0.9  # the model chains add nothing: paying their pass only lowers the goodput
    a = get_policy("oracle")(b)
    assert not bool(a.said("dspark")) and bool(a.said("ngram"))
    assert lists(a) == ([CHAIN_NGRAM, CHAIN_NGRAM], [6, 5])
    b = make_batch([[0.5] * 4] * 2, [[0.5] * 6] * 2, true_m=[4, 4], true_n=[0, 0], draft=1.0)
    b.draft_ms_of["dspark"] = 0.9
    a = get_policy("oracle")(b)
    assert bool(a.said("dspark")) and lists(a) == ([CHAIN_MODEL, CHAIN_MODEL], [4, 4])


# --- adaptive -------------------------------------------------------------------------------------

def test_adaptive_budget_and_top_b_by_hand():
    # stale survivals: row0 0.9, 0.81 ; row1 0.5, 0.25. Sorted: 0.9, 0.81, 0.5, 0.25.
    # draft 0, T = 2, verify[t] = 10 + t (t = 2..6): G_B = (2 + S_1..S_B) / (10 + 2 + B)
    # G0 = 2/12 = .1667, G1 = 2.9/13 = .2231, G2 = 3.71/14 = .2650, G3 = 4.21/15 = .2807, G4 = 4.46/16 = .2788
    # -> B* = 3. Current confidences: row0 0.6, 0.6 (0.6, 0.36); row1 0.95, 0.95 (0.95, 0.9025)
    # top-3 of current: 0.95, 0.9025, 0.6 -> row0 admits 1, row1 admits 2.
    b = make_batch([[0.6, 0.6], [0.95, 0.95]], [[0.9], [0.9]], stale_model_conf=[[0.9, 0.9], [0.5, 0.5]])
    assert lists(get_policy("adaptive")(b)) == ([CHAIN_MODEL, CHAIN_MODEL], [1, 2])


def test_adaptive_cheap_steps_admit_everything_and_costly_steps_nothing():
    flat = [10.0] * 64
    b = make_batch([[0.5] * 3, [0.2] * 3], [[0.9]] * 2, table=flat)
    assert lists(get_policy("adaptive")(b)) == ([CHAIN_MODEL] * 2, [3, 3])
    steep = [10.0 + 100 * t for t in range(64)]
    b = make_batch([[0.5] * 3, [0.2] * 3], [[0.9]] * 2, table=steep)
    assert lists(get_policy("adaptive")(b)) == ([CHAIN_NONE] * 2, [0, 0])


def test_adaptive_respects_lengths_and_clamps_table():
    b = make_batch([[0.99] * 4] * 3, [[0.9]] * 3, model_len=[4, 1, 0], table=[10.0, 10.0, 10.0, 10.0])
    assert lists(get_policy("adaptive")(b)) == ([CHAIN_MODEL, CHAIN_MODEL, CHAIN_NONE], [4, 1, 0])


def test_adaptive_matches_a_numpy_reference():
    rng = np.random.default_rng(7)
    pol = get_policy("adaptive")
    for _ in range(100):
        b = random_batch(rng, int(rng.integers(1, 9)), int(rng.integers(1, 8)), 4, max_tokens=int(rng.integers(4, 60)))
        # numpy reference of vLLM's get_num_tokens (stale budget, masked with the current draft count) + top-k
        st = np.cumprod(b.stale_chains["dspark"][0].double().numpy(), 1)
        valid = np.arange(st.shape[1])[None] < b.chains["dspark"][1].numpy()[:, None]
        scores = np.sort(st[valid])[::-1]
        table = b.verify_cost_ms.numpy()
        idx = np.minimum(b.num_nondraft_tokens + np.arange(len(scores) + 1), len(table) - 1)
        g = np.concatenate([[b.num_reqs], b.num_reqs + np.cumsum(scores)]) / (b.draft_cost_ms + table[idx])
        budget = int(np.argmax(g))
        cur = np.cumprod(b.chains["dspark"][0].double().numpy(), 1)
        cur[np.arange(cur.shape[1])[None] >= b.chains["dspark"][1].numpy()[:, None]] = -np.inf
        order = np.argsort(-cur.ravel(), kind="stable")[:budget]
        win = np.zeros(cur.size, bool)
        win[order] = True
        win &= np.isfinite(cur.ravel())
        assert pol(b).admitted.tolist() == win.reshape(cur.shape).sum(1).tolist()


def test_early_stop_by_hand():
    # current survivals sorted: 0.9, 0.3, 0.28 (row0: 0.9, 0.3 via conf 0.9, 1/3; row1: 0.28)
    # verify[t] = 10 + t, T = 2, draft 0: G0 = 2/12 = .1667, G1 = 2.9/13 = .2231, G2 = 3.2/14 = .2286,
    # G3 = 3.48/15 = .232 -> all rise: B = 3.  With table[4] = 14.5, table[5] = 14.6: G2 = 3.2/14.5 = .2207 < G1
    # -> early stop at B = 1, although G3 = 3.48/14.6 = .2384 is the optimum adaptive finds (B* = 3).
    conf = [[0.9, 1 / 3], [0.28, 0.0]]
    b = make_batch(conf, [[0.5]] * 2, model_len=[2, 1])
    assert lists(get_policy("adaptive:early-stop")(b)) == ([CHAIN_MODEL] * 2, [2, 1])
    table = [10.0, 11, 12, 13, 14.5, 14.6] + [20.0] * 58
    b = make_batch(conf, [[0.5]] * 2, model_len=[2, 1], table=table)
    assert lists(get_policy("adaptive:early-stop")(b)) == ([CHAIN_MODEL, CHAIN_NONE], [1, 0])
    assert get_policy("adaptive")(b).admitted.sum().tolist() == 3  # stale = current here: full optimum B* = 3


# --- invariants of every policy -------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", "model-fixed:5", "ngram-fixed:9", "adaptive", "adaptive:early-stop",
                                  "ngram-first", "ngram-threshold", "hybrid-price", "hybrid-price:model-opt",
                                  "hybrid-price:fixed-point", "hybrid-price:sweep:current",
                                  "hybrid-price:model-opt:current", "hybrid-price:fixed-point:current", "oracle"])
def test_invariants(spec):
    rng = np.random.default_rng(11)
    pol = get_policy(spec)
    for i in range(40):
        b = random_batch(rng, int(rng.integers(1, 12)), int(rng.integers(1, 8)), int(rng.integers(1, 20)),
                         max_tokens=int(rng.integers(2, 200)))
        a = pol(b)
        length = torch.where(a.chain == CHAIN_NGRAM, b.chains["ngram"][1], b.chains["dspark"][1])
        assert bool((a.admitted >= 0).all()) and bool((a.admitted <= length).all())
        assert bool(((a.chain == CHAIN_NONE) == (a.admitted == 0)).all())
        assert set(a.chain.tolist()) <= {CHAIN_NONE, CHAIN_MODEL, CHAIN_NGRAM}
        if not pol.uses_ngram:
            assert not bool((a.chain == CHAIN_NGRAM).any())
        if not pol.uses_model:
            assert not bool((a.chain == CHAIN_MODEL).any())


# --- hybrid-price ---------------------------------------------------------------------------------

def test_hybrid_price_takes_a_long_sure_ngram_chain():
    # row0: n-gram chain of 8 tokens at 0.99 each vs model 0.7: the n-gram chain is worth far more
    b = make_batch([[0.7] * 4, [0.9] * 4], [[0.99] * 8, [0.1] * 8], ngram_len=[8, 8],
                   table=[10.0 + 0.01 * t for t in range(64)])
    for spec in ["hybrid-price", "hybrid-price:current", "hybrid-price:fixed-point", "hybrid-price:model-opt"]:
        c, adm = lists(get_policy(spec)(b))
        assert c == [CHAIN_NGRAM, CHAIN_MODEL], spec
        assert adm[0] == 8, spec


def test_hybrid_price_without_ngram_equals_adaptive():
    rng = np.random.default_rng(5)
    for _ in range(60):
        b = random_batch(rng, int(rng.integers(1, 9)), 7, 6, max_tokens=80)
        b.chains["ngram"] = (b.chains["ngram"][0], torch.zeros_like(b.chains["ngram"][1]))
        b.stale_chains["ngram"] = (b.stale_chains["ngram"][0], torch.zeros_like(b.chains["ngram"][1]))
        b.stale_chains["dspark"] = (b.chains["dspark"][0].clone(), b.chains["dspark"][1].clone())
        ref = get_policy("adaptive")(b)
        for spec in ["hybrid-price:model-opt", "hybrid-price:model-opt:current", "hybrid-price"]:
            a = get_policy(spec)(b)
            assert torch.equal(a.admitted, ref.admitted), spec
            assert torch.equal(a.chain, ref.chain), spec


def test_hybrid_price_budget_comes_from_stale_values():
    # stale values say: spend nothing (all stale confidences ~0); the current ones are great.
    b = make_batch([[0.99] * 4] * 2, [[0.99] * 8] * 2, stale_model_conf=[[0.01] * 4] * 2)
    b.stale_chains["ngram"] = (torch.full_like(b.chains["ngram"][0], 0.01), b.stale_chains["ngram"][1])
    assert get_policy("hybrid-price")(b).admitted.sum().tolist() == 0
    assert get_policy("hybrid-price:current")(b).admitted.sum().tolist() > 0
