"""Policies under the real engine's fixed-shape contract: a batch padded to a fixed number of rows
(padding rows: empty chains, zero confidences) with per-step scalars as 0-d tensors gives the real rows
the same allocation as the unpadded batch, and a compiled policy runs 50 steps of changing batch
composition (1..16 live requests, changing token counts and costs) without one recompilation."""
import numpy as np
import pytest
import torch

from sim.core.policies import adaptive, hybrid
from sim.core.policies.base import StepBatch
from sim.core.policies.testing import random_batch

R_MAX, K_M, K_N = 16, 7, 8  # 16 x 15 slots <= hybrid.SWEEP_EXACT_MAX: padded and unpadded take the exact sweep
POLICIES = {
    "adaptive": adaptive.alloc_adaptive,
    "hybrid-price": lambda b: hybrid.price_with_budget(b, "sweep"),
    "hybrid": lambda b: hybrid.price_skip(b, "sweep"),
}


def _pad(b: StepBatch, rows: int) -> tuple:
    """The padded tensors: rows past the live ones have length 0 and confidence 0."""
    def p(t, fill=0):
        out = torch.full((rows,) + tuple(t.shape[1:]), fill, dtype=t.dtype)
        out[: t.shape[0]] = t
        return out

    return (*(p(t) for chains in (b.chains, b.stale_chains) for name in ("dspark", "ngram") for t in chains[name]),
            b.verify_cost_ms,
            torch.tensor(b.num_nondraft_tokens), torch.tensor(float(b.draft_cost_ms)),
            torch.tensor(b.num_reqs))


def _fn(policy):
    def run(mc, ml, nc, nl, smc, sml, snc, snl, table, nondraft, draft_ms, live):
        b = StepBatch(chains={"dspark": (mc, ml), "ngram": (nc, nl)}, stale_chains={"dspark": (smc, sml),
                      "ngram": (snc, snl)}, num_nondraft_tokens=nondraft, verify_cost_ms=table, draft_cost_ms=draft_ms,
                      num_sampling_reqs=live)
        a = policy(b)
        return a.chain, a.admitted
    return run


def _batches(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield random_batch(rng, int(rng.integers(1, R_MAX + 1)), K_M, K_N, max_tokens=R_MAX * (1 + K_N) + 1, step=False)


@pytest.mark.parametrize("name", list(POLICIES))
def test_padding_rows_change_nothing(name):
    fn = POLICIES[name]
    for b in _batches(40, seed=1):
        want = fn(b)
        got_chain, got_adm = _fn(fn)(*_pad(b, R_MAX))
        R = b.num_reqs
        assert torch.equal(got_chain[:R], want.chain) and torch.equal(got_adm[:R], want.admitted), name
        assert (got_adm[R:] == 0).all(), name


@pytest.mark.extended
@pytest.mark.parametrize("name", ["adaptive", "hybrid-price"])
def test_no_recompilation_over_50_steps(name):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(_fn(POLICIES[name]), fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for b in _batches(50, seed=2):
            want = POLICIES[name](b)
            chain, adm = compiled(*_pad(b, R_MAX))
            R = b.num_reqs
            assert torch.equal(chain[:R], want.chain) and torch.equal(adm[:R], want.admitted), name
