"""The slots vLLM verifies past each request's chosen chain under the plugin (hybrid-vllm's fill=vllm, the plugin's
tail=c): vLLM's top-B as the CPU topk picks ties at zero, the engine's charge and acceptance of those slots, the
tail the plugin publishes, and its range check."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from sim.core.policies import StepBatch
from sim.core.policies.common import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, rank_scores, survival, top_b_counts
from sim.core.policies.hybrid import alloc_hybrid_vllm, publish_n, vllm_top_b
from sim.engine.engine import Engine
from sim.engine.policies import sim_policy
from sim.infra.errors import ConfigError, SimulatorBug


def _scores(seed: int, R: int = 6, W: int = 12):
    g = torch.Generator().manual_seed(seed)
    sched = torch.randint(0, W + 1, (R,), generator=g)
    length = torch.minimum(torch.randint(0, W + 1, (R,), generator=g), sched)
    conf = torch.rand(R, W, generator=g) * (torch.rand(R, W, generator=g) > 0.2)  # some exact zeros inside too
    conf = conf * (torch.arange(W)[None] < length[:, None])  # 0 past the chosen chain, as the plugin publishes
    return rank_scores(survival(conf, sched), sched), sched


def test_vllm_top_b_counts_every_admitted_slot_whatever_the_ties_pick():
    for seed in range(40):
        scores, sched = _scores(seed)
        total = int(sched.sum())
        positive = (scores > 0).sum(1)
        for b in range(0, total + 3):
            got = vllm_top_b(scores, torch.tensor(b), sched)
            assert int(got.sum()) == min(b, total)  # the charge counts every slot the top-B admits
            assert bool((got <= sched).all()) and bool((got >= 0).all())
            if b >= int(positive.sum()):  # every positive slot outranks every tie at zero
                assert bool((got >= positive).all())
            # on the positive slots it agrees with the simulator's stable top-B (they differ only among ties)
            stable = top_b_counts(scores, torch.tensor(b))
            assert int(torch.minimum(got, positive).sum()) == int(torch.minimum(stable, positive).sum())


def test_vllm_top_b_is_the_cpu_topk_over_the_flattened_survivals():
    scores = torch.tensor([[0.9, 0.0, 0.0, float("-inf")], [0.5, 0.0, 0.0, 0.0]])
    sched = torch.tensor([3, 4])
    b = 4  # two positive slots, two ties at zero
    want = torch.zeros(8, dtype=torch.bool).index_fill_(0, scores.flatten().topk(b).indices, True).view(2, 4).sum(1)
    assert torch.equal(vllm_top_b(scores, torch.tensor(b), sched), want)
    assert torch.equal(vllm_top_b(scores, torch.tensor(7), sched), sched)  # B >= scheduled: vLLM runs no top-B


def _stale_dspark_batch(R=3, K=7, W=16):
    """Last step published DSpark's 7 confident slots (stale n-gram chains empty); now each request has a short,
    sure n-gram chain: the one-step-old budget exceeds the positive slots now published."""
    mc = torch.full((R, K), 0.3)
    nc = torch.full((R, W), 0.99)
    return StepBatch(chains={"dspark": (mc, torch.full((R,), K)), "ngram": (nc, torch.full((R,), 3))},
                     stale_chains={"dspark": (torch.full((R, K), 0.95), torch.full((R,), K)),
                                   "ngram": (nc, torch.zeros(R, dtype=torch.int64))}, num_nondraft_tokens=R,
                     verify_cost_ms=torch.full((R * (W + 1) + 2,), 5.0, dtype=torch.float64), draft_cost_ms=1.0)


def test_fill_vllm_reports_the_slots_vllm_verifies_past_the_chosen_chain():
    b = _stale_dspark_batch()
    cut = alloc_hybrid_vllm(b, slots=16)
    full = alloc_hybrid_vllm(b, slots=16, fill="vllm")
    assert cut.verified is None
    assert torch.equal(full.admitted, cut.admitted)  # the chain's own slots are the same
    assert bool((full.admitted == 3).all()) and bool((full.chain == 2).all())  # the n-gram chains, whole
    # a flat verify table: the budget from last step's DSpark chains is their 3 x 7 slots, 9 of them positive
    # now, so vLLM verifies 12 slots past the 3-slot chains, in whichever rows its topk picks among the zeros
    # (DSpark's own tokens there: the model pass ran)
    assert int(full.verified.sum()) == 3 * 7 and bool((full.verified >= full.admitted).all())
    assert bool((full.verified > full.admitted).any()) and bool((full.past_chain == CHAIN_MODEL).all())


def _engine_view(m_acc):
    return NS(tb=NS(m_acc=np.asarray(m_acc)))


def test_the_engine_accepts_the_model_chains_own_tokens_past_a_whole_chain_only():
    fill = torch.tensor([CHAIN_MODEL, CHAIN_MODEL, CHAIN_NONE, CHAIN_MODEL, CHAIN_MODEL])
    alloc = NS(verified=torch.tensor([6, 6, 6, 6, 2]), past_chain=fill)
    rows = np.arange(5)
    adm, acc = np.array([3, 3, 3, 3, 2]), np.array([3, 2, 3, 3, 2])
    chains = {"model_len": np.array([7, 7, 7, 4, 7])}
    past, got = Engine._past_chain(_engine_view([5, 7, 7, 7, 7]), alloc, rows, adm, acc, chains)
    assert past.tolist() == [3, 3, 3, 3, 0]
    # row 0: DSpark's tokens 3, 4 accepted (m_acc 5); row 1: the chain broke at 2; row 2: fillers; row 3: DSpark's
    # chain ends at 4; row 4: nothing past
    assert got.tolist() == [2, 0, 0, 1, 0]


def test_the_engine_refuses_another_chains_tokens_past_the_chain():
    alloc = NS(verified=torch.tensor([6, 6]), past_chain=torch.tensor([CHAIN_MODEL, CHAIN_NGRAM]))
    view = NS(tb=NS(m_acc=np.array([7, 7])), policy=NS(name="p"))
    with pytest.raises(SimulatorBug, match="chain 2's tokens"):
        Engine._past_chain(view, alloc, np.arange(2), np.array([3, 3]), np.array([3, 3]),
                           {"model_len": np.array([7, 7])})


def test_a_run_charging_the_slots_past_the_chain_is_lossless_and_counts_them():
    from conftest import LinearCost, random_requests
    from sim.core.drafters.calibration import KNOTS, NgramCalibrator
    from sim.core.drafters.model import ModelDrafterProfile
    from sim.core.drafters.ngram import NgramConfig
    from sim.core.drafters.tables import build_draft_tables
    from sim.engine.engine import EngineConfig

    def tables(seed):
        rng = np.random.default_rng(seed)
        reqs = random_requests(rng, 6, vocab=4, max_prompt=60, max_out=120)
        w = np.zeros(len(KNOTS) + 11)
        w[0], w[1] = 2.0, 1.0
        cfg = NgramConfig(n_min=1, n_max=3, k=8, ext_max=16)
        return build_draft_tables(reqs, cfg, ModelDrafterProfile(name="t", block=4), NgramCalibrator(w, cfg))

    out = {}
    for seed, spec in ((0, "hybrid-vllm:slots=8"), (0, "hybrid-vllm:slots=8:fill=vllm"),
                       (0, "hybrid-vllm:slots=8:tail=0.2"), (1, "hybrid-vllm:margin=0:fill=vllm")):
        tb = tables(seed)
        res = Engine(tb, np.zeros(6), sim_policy(spec),
                     LinearCost(), EngineConfig(batch_size=2, scheduler="vllm")).run()
        assert res.lossless, (spec, res.violation)  # the accepted past slots emit the trace's tokens
        out[spec] = res
    assert out["hybrid-vllm:slots=8"].past_slots is None
    past = out["hybrid-vllm:slots=8:fill=vllm"].past_slots
    assert past["slots"] > 0 and 0 < past["steps_with"] <= past["decode_steps"]
    assert past["accepted"] <= past["slots"]
    # DSpark's own tokens past a shorter n-gram chain are accepted in this run (seed 1, margin 0: 3 of 12 slots)
    past = out["hybrid-vllm:margin=0:fill=vllm"].past_slots
    assert 0 < past["accepted"] < past["slots"]


def test_the_tail_is_published_past_the_chosen_chain_only():
    confs = [torch.full((2, 4), 0.8), torch.full((2, 6), 0.9)]
    lens = [torch.tensor([4, 4]), torch.tensor([2, 5])]
    pub = publish_n(confs, lens, torch.tensor([False, True]), 6, tail=0.1)
    assert torch.allclose(pub[0], torch.tensor([0.8] * 4 + [0.1] * 2))  # DSpark's block, then the tail to W
    assert torch.allclose(pub[1], torch.tensor([0.9] * 5 + [0.1]))
    assert torch.equal(publish_n(confs, lens, torch.tensor([False, True]), 6)[1, 5:], torch.zeros(1))


def test_a_tail_out_of_range_is_one_line_and_exit_2():
    for bad in ("tail=0.7", "tail=-0.1", "fill=all"):
        r = subprocess.run([sys.executable, "-m", "sim.run", "--policy", f"hybrid-vllm:{bad}", "--limit", "1"],
                           capture_output=True, text=True)
        assert r.returncode == 2, (bad, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert bad.split("=")[0] in r.stderr
    with pytest.raises(ConfigError, match="dspark,ngram only"):
        sim_policy("hybrid-vllm:tail=0.1", "dspark,ngram,suffix")


def test_a_budget_from_the_current_publication_admits_nothing_past_the_chains():
    """budget=current (a what-if: what the one-step-old budget loses): B* of this step's publication never reaches
    past the positive slots on a flat table (a slot of survival 0 adds no tokens), so nothing past a chain is
    verified, where vLLM's stale budget verifies 12 slots there."""
    b = _stale_dspark_batch()
    cur = alloc_hybrid_vllm(b, slots=16, fill="vllm", budget="current")
    assert torch.equal(cur.verified, cur.admitted) and bool((cur.admitted == 3).all())
    assert sim_policy("hybrid-vllm:slots=16:budget=current").name == "hybrid-vllm:slots=16:budget=current"
    with pytest.raises(ConfigError, match="budget must be one of stale, current"):
        sim_policy("hybrid-vllm:budget=fresh")


