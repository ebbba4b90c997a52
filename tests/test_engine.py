"""Engine invariants on random traces: every token emitted exactly once, lossless, preemption-safe."""
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import LinearCost, plausible_calibrator, random_requests
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import build_draft_tables
from sim.engine.engine import Engine, EngineConfig, LosslessError
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy
from sim.core.policies.base import CHAIN_MODEL, Allocation

POLICIES = ["none", "model-fixed:3", "ngram-fixed:4", "adaptive", "ngram-first", "ngram-threshold", "hybrid-price",
            "hybrid-tree", "oracle"]
CFG = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)
PROFILE = ModelDrafterProfile(name="t", block=4)


def _calib():
    return plausible_calibrator(CFG)


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
        res = Engine(tb, arrivals, sim_policy(policy), LinearCost(), cfg).run()
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
    res = Engine(tb, np.zeros(len(reqs)), sim_policy("hybrid-price"), LinearCost(),
                 EngineConfig(batch_size=6, kv_capacity_tokens=cap)).run()
    assert res.lossless
    assert res.requests["preemptions"].sum() > 0


def test_oracle_emits_at_least_as_much_per_step_as_adaptive():
    rng = np.random.default_rng(2)
    reqs = random_requests(rng, 6, max_out=200)
    tb = _tables(reqs)
    steps = {}
    for p in ("adaptive", "oracle", "none"):
        res = Engine(tb, np.zeros(len(reqs)), sim_policy(p), LinearCost(), EngineConfig(batch_size=2)).run()
        steps[p] = res.requests["decode_steps"].sum()
    assert steps["oracle"] <= steps["adaptive"] < steps["none"]


def test_host_sync_adds_a_bubble():
    rng = np.random.default_rng(3)
    reqs = random_requests(rng, 3)
    tb = _tables(reqs)
    pol = sim_policy("none")
    a = Engine(tb, np.zeros(3), pol, LinearCost(), EngineConfig(batch_size=3)).run()
    s = Engine(tb, np.zeros(3), pol, LinearCost(), EngineConfig(batch_size=3, async_scheduling=False)).run()
    assert s.sim_time_s > a.sim_time_s
    assert s.steps["bubble_ms"].sum() > 0


# ---- planted bugs: each must make the run lossy (RunResult.lossless False, with the reason) ----------------
def _bug_tables(seed: int = 4):
    """Tables of copy-heavy requests (many n-gram hits, model chains of every accepted length)."""
    rng = np.random.default_rng(seed)
    reqs = random_requests(rng, 4, max_prompt=60, max_out=120, copy=True)
    return reqs, _tables(reqs)


def _run(tb, policy, engine_cls=Engine, bs=2):
    return engine_cls(tb, np.zeros(len(tb.out_len)), policy if not isinstance(policy, str) else sim_policy(policy),
                      LinearCost(), EngineConfig(batch_size=bs)).run()


def _positions(tb) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the output position i and the output tokens left (L - i)."""
    req = np.repeat(np.arange(len(tb.out_len)), tb.out_len)
    i = np.arange(len(req)) - tb.offsets[req]
    return i, tb.out_len[req] - i


def test_clean_tables_are_lossless():
    _, tb = _bug_tables()
    for p in ("model-fixed:4", "ngram-fixed:6", "hybrid-tree", "oracle"):
        res = _run(tb, p)
        assert res.lossless and res.violation == ""


def test_model_tokens_match_the_accepted_prefix_only():
    reqs, tb = _bug_tables()
    out = np.concatenate([r.output_ids for r in reqs])
    _, left = _positions(tb)
    j = np.arange(tb.k_model)[None, :]
    tgt = np.where(j < left[:, None], out[np.minimum(np.arange(len(out))[:, None] + j, len(out) - 1)], -1)
    # greedy verification of the proposed tokens over the chain's valid slots (j < tokens left)
    lead = np.cumprod((tb.m_tok == tgt) & (j < left[:, None]), axis=1).sum(axis=1)
    assert (lead == np.minimum(tb.m_acc, left)).all()


def test_inflated_model_acceptance_is_caught():
    _, tb = _bug_tables()
    _, left = _positions(tb)
    hit = tb.m_acc < np.minimum(tb.k_model, left)  # slot m_acc exists and the drafter got it wrong
    assert hit.any()
    tb.m_acc[hit] += 1
    res = _run(tb, "model-fixed:4")
    assert not res.lossless and "the target's is" in res.violation


def test_inflated_ngram_acceptance_is_caught():
    _, tb = _bug_tables()
    hit = tb.ng_acc < tb.ng_len  # (at the chain's end the engine's admission cap already bounds it)
    assert hit.any()
    tb.ng_acc[hit] += 1  # one token past the real match: that chain token differs from the target's
    res = _run(tb, "ngram-fixed:6")
    assert not res.lossless and "the target's is" in res.violation


@pytest.mark.parametrize("shift", [-1, 1])
def test_wrong_ngram_source_is_caught(shift):
    _, tb = _bug_tables()
    hit = (tb.ng_acc > 0) & (tb.ng_start + shift >= 0)
    assert hit.any()
    tb.ng_start[hit] += shift
    res = _run(tb, "ngram-fixed:6")
    assert not res.lossless


@pytest.mark.parametrize("base,field", [("model-fixed:4", "admitted"), ("ngram-fixed:6", "admitted"),
                                        ("hybrid-tree", "second")])
def test_over_admitting_policy_is_caught(base, field):
    _, tb = _bug_tables()
    pol = sim_policy(base)

    def greedy(batch):  # one draft token more than the chain holds wherever it drafts
        a = pol.fn(batch)
        extra = (a.admitted > 0).long()
        if field == "admitted":
            return Allocation(a.chain, a.admitted + extra, a.second)
        full = torch.where(a.chain == CHAIN_MODEL, batch.chains["ngram"][1], batch.chains["dspark"][1])
        return Allocation(a.chain, a.admitted, full + extra)

    res = _run(tb, dataclasses.replace(pol, fn=greedy))
    assert not res.lossless and "more draft tokens than its chain holds" in res.violation


class _SkipOnce(Engine):
    """Advances one request's position twice on its first multi-token write: a token is skipped."""

    planted = False

    def _write(self, reqs, counts, dst, tokens):
        super()._write(reqs, counts, dst, tokens)
        if not self.planted and counts.max() > 1:
            self.pos[reqs[np.argmax(counts)]] += 1
            self.planted = True


