"""vLLM's synthetic rejection sampling in the simulator (sim/core/drafters/synthetic.py): the rates resolved as vLLM
resolves them, the accepted lengths drawn by position with the chance the rates give, and a run whose tokens per step
are 1 + sum(rates) whatever the drafter, lossless by construction; bad rates are one line."""
import numpy as np
import pytest

from sim.core.drafters import synthetic as syn
from sim.infra.errors import ConfigError


def test_rates_are_resolved_as_vllm_resolves_them():
    assert syn.resolve_rates(7, length=3) == (1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert syn.resolve_rates(4, length=2.5) == (1.0, 0.5, 0.0, 0.0)
    assert syn.resolve_rates(3, length=4) == (1.0, 1.0, 1.0) and syn.resolve_rates(3, length=1) == (0.0, 0.0, 0.0)
    assert syn.resolve_rates(5, rates=[0.9, 0.5]) == (0.9, 0.5, 0.0, 0.0, 0.0)  # later positions 0
    assert syn.resolve_rates(2, rates=[0.9, 0.5, 0.2]) == (0.9, 0.5)
    np.testing.assert_allclose(syn.conditional([0.8, 0.4, 0.0, 0.0]), [0.8, 0.5, 0.0, 0.0])
    for kw, msg in (({"length": 9}, r"must be in \[1, 8\]"), ({"length": 0.5}, r"\[1, 8\]"),
                    ({"rates": [0.5, 0.7]}, "must not increase"), ({"rates": [1.2]}, r"in \[0, 1\]"),
                    ({"rates": [0.5], "length": 2}, "exactly one"), ({}, "exactly one")):
        with pytest.raises(ConfigError, match=msg):
            syn.resolve_rates(7, **kw)
    assert syn.parse_rates(" 1, 0.80,0.5 ") == "1,0.8,0.5" and syn.parse_rates(None) is None
    with pytest.raises(ConfigError, match="--synthetic-acceptance: expected rates"):
        syn.parse_rates("1,x")


def test_accepted_lengths_follow_the_rates_by_position():
    rates = (0.9, 0.6, 0.3, 0.1)
    A = syn.acceptance_lengths(200_000, rates, np.random.default_rng(0))
    # P(A >= j + 1) = a_j: the unconditional rates, within sampling error
    np.testing.assert_allclose([(A >= j + 1).mean() for j in range(4)], rates, atol=0.005)
    assert A.max() == 4 and A.min() == 0
    assert (syn.acceptance_lengths(50, (1.0, 1.0), np.random.default_rng(1)) == 2).all()
    # one draw per position: the length at o + 1 is the length at o less one while o's chain was accepted past 1
    B = syn.acceptance_lengths(1000, (1.0, 1.0, 1.0, 0.5), np.random.default_rng(2))
    assert set(np.unique(B)) == {3, 4}


def test_a_run_accepts_by_the_rates_whatever_the_drafter(tmp_path):
    from sim.api.run import SimSetup, prepare, run_one

    out = {}
    for rates in ("1,1,0.5", None):
        prep = prepare(SimSetup(trace="traces/codeedit.jsonl", limit=6, synthetic_acceptance=rates,
                                draft_tables="whole"))
        for pol in ("adaptive", "hybrid-vllm:slots=32", "vllm-ngram:7"):
            row, res = run_one(prep, pol, 4)
            assert res.lossless, res.violation
            out[rates, pol] = row["acceptance_length"]  # tokens per request per step: accepted + the bonus
    for pol in ("adaptive", "hybrid-vllm:slots=32"):  # every chain here is >= 3 long: 1 + 1 + 1 + 0.5
        assert out["1,1,0.5", pol] == pytest.approx(3.5, abs=0.08)
    assert out["1,1,0.5", "vllm-ngram:7"] < 3.5  # n-gram chains shorter than 3 cap what is accepted
    assert out[None, "adaptive"] != pytest.approx(out["1,1,0.5", "adaptive"], abs=0.01)


def test_chains_keep_their_length_past_the_output_end():
    """vLLM's drafters do not know max_tokens: the plugin publishes (and adaptive verification budgets on) whole
    chains near a request's end, so synthetic acceptance cuts what is accepted there, not the chains' lengths."""
    L, P = 5, 7
    rows = {"m_acc": np.zeros(L, dtype=np.int64), "ng_len": np.full(L, 6, dtype=np.int64),
            "m_conf": np.full((L, 4), 0.5), "tokens": np.arange(P + L)}
    out = syn.apply(rows, (1.0, 1.0, 1.0, 1.0), np.random.default_rng(0))
    left = L - np.arange(L)
    assert out["ng_len"].tolist() == [6] * L  # was cut to the output left
    assert out["ng_acc"].tolist() == np.minimum(4, left).tolist() and out["m_acc"].tolist() == out["ng_acc"].tolist()
    assert out["ng_start"].tolist() == (P + np.arange(L)).tolist()
