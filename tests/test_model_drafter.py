"""The synthetic model drafter: calibration, discrimination, shared difficulty, determinism."""
import numpy as np
import pytest

from sim.drafters.calibration import auc, ece
from sim.drafters.model import ModelDrafterProfile, load_drafter_profile, request_seed, synth_model_chains
from sim.errors import ConfigError


def _chains(profile, L=20000, copy_frac=0.0, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random(L) < copy_frac
    return synth_model_chains(profile, mask, request_seed(seed, "x")), mask


def test_conditional_acceptance_matches_profile():
    p = ModelDrafterProfile(name="t", q1=(0.8, 0.97), decay=(0.98, 0.99))
    ch, _ = _chains(p)
    acc = ch.acc_len
    q = p.q()[0]
    for j in range(4):  # P(accept j+1 | first j accepted) = q_j
        reached = acc >= j
        est = (acc[reached] >= j + 1).mean()
        assert abs(est - q[j]) < 0.02, (j, est, q[j])


def test_confidence_calibrated_and_discriminative():
    p = ModelDrafterProfile(name="t", sigma=0.8)
    ch, _ = _chains(p)
    surv = np.cumprod(ch.conf.astype(np.float64), axis=1)
    lab = (ch.acc_len[:, None] >= np.arange(1, p.block + 1)[None, :]).astype(float)
    assert ece(surv.ravel(), lab.ravel()) < 0.02
    a = auc(ch.conf[:, 0].astype(float), (ch.acc_len >= 1).astype(float))
    assert 0.75 < a < 0.95
    # a miscalibrated head (temperature != 1) is measurably worse
    bad = ModelDrafterProfile(name="t", sigma=0.8, conf_temperature=2.5)
    ch2, _ = _chains(bad)
    surv2 = np.cumprod(ch2.conf.astype(np.float64), axis=1)
    lab2 = (ch2.acc_len[:, None] >= np.arange(1, p.block + 1)[None, :]).astype(float)
    assert ece(surv2.ravel(), lab2.ravel()) > ece(surv.ravel(), lab.ravel()) + 0.02


def test_copy_spans_accept_more_and_difficulty_is_shared():
    p = ModelDrafterProfile(name="t", rho=0.9)
    ch, mask = _chains(p, copy_frac=0.5)
    assert ch.acc_len[mask].mean() > ch.acc_len[~mask].mean() + 0.5
    # a chain that fails at its first token makes the chain one position earlier fail at its second
    # more often than independence would predict (the same hard token)
    fail1 = ch.acc_len[1:] == 0
    prev_reached2 = ch.acc_len[:-1] >= 1
    p_fail2_given = 1 - (ch.acc_len[:-1][fail1 & prev_reached2] >= 2).mean()
    p_fail2 = 1 - (ch.acc_len[:-1][prev_reached2] >= 2).mean()
    assert p_fail2_given > p_fail2 + 0.1


def test_draws_depend_only_on_seed_and_id():
    p = ModelDrafterProfile(name="t")
    m = np.zeros(50, dtype=bool)
    a = synth_model_chains(p, m, request_seed(3, "r1"))
    b = synth_model_chains(p, m, request_seed(3, "r1"))
    c = synth_model_chains(p, m, request_seed(4, "r1"))
    assert np.array_equal(a.conf, b.conf) and not np.array_equal(a.conf, c.conf)


def test_profiles_load_and_bad_names_fail():
    assert load_drafter_profile("dspark-qwen3-b7").block == 7
    with pytest.raises(ConfigError, match="unknown drafter profile"):
        load_drafter_profile("nope")
    with pytest.raises(ConfigError):
        ModelDrafterProfile(name="x", q1=(1.2, 0.9))
    for bad in (dict(q1=(0.5,)), dict(decay="x"), dict(sigma="1")):
        with pytest.raises(ConfigError):
            ModelDrafterProfile(name="x", **bad)
