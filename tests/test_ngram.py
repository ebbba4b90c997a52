"""The vectorised n-gram drafter against a brute-force search of the same matching rule."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.core.drafters.ngram import NgramConfig, ngram_tables, propose_bruteforce
from sim.infra.errors import ConfigError


def _check(toks, P, cfg):
    tab = ngram_tables(np.asarray(toks), P, cfg)
    N = len(toks)
    for i in range(N - P):
        t = P + i
        n, e, prop = propose_bruteforce(np.asarray(toks[:t]), cfg)
        assert tab.n[i] == n and tab.start[i] == e and tab.length[i] == len(prop)
        acc = 0
        for j, x in enumerate(prop):
            if t + j < N and toks[t + j] == x:
                acc += 1
            else:
                break
        assert tab.acc_len[i] == acc
        if n:
            # the extended match really is a common suffix, and maximal (or capped)
            ext = tab.ext[i]
            assert ext >= n
            assert toks[t - ext:t] == toks[e - ext:e]
            assert ext == cfg.ext_max or e - ext == 0 or toks[t - ext - 1] != toks[e - ext - 1]
            assert tab.in_prompt[i] == (e < P)
            assert tab.occ[i] >= 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.data())
def test_matches_bruteforce(toks, data):
    P = data.draw(st.integers(0, len(toks)))
    n_min = data.draw(st.integers(1, 3))
    cfg = NgramConfig(n_min=n_min, n_max=data.draw(st.integers(n_min, 4)), k=data.draw(st.integers(1, 6)), ext_max=8)
    _check(toks, P, cfg)


def test_copy_heavy_output_is_accepted():
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 5000, 300)
    output = prompt[100:200]  # the output copies a span of the prompt
    tab = ngram_tables(np.concatenate([prompt, output]), len(prompt), NgramConfig(k=8))
    # after the first few tokens the copy is found and whole chains are accepted
    assert (tab.acc_len[5:90] == 8).all()
    assert tab.in_prompt[5:90].all()


def test_no_match_on_fresh_tokens():
    tab = ngram_tables(np.arange(50), 10, NgramConfig())
    assert (tab.length == 0).all() and (tab.acc_len == 0).all() and (tab.start == -1).all()


@pytest.mark.parametrize("kw", [dict(n_min=0), dict(n_min=3, n_max=2), dict(k=0), dict(ext_max=2)])
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        NgramConfig(**kw)