@pytest.mark.parametrize("R", [1, 64])
def test_the_plugins_step_with_a_tail_stays_within_its_op_budget_and_uploads_nothing(R):
    from real.vllm_plugin import checks
    from real.vllm_plugin.config import HybridSpecConfig

    a = checks.audit_step(R, cfg=HybridSpecConfig(tail=0.05))
    assert a["h2d"] == []
    for half, cap in checks.MAX_STEP_OPS.items():
        assert 0 < a[half] <= cap, (half, a[half])


def test_the_past_slots_command_tables_the_stale_budget_loss_and_refuses_bad_input(tmp_path):
    from sim.api import past_slots as P

    assert P.variants("hybrid-vllm", (0.1,)) == ["hybrid-vllm:fill=vllm", "hybrid-vllm:fill=vllm:budget=current",
                                                 "hybrid-vllm:tail=0.1", "hybrid-vllm:tail=0.1:budget=current"]
    rows = [{"batch_size": 4, "policy": p, "tok_s": v, "decode_steps": 10, "steps_with": 5, "slots": 7, "accepted": 1}
            for p, v in zip(P.variants("hybrid-vllm", ()), (90.0, 100.0))]
    text = P.table(rows)
    assert "| 4 | `hybrid-vllm:fill=vllm` | 90.0 | 50.0% | 7 | 1 | 10.00% |" in text
    for extra, needle in ((["--tail", "0.7"], "tail must be"), (["--setting", "adaptive"], "--setting"),
                          (["--trace", str(tmp_path / "no.jsonl")], "--trace"), (["--limit", "0"], "--limit")):
        r = subprocess.run([sys.executable, "-m", "sim.past_slots", *extra], capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_new_requests_reset_row_is_w_wide():
    """vLLM's add_request writes 1.0 into all W slots of a new request's stale row; the engine's K-wide model row of
    exact 1.0s (its reset) stands for it, so at W > K the one-step-old budget sees W sure slots, not K and zeros."""
    R, K, W = 2, 4, 16
    mc = torch.full((R, K), 0.6)
    stale = torch.tensor([[1.0] * K, [0.6] * K])  # row 0: the reset; row 1: a chain DSpark published
    b = StepBatch(chains={"dspark": (mc, torch.full((R,), K)), "ngram": (torch.zeros(R, W), torch.zeros(R, dtype=torch.int64))},
                  stale_chains={"dspark": (stale, torch.full((R,), K)),
                                "ngram": (torch.zeros(R, W), torch.zeros(R, dtype=torch.int64))},
                  num_nondraft_tokens=R, verify_cost_ms=10.0 + torch.arange(R * (W + 1) + 2, dtype=torch.float64),
                  draft_cost_ms=0.0)
    from sim.core.policies.hybrid import reset_rows

    assert reset_rows(stale).tolist() == [True, False]
    out = alloc_hybrid_vllm(b, slots=W, fill="vllm")
    # every reset slot earns 1 for 1 ms, more than the step's goodput: B* = the W reset slots (5 while the reset
    # row was K wide: K sure slots, then row 1's first)
    assert int(out.verified.sum()) == W
