"""The default hybrid (`hybrid`): it skips the model drafter's pass only from host-known (stale) values,
never reads a model chain that was not drafted, is charged honestly, and widens its budget only to free slots."""
import dataclasses

import numpy as np
import torch

from conftest import LinearCost, random_requests
from sim.core.drafters.calibration import KNOTS, NgramCalibrator
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import build_draft_tables
from sim.engine.engine import Engine, EngineConfig
from sim.core.policies import CHAIN_MODEL, CHAIN_NGRAM
from sim.engine.policies import sim_policy
from sim.core.policies.hybrid import free_budget, price_skip
from sim.core.policies.testing import random_batch, replace_chain

CFG = NgramConfig(n_min=1, n_max=3, k=8, ext_max=16)


def _batch(model_conf, ngram_conf, stale_model, stale_ngram, draft=1.0, model_draft=0.9, table=None):
    mc, nc = torch.tensor(model_conf), torch.tensor(ngram_conf)
    R = mc.shape[0]
    from sim.core.policies import StepBatch
    return StepBatch(chains={"dspark": (mc, torch.full((R,), mc.shape[1])),
                             "ngram": (nc, torch.full((R,), nc.shape[1]))},
                     stale_chains={"dspark": (torch.tensor(stale_model), torch.full((R,), mc.shape[1])),
                                   "ngram": (torch.tensor(stale_ngram), torch.full((R,), nc.shape[1]))},
                     num_nondraft_tokens=R,
                     verify_cost_ms=torch.tensor(table if table is not None else [5.0 + 0.5 * t for t in range(64)],
                                                 dtype=torch.float64),
                     draft_cost_ms=draft, draft_ms_of={"dspark": model_draft, "ngram": 0.05})


def test_skips_the_pass_when_stale_ngram_chains_beat_the_model():
    # stale: long, sure n-gram chains vs weak model chains -> the model pass is not worth 0.9 ms
    b = _batch([[0.9] * 4] * 2, [[0.95] * 8] * 2, [[0.3] * 4] * 2, [[0.97] * 8] * 2)
    a = price_skip(b)
    assert not bool(a.said("dspark"))
    assert (a.chain == CHAIN_NGRAM).all() and (a.admitted > 0).all()
    # the current model chains were never drafted: changing them changes nothing
    b2 = replace_chain(b, "dspark", conf=torch.ones_like(b.chains["dspark"][0]))
    a2 = price_skip(b2)
    assert torch.equal(a.chain, a2.chain) and torch.equal(a.admitted, a2.admitted) and not bool(a2.said("dspark"))


def test_runs_the_pass_when_the_stale_model_chains_pay_for_it():
    b = _batch([[0.9] * 4] * 2, [[0.2] * 8] * 2, [[0.9] * 4] * 2, [[0.2] * 8] * 2)
    a = price_skip(b)
    assert bool(a.said("dspark")) and (a.chain == CHAIN_MODEL).all()


def test_mean_history_keeps_a_short_lived_match_from_skipping_the_pass():
    stale_ng = [[0.97] * 8] * 2
    b = _batch([[0.9] * 4] * 2, [[0.2] * 8] * 2, [[0.6] * 4] * 2, stale_ng)
    assert not bool(price_skip(b).said("dspark"))
    b.means["ngram"] = torch.full((2, 8), 0.2)  # the request rarely copies: do not bet the step on it
    assert bool(price_skip(b).said("dspark"))


def test_free_budget_widens_only_across_flat_cost():
    table = torch.tensor([0.0] + [5.0] * 16 + [6.0 + t for t in range(16)], dtype=torch.float64)
    b = random_batch(np.random.default_rng(0), 4, 4, 8, max_tokens=32)
    b.verify_cost_ms, b.num_nondraft_tokens = table, 4
    assert int(free_budget(b, torch.tensor(3))) == 12  # table[16] is still 5.0 ms: 16 - 4 slots are free
    assert int(free_budget(b, torch.tensor(20))) == 20  # past the flat part nothing is free


def test_engine_charges_the_model_pass_only_when_it_ran():
    rng = np.random.default_rng(0)
    reqs = random_requests(rng, 6, vocab=4, max_prompt=60, max_out=120)
    w = np.zeros(len(KNOTS) + 11)
    w[0], w[1] = 2.0, 1.0
    tb = build_draft_tables(reqs, CFG, ModelDrafterProfile(name="t", block=4), NgramCalibrator(w, CFG))
    res = Engine(tb, np.zeros(len(reqs)), sim_policy("hybrid"), LinearCost(), EngineConfig(batch_size=2)).run()
    assert res.lossless
    st = res.steps
    dec = st["num_decode"] > 0
    skipped = dec & (st["draft_ms"] == 0)
    assert skipped.any() and (dec & (st["draft_ms"] > 0)).any()
    assert (st["verified_model"][skipped] == 0).all()  # nothing admitted from a chain that was not drafted


def test_engine_flags_slots_of_a_drafter_that_did_not_run():
    rng = np.random.default_rng(1)
    reqs = random_requests(rng, 4)
    tb = build_draft_tables(reqs, CFG, ModelDrafterProfile(name="t", block=4), NgramCalibrator(np.zeros(len(KNOTS) + 11), CFG))
    inner = sim_policy("model-fixed:3")

    def cheat(batch):  # claims the pass was skipped but admits model slots
        a = inner.fn(batch)
        return dataclasses.replace(a, ran={"dspark": torch.tensor(False)})

    pol = dataclasses.replace(inner, fn=cheat)
    res = Engine(tb, np.zeros(len(reqs)), pol, LinearCost(), EngineConfig(batch_size=2)).run()
    assert not res.lossless and "did not run" in res.violation


def test_subset_tables_run_like_a_trace_of_those_requests():
    rng = np.random.default_rng(2)
    reqs = random_requests(rng, 8)
    prof = ModelDrafterProfile(name="t", block=4)
    calib = NgramCalibrator(np.zeros(len(KNOTS) + 11), CFG)
    full = build_draft_tables(reqs, CFG, prof, calib)
    idx = np.array([1, 4, 6])
    sub = full.subset(idx)
    alone = build_draft_tables([reqs[i] for i in idx], CFG, prof, calib)
    for f in ("offsets", "out_len", "prompt_len", "ng_len", "ng_acc", "ng_start", "m_acc", "m_tok", "tokens", "tok_offsets"):
        assert np.array_equal(getattr(sub, f), getattr(alone, f)), f
    res = Engine(sub, np.zeros(3), sim_policy("hybrid"), LinearCost(), EngineConfig(batch_size=2)).run()
    assert res.lossless
    assert np.allclose(full.copy_fraction()[idx], sub.copy_fraction())