class _RepeatOnce(Engine):
    """Does not advance one request's position once: its tokens are emitted again next step."""

    planted = False

    def _write(self, reqs, counts, dst, tokens):
        super()._write(reqs, counts, dst, tokens)
        if not self.planted and counts.max() > 1:
            k = np.argmax(counts)
            self.pos[reqs[k]] -= counts[k]
            self.planted = True


@pytest.mark.parametrize("engine_cls,needle", [(_SkipOnce, "never emitted"), (_RepeatOnce, "emitted twice")])
def test_skipped_or_duplicated_emission_is_caught(engine_cls, needle):
    _, tb = _bug_tables()
    res = _run(tb, "hybrid-price", engine_cls)
    assert engine_cls.planted or res.steps["emitted"].max() > 1
    assert not res.lossless and needle in res.violation


def test_lossy_result_raises_one_line():
    _, tb = _bug_tables()
    tb.ng_acc[tb.ng_acc < tb.ng_len] += 1
    res = _run(tb, "ngram-fixed:6")
    with pytest.raises(LosslessError) as ei:
        res.raise_if_lossy("policy ngram-fixed:6 at batch size 2")
    assert "not lossless" in str(ei.value) and "\n" not in str(ei.value)
    assert _run(_bug_tables()[1], "ngram-fixed:6").raise_if_lossy().lossless


def test_request_that_never_fits_is_refused():
    rng = np.random.default_rng(6)
    reqs = random_requests(rng, 2)
    with pytest.raises(ConfigError, match="can never run"):
        Engine(_tables(reqs), np.zeros(2), sim_policy("none"), LinearCost(), EngineConfig(kv_capacity_tokens=8))


def test_held_steps_are_flushed_without_changing_the_clock(monkeypatch):
    """Between arrivals (and after the last) the engine runs ahead of simpy's clock, holding the steps' delays,
    and flushes them every HELD_MAX steps (else an offline trace would hold every step of the run): to the same
    times, so the same steps and the same arrival handling after an idle gap."""
    import sim.engine.engine as engine_mod

    rng = np.random.default_rng(11)
    reqs = random_requests(rng, 6, max_prompt=60, max_out=200)
    tb = _tables(reqs)
    runs = []
    for held_max in (engine_mod.HELD_MAX, 3):
        monkeypatch.setattr(engine_mod, "HELD_MAX", held_max)
        # steps of ~6 ms: arrivals while it runs (their order with the held steps matters), and after it idles
        runs.append(Engine(tb, np.array([0.0, 0.0, 0.05, 0.1, 0.2, 5.0]), sim_policy("hybrid-price"), LinearCost(),
                           EngineConfig(batch_size=2)).run())
    (a, b), n = runs, len(runs[0].steps["t_start_ms"])
    assert a.steps["t_start_ms"][-1] > 5000.0 > a.steps["t_start_ms"][20]  # an idle gap, then more steps
    assert n > 3 * 3
    for cols in ("steps", "requests"):
        x, y = getattr(a, cols), getattr(b, cols)
        for k in x:
            assert np.asarray(x[k]).tobytes() == np.asarray(y[k]).tobytes(), (cols, k)


def test_lossless_check_names_the_request_and_position():
    """check_lossless against the trace's output (sim.core.drafters.tables.expected_outputs, kept per tables object):
    the first wrong slot's request and output position, for a token never written and for a wrong one."""
    _, tb = _bug_tables()
    eng = Engine(tb, np.zeros(len(tb.out_len)), sim_policy("hybrid-price"), LinearCost(), EngineConfig(batch_size=2))
    assert eng.run().lossless and eng.check_lossless() == ""
    r = len(tb.out_len) - 1
    k = int(tb.offsets[r]) + 3
    good = int(eng.emitted_tokens[k])
    eng.emitted_tokens[k] = -1
    assert eng.check_lossless() == f"request {r} output position 3: never emitted"
    eng.emitted_tokens[k] = good + 1
    assert eng.check_lossless() == f"request {r} output position 3: emitted token {good + 1}, the target's is {good}"
    eng.emitted_tokens[k] = good
    eng.emitted_tokens[int(tb.offsets[1])] = -1
    assert eng.check_lossless() == "request 1 output position 0: never emitted"
