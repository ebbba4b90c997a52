"""Helpers to check and time policies: random StepBatches, expected goodput, brute-force optimum, timing."""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Optional

import numpy as np
import torch

from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM, MODEL, NGRAM, Allocation, StepBatch


def random_cost_table(rng: np.random.Generator, max_tokens: int = 64, step: bool | None = None) -> torch.Tensor:
    """A monotone verify table [ms]: fixed part + per-token part, optionally a CUDA-graph-like step function."""
    fixed = rng.uniform(2.0, 20.0)
    per_token = rng.uniform(0.005, 0.5) * fixed / 10
    t = np.arange(max_tokens + 1, dtype=np.float64)
    knee = rng.integers(0, max_tokens // 2 + 1)
    cost = fixed + per_token * np.maximum(t - knee, 0) + rng.uniform(0, 0.2) * per_token * t
    if step if step is not None else rng.random() < 0.5:
        bucket = int(rng.choice([2, 4, 8]))
        cost = cost[np.minimum((np.ceil(t / bucket) * bucket).astype(int), max_tokens)]
    return torch.tensor(np.maximum.accumulate(cost))


def random_batch(rng: np.random.Generator, num_reqs: int, k_m: int, k_n: int, max_tokens: int = 64,
                 lengths_vary: bool = True, step: bool | None = None) -> StepBatch:
    """A random step: confidences in (0, 1) (n-gram ones skewed high), random lengths, random cost table."""
    def conf(k, hi):
        return torch.tensor(rng.beta(hi, 1.0, size=(num_reqs, k)), dtype=torch.float32)

    def lens(k, allow_zero):
        if not lengths_vary:
            return torch.full((num_reqs,), k, dtype=torch.int64)
        return torch.tensor(rng.integers(0 if allow_zero else 1, k + 1, size=num_reqs), dtype=torch.int64)

    mc, nc = conf(k_m, rng.uniform(1, 6)), conf(k_n, rng.uniform(1, 12))
    ml, nl = lens(k_m, False), lens(k_n, True)
    return StepBatch(  # the arguments in the order the draws were always made
        chains={"dspark": (mc, ml), "ngram": (nc, nl)},
        stale_chains={"dspark": (conf(k_m, 3.0), lens(k_m, False)), "ngram": (conf(k_n, 6.0), lens(k_n, True))},
        num_nondraft_tokens=num_reqs, verify_cost_ms=random_cost_table(rng, max_tokens, step),
        draft_cost_ms=float(rng.uniform(0.0, 3.0)),
        true_acc={"dspark": torch.tensor(rng.integers(0, k_m + 1, size=num_reqs)),
                  "ngram": torch.tensor(rng.integers(0, k_n + 1, size=num_reqs))},
    )


def _np_surv(conf: torch.Tensor, length: torch.Tensor) -> np.ndarray:
    c = np.clip(conf.double().numpy(), 0, 1)
    s = np.cumprod(c, axis=1)
    s[np.arange(c.shape[1])[None, :] >= length.numpy()[:, None]] = 0.0
    return s


def expected_goodput(batch: StepBatch, alloc: Allocation) -> float:
    """Expected goodput (tokens/ms) of an allocation under the batch's current confidences (numpy, float64)."""
    sm, sn = _np_surv(*batch.chains[MODEL]), _np_surv(*batch.chains[NGRAM])
    chain, adm = alloc.chain.numpy(), alloc.admitted.numpy()
    gain = 0.0
    for r in range(batch.num_reqs):
        if chain[r] == CHAIN_MODEL:
            gain += sm[r, : adm[r]].sum()
        elif chain[r] == CHAIN_NGRAM:
            gain += sn[r, : adm[r]].sum()
    table = batch.verify_cost_ms.double().numpy()
    idx = min(batch.num_nondraft_tokens + int(adm.sum()), len(table) - 1)
    return (batch.num_reqs + gain) / (float(batch.draft_cost_ms) + table[idx])


def brute_force_goodput(batch: StepBatch) -> float:
    """max over every chain choice and prefix length per request of the expected goodput (small R, K)."""
    sm, sn = _np_surv(*batch.chains[MODEL]), _np_surv(*batch.chains[NGRAM])
    options = []  # per request: list of (slots, gain)
    for r in range(batch.num_reqs):
        opts = {(0, 0.0)}
        for surv, length in ((sm[r], int(batch.chains[MODEL][1][r])), (sn[r], int(batch.chains[NGRAM][1][r]))):
            cs = np.cumsum(surv)
            opts.update((l, float(cs[l - 1])) for l in range(1, length + 1))
        options.append(sorted(opts))
    # best gain for each total slot count, then the best ratio
    best = {0: 0.0}
    for opts in options:
        nxt: dict[int, float] = {}
        for (s0, g0), (s1, g1) in itertools.product(best.items(), opts):
            if nxt.get(s0 + s1, -1.0) < g0 + g1:
                nxt[s0 + s1] = g0 + g1
        best = nxt
    table = batch.verify_cost_ms.double().numpy()
    return max((batch.num_reqs + g) / (float(batch.draft_cost_ms) + table[min(batch.num_nondraft_tokens + s, len(table) - 1)])
               for s, g in best.items())


def time_call(fn, batch: StepBatch, repeat: int = 300, warmup: int = 20) -> float:
    """Median CPU time of one call in microseconds."""
    for _ in range(warmup):
        fn(batch)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(batch)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples) * 1e6)


def timing_table(specs: Optional[list[str]] = None, sizes=((4, 7, 32), (128, 7, 32))) -> str:
    """Markdown table of the per-call CPU time of each policy at the given (R, K_m, K_n)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-call times of tiny tensors; restored below, the caller's setting is its own
    try:
        return _timing_table(specs, sizes)
    finally:
        torch.set_num_threads(threads)


def _timing_table(specs: Optional[list[str]], sizes) -> str:
    from sim.core.policies.catalog import get_policy
    specs = specs or ["none", "model-fixed:7", "ngram-fixed:16", "adaptive", "adaptive:early-stop",
                      "ngram-first", "ngram-threshold", "oracle"] + [
        f"hybrid-price:{m}{c}" for m in ("model-opt", "fixed-point", "sweep") for c in ("", ":current")]
    rng = np.random.default_rng(0)
    batches = [random_batch(rng, r, km, kn, max_tokens=r * (km + kn) + r + 1) for r, km, kn in sizes]
    head = "| policy | " + " | ".join(f"R={r} K_m={km} K_n={kn} (us)" for r, km, kn in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 1)]
    for spec in specs:
        pol = get_policy(spec)
        lines.append(f"| {spec} | " + " | ".join(f"{time_call(pol, b):.0f}" for b in batches) + " |")
    return "\n".join(lines)



def replace_chain(batch: StepBatch, name: str, conf: Optional[torch.Tensor] = None,
                  length: Optional[torch.Tensor] = None, stale: bool = False) -> StepBatch:
    """A copy of `batch` whose drafter `name` has its current chain (its stale one where `stale`) given a new
    conf and/or length; the other entries are shared."""
    fld = "stale_chains" if stale else "chains"
    chains = getattr(batch, fld)
    old = chains.get(name, (None, None))
    new = (old[0] if conf is None else conf, old[1] if length is None else length)
    return dataclasses.replace(batch, **{fld: {**chains, name: new}})
