"""hybrid-tree: the primary branch is hybrid-price's; the second branch appears only where slots are cheap."""
import numpy as np
import pytest
import torch

from sim.infra.errors import ConfigError
from sim.core.policies import CHAIN_NONE, StepBatch, get_policy
from sim.core.policies.hybrid import price_core
from sim.core.policies.testing import random_batch
from sim.core.policies.tree import tree_alloc


def _flat(batch, per_token):
    n = batch.verify_cost_ms.shape[0]
    batch.verify_cost_ms = torch.tensor(10.0 + per_token * np.arange(n), dtype=torch.float64)
    return batch


@pytest.mark.parametrize("seed", range(20))
def test_primary_is_hybrid_price_and_second_is_bounded(seed):
    rng = np.random.default_rng(seed)
    b = random_batch(rng, int(rng.integers(1, 6)), int(rng.integers(1, 8)), int(rng.integers(1, 12)))
    t = tree_alloc(b)
    p = price_core(b)
    assert torch.equal(t.chain, p.chain) and torch.equal(t.admitted, p.admitted)
    other_len = torch.where(t.chain == 2, b.chains["dspark"][1], b.chains["ngram"][1])
    assert (t.second >= 0).all() and (t.second <= other_len).all()
    assert (t.second[t.chain == CHAIN_NONE] == 0).all()


def test_free_slots_verify_both_chains_and_expensive_slots_do_not():
    rng = np.random.default_rng(0)
    b = random_batch(rng, 4, 5, 8, max_tokens=200, lengths_vary=False)
    free = tree_alloc(_flat(b, 0.0))
    assert (free.second > 0).sum() >= 3  # nearly everything that adds expected tokens is verified
    dear = tree_alloc(_flat(b, 50.0))
    assert dear.second.sum() == 0


@pytest.mark.extended
def test_compiles_fullgraph():
    """Compiled as an engine would: a function of tensors only, with fullgraph=True (no host sync)."""
    def fn(mc, ml, nc, nl, table, nnt, dms):
        chains = {"dspark": (mc, ml), "ngram": (nc, nl)}
        b = StepBatch(chains=chains, stale_chains=chains, num_nondraft_tokens=nnt, verify_cost_ms=table,
                      draft_cost_ms=dms)
        a = tree_alloc(b)
        return a.chain, a.admitted, a.second

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    rng = np.random.default_rng(1)
    b = random_batch(rng, 3, 4, 6, max_tokens=96)
    args = (*b.chains["dspark"], *b.chains["ngram"], b.verify_cost_ms, b.num_nondraft_tokens, b.draft_cost_ms)
    for want, got in zip(fn(*args), compiled(*args)):
        assert torch.equal(want, got)


def test_names():
    assert get_policy("hybrid-tree").name == "hybrid-tree"
    assert get_policy("hybrid-tree:model-opt:discount=1").name == "hybrid-tree:model-opt:discount=1"
    for bad in ("hybrid-tree:newton", "hybrid-tree:discount=2", "hybrid-tree:discount=x"):
        with pytest.raises(ConfigError):
            get_policy(bad)
