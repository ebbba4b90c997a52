"""The synthetic model drafter: calibration, discrimination, shared difficulty, determinism, causality."""
import numpy as np
import pytest

from sim.core.drafters.calibration import auc, ece
from sim.core.drafters.model import ModelDrafterProfile, load_drafter_profile, request_seed, synth_model_chains
from sim.infra.errors import ConfigError


def _chains(profile, L=20000, copy_frac=0.0, seed=0, ext=0):
    rng = np.random.default_rng(seed)
    mask = rng.random(L) < copy_frac
    return synth_model_chains(profile, mask, request_seed(seed, "x"), match_ext=np.full(L, ext)), mask


def _survival_ece(profile, ch):
    surv = np.cumprod(ch.conf.astype(np.float64), axis=1)
    lab = (ch.acc_len[:, None] >= np.arange(1, profile.block + 1)[None, :]).astype(float)
    return ece(surv.ravel(), lab.ravel())


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


def test_mixture_head_calibrated_when_prior_is_the_copy_rate():
    """Copy status unknown to the head, drawn at rate 0.6: the mixture over it with pi = 0.6 is calibrated;
    a head that assumes no copies (pi = 0) is not, and cannot tell copied tokens apart any better."""
    prior = tuple((0.6,) * 7 for _ in range(7))
    good = ModelDrafterProfile(name="t", copy_prior=prior)
    ch, mask = _chains(good, copy_frac=0.6, ext=10)
    assert _survival_ece(good, ch) < 0.02
    naive = ModelDrafterProfile(name="t")
    ch0, _ = _chains(naive, copy_frac=0.6, ext=10)
    assert _survival_ece(naive, ch0) > _survival_ece(good, ch) + 0.05
    assert np.array_equal(ch.acc_len, ch0.acc_len)  # the prior changes the head, never the acceptance


def test_copy_prior_follows_the_ext_bucket():
    rows = tuple(tuple([b / 10] * 7) for b in range(7))
    p = ModelDrafterProfile(name="t", copy_prior=rows)
    pi = p.copy_prob(np.array([0, 1, 3, 4, 7, 8, 63, 64, 5000]))
    assert pi[:, 0].tolist() == [0.0, 0.1, 0.1, 0.2, 0.2, 0.3, 0.5, 0.6, 0.6]
    assert ModelDrafterProfile(name="t").copy_prob(np.array([9])).tolist() == [[0.0] * 7]


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
    m, e = np.zeros(50, dtype=bool), np.zeros(50, dtype=np.int64)
    a = synth_model_chains(p, m, request_seed(3, "r1"), match_ext=e)
    b = synth_model_chains(p, m, request_seed(3, "r1"), match_ext=e)
    c = synth_model_chains(p, m, request_seed(4, "r1"), match_ext=e)
    assert np.array_equal(a.conf, b.conf) and not np.array_equal(a.conf, c.conf)


def test_profiles_load_and_bad_names_fail():
    assert load_drafter_profile("dspark-qwen3-b7").block == 7
    with pytest.raises(ConfigError, match="unknown drafter profile"):
        load_drafter_profile("nope")
    with pytest.raises(ConfigError):
        ModelDrafterProfile(name="x", q1=(1.2, 0.9))
    for bad in (dict(q1=(0.5,)), dict(decay="x"), dict(sigma="1"), dict(copy_prior=((0.5,) * 7,)),
                dict(copy_prior=tuple((1.5,) * 7 for _ in range(7))), dict(copy_prior_edges=(4, 1))):
        with pytest.raises(ConfigError):
            ModelDrafterProfile(name="x", **bad)


def _copying_request(rng, rid="c", prompt_len=200, spans=12, vocab=1000):
    """A request whose output alternates fresh tokens with spans copied from its prompt (an edit)."""
    from sim.core.trace.schema import Request

    prompt = rng.integers(1, vocab, prompt_len)
    out = []
    for _ in range(spans):
        out += list(rng.integers(1, vocab, int(rng.integers(3, 12))))
        s = int(rng.integers(0, prompt_len - 40))
        out += list(prompt[s : s + int(rng.integers(8, 40))])
    out = np.asarray(out)
    return Request(id=rid, prompt_ids=prompt, output_ids=out, prompt_len=prompt_len, output_len=len(out))


def test_confidences_do_not_depend_on_future_tokens():
    """The chain drafted at output position i sees prompt + output[:i] only: rewriting output[i:] may
    change what the target accepts (rows <= i), never the confidences (model head or n-gram calibrator)."""
    from dataclasses import replace

    from sim.core.drafters.calibration import NgramCalibrator
    from sim.core.drafters.ngram import NgramConfig
    from sim.core.drafters.tables import build_draft_tables

    cal = NgramCalibrator.load()
    cfg = NgramConfig(n_min=cal.cfg.n_min, n_max=cal.cfg.n_max, k=cal.cfg.k, ext_max=cal.cfg.ext_max)
    prof = load_drafter_profile("dspark-qwen3-b7")
    rng = np.random.default_rng(7)
    req = _copying_request(rng)
    base = build_draft_tables([req], cfg, prof, cal, seed=1)
    acc_changed = 0
    for i in (20, 90, 160, req.output_len - 30):
        out = req.output_ids.copy()
        out[i:] = rng.permutation(out[i:]) if i % 2 else rng.integers(1, 1000, len(out) - i)
        alt = build_draft_tables([replace(req, output_ids=out)], cfg, prof, cal, seed=1)
        np.testing.assert_array_equal(alt.m_conf[: i + 1], base.m_conf[: i + 1], err_msg=f"model head, cut {i}")
        np.testing.assert_array_equal(alt.ng_conf[: i + 1], base.ng_conf[: i + 1], err_msg=f"n-gram, cut {i}")
        acc_changed += int(np.any(alt.m_acc[: i + 1] != base.m_acc[: i + 1]))
    assert acc_changed >= 2  # the rewrite did change the world the rows <= i are scored against
