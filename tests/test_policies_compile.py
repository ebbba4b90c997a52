"""Every allocation function is host-sync free: it compiles with torch.compile(fullgraph=True) and
matches eager, and no policy source calls .item(), .cpu() or .tolist()."""
import pathlib
import re

import numpy as np
import pytest
import torch

from sim.core.policies import adaptive, hybrid, simple
from sim.core.policies.base import Plan, StepBatch
from sim.core.policies.testing import random_batch

POLICY_DIR = pathlib.Path(__file__).resolve().parents[1] / "sim" / "policies"


def test_no_host_sync_calls_in_policy_sources():
    bad = re.compile(r"\.(item|cpu|tolist)\(")
    offenders = []
    for path in sorted(POLICY_DIR.glob("*.py")):
        if path.name == "testing.py":  # test helpers (numpy reference), never on the policy path
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if bad.search(code) and "`" not in code:  # docstrings name the calls in backquotes
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert not offenders, "host syncs in policy code:\n" + "\n".join(offenders)


def _tensor_fn(fn):
    """Wrap fn(StepBatch) as a function of tensors only (what an engine would compile)."""
    def wrapped(mc, ml, nc, nl, smc, sml, snc, snl, table, tm, tn, num_nondraft_tokens, draft_cost_ms):
        b = StepBatch(chains={"dspark": (mc, ml), "ngram": (nc, nl)}, stale_chains={"dspark": (smc, sml),
                      "ngram": (snc, snl)}, num_nondraft_tokens=num_nondraft_tokens, verify_cost_ms=table,
                      draft_cost_ms=draft_cost_ms, true_acc={"dspark": tm, "ngram": tn})
        a = fn(b)
        return a.chain, a.admitted
    return wrapped


def _args(b):
    return (*b.chains["dspark"], *b.chains["ngram"], *b.stale_chains["dspark"], *b.stale_chains["ngram"], b.verify_cost_ms, b.true_acc.get("dspark"), b.true_acc.get("ngram"),
            b.num_nondraft_tokens, b.draft_cost_ms)


FAST = {  # one fast compile check in the extended tier (-m extended); the rest: -m slow
    "hybrid-price": lambda b: hybrid.price_with_budget(b, "sweep"),
}
SLOW = {
    "adaptive": adaptive.alloc_adaptive,
    # hybrid's device phase under either plan (its plan runs on the host, from host data: not compiled)
    "hybrid:allocate-with-model": lambda b: hybrid.allocate_skip(b, Plan(frozenset(("dspark", "ngram")), torch.tensor(6)), "sweep"),
    "hybrid:allocate-skipped": lambda b: hybrid.allocate_skip(b, Plan(frozenset(("ngram",)), torch.tensor(6)), "sweep"),
    "hybrid-vllm": lambda b: hybrid.alloc_hybrid_vllm(b, "sweep"),
    "adaptive:early-stop": adaptive.alloc_adaptive_early_stop,
    "hybrid-price:sweep:current": lambda b: hybrid.price_core(b, "sweep"),
    "hybrid-price:model-opt": lambda b: hybrid.price_with_budget(b, "model-opt"),
    "hybrid-price:fixed-point:current": lambda b: hybrid.price_core(b, "fixed-point"),
    "none": simple.alloc_none,
    "model-fixed:4": lambda b: simple.alloc_fixed(b, 4, simple.CHAIN_MODEL),
    "ngram-first": simple.alloc_ngram_first,
    "ngram-threshold": lambda b: simple.alloc_ngram_threshold(b, 2.0),
    "oracle": simple.alloc_oracle,
}


def _check_compiled(name, fn, sizes):
    torch._dynamo.reset()
    compiled = torch.compile(_tensor_fn(fn), fullgraph=True, dynamic=False)
    rng = np.random.default_rng(0)
    for r, km, kn, exact in sizes:
        if not exact:  # force the two-stage sweep path on a small batch
            hybrid.SWEEP_EXACT_MAX, saved = 0, hybrid.SWEEP_EXACT_MAX
        try:
            b = random_batch(rng, r, km, kn, max_tokens=96)
            want = _tensor_fn(fn)(*_args(b))
            got = compiled(*_args(b))
        finally:
            if not exact:
                hybrid.SWEEP_EXACT_MAX = saved
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name


@pytest.mark.extended
@pytest.mark.parametrize("name", list(FAST))
def test_compiles_fullgraph_and_matches_eager(name):
    _check_compiled(name, FAST[name], [(4, 7, 16, True)])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW) + ["hybrid-price-two-stage"])
def test_compiles_fullgraph_slow(name):
    if name == "hybrid-price-two-stage":
        _check_compiled(name, FAST["hybrid-price"], [(6, 5, 9, False)])
    else:
        _check_compiled(name, SLOW[name], [(5, 6, 11, True)])
