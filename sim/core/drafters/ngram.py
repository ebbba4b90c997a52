"""Exact model-free n-gram (prompt-lookup) drafter, precomputed for every output position of a request.

Matching rule (that of vLLM's GPU n-gram speculator; see docs/simulator.md):
at output position i the context is c = prompt + output[:i], of length t = P + i. For n from n_max down
to n_min, look for an earlier occurrence of the suffix c[t-n:t], i.e. an end e < t with c[e-n:e] = c[t-n:t];
take the largest n that has one and, for it, the rightmost such occurrence (largest e). The proposal is
the tokens that followed it, c[e : min(e + k, t)] (a chain of length 1..k; never past the context end).

At temperature 0 the target's output is fixed, so the proposal at position i, and the number of its
leading tokens equal to output[i:] (the accepted length), depend only on i. `ngram_tables` computes
them for all positions at once with rolling hashes and a stable sort: O(N log N) per n, vectorised,
instead of a Python search per step.

Per position it also records the features the n-gram calibrator uses:
  n        matched suffix length (0 = no match)
  ext      length of the match extended backwards past n_max (longest common suffix of c[:t] and c[:e]),
           capped at cfg.ext_max: how long the copy has been running
  occ      number of earlier occurrences of the matched n-gram in the context (>= 1 when matched)
  in_prompt whether the copied source starts inside the prompt
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.infra.errors import ConfigError

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class NgramConfig:
    """n-gram drafter settings: suffix lengths n in [n_min, n_max], chain length k (tokens)."""

    n_min: int = 2
    n_max: int = 5
    k: int = 32
    ext_max: int = 1024

    def __post_init__(self) -> None:
        for name in ("n_min", "n_max", "k", "ext_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ConfigError(f"n-gram drafter setting {name} must be an integer, got {v!r}")
        if not (1 <= self.n_min <= self.n_max):
            raise ConfigError(f"n-gram drafter needs 1 <= n_min <= n_max, got n_min={self.n_min} n_max={self.n_max}")
        if not (1 <= self.k <= 256):
            raise ConfigError(f"n-gram chain length k must be in 1..256, got {self.k}")
        if self.ext_max < self.n_max:
            raise ConfigError(f"ext_max ({self.ext_max}) must be >= n_max ({self.n_max})")


@dataclass
class NgramTable:
    """Proposals of the n-gram drafter at every output position i of one request (arrays of length L_out).

    start[i]   index in the full token sequence of the first proposed token (-1 = no proposal)
    length[i]  chain length (0 = no proposal)
    acc_len[i] leading proposal tokens equal to output[i:] (exact acceptance at temperature 0)
    n, ext, occ, in_prompt: calibrator features (see module docstring)
    """

    start: np.ndarray
    length: np.ndarray
    acc_len: np.ndarray
    n: np.ndarray
    ext: np.ndarray
    occ: np.ndarray
    in_prompt: np.ndarray

    def __len__(self) -> int:
        return len(self.length)


def _ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """h[e] = hash of tokens[e-n:e] for e in [n, N]; entries e < n are unique sentinels (never match)."""
    N = len(tokens)
    toks = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(N + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        acc = np.zeros(N - n + 1, dtype=np.uint64)
        for q in range(n):
            acc = acc * _HASH_BASE + toks[q : N - n + 1 + q]
    h[n:] = acc
    # Positions without a full n-gram get distinct values that cannot collide with each other.
    h[:n] = np.arange(n, dtype=np.uint64) ^ np.uint64(0xFFFFFFFFFFFFFF00)
    return h


def _previous_occurrence(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each e: the largest e' < e with h[e'] == h[e] (-1 if none), and how many such e' exist."""
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same = np.empty(len(h), dtype=bool)
    same[0] = False
    same[1:] = hs[1:] == hs[:-1]
    prev_sorted = np.where(same, np.concatenate(([-1], order[:-1])), -1)
    group_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(h))))
    rank_sorted = np.arange(len(h)) - group_start
    prev = np.empty(len(h), dtype=np.int64)
    occ = np.empty(len(h), dtype=np.int64)
    prev[order] = prev_sorted
    occ[order] = rank_sorted
    return prev, occ


def ngram_tables(tokens: np.ndarray, prompt_len: int, cfg: NgramConfig = NgramConfig()) -> NgramTable:
    """Precompute the n-gram proposal at every output position of one request.

    tokens: the full sequence prompt + output (int array, length N = P + L_out); prompt_len = P.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    N = len(tokens)
    P = int(prompt_len)
    L = N - P
    if L < 0:
        raise ConfigError(f"prompt_len {P} exceeds the sequence length {N}")
    t = np.arange(P, N, dtype=np.int64)  # context length at each output position
    best_e = np.full(L, -1, dtype=np.int64)
    best_n = np.zeros(L, dtype=np.int64)
    best_occ = np.zeros(L, dtype=np.int64)
    for n in range(cfg.n_max, cfg.n_min - 1, -1):
        if L == 0 or N < n + 1:
            continue
        h = _ngram_hashes(tokens, n)
        prev, occ = _previous_occurrence(h)
        cand = prev[t]
        todo = (best_e < 0) & (cand >= n) & (t >= n)
        if not todo.any():
            continue
        idx = np.nonzero(todo)[0]
        e = cand[idx]
        # Guard against hash collisions: keep only windows whose tokens really match.
        offs = np.arange(n)
        ok = (tokens[e[:, None] - n + offs] == tokens[t[idx][:, None] - n + offs]).all(axis=1)
        idx, e = idx[ok], e[ok]
        best_e[idx] = e
        best_n[idx] = n
        best_occ[idx] = occ[t[idx]]
    matched = best_e >= 0
    length = np.where(matched, np.minimum(cfg.k, t - best_e), 0)

    # Accepted length: leading proposal tokens equal to the output that follows.
    j = np.arange(cfg.k)
    src = np.where(matched, best_e, 0)[:, None] + j
    dst = t[:, None] + j
    valid = (j < length[:, None]) & (dst < N)
    eq = valid & (tokens[np.minimum(src, N - 1)] == tokens[np.minimum(dst, N - 1)])
    acc_len = np.cumprod(eq, axis=1).sum(axis=1)

    # Extended match: longest common suffix of c[:t] and c[:e], capped at ext_max. Compared in chunks of
    # 64 so that only the (few) positions still matching pay for the next chunk.
    ext = np.zeros(L, dtype=np.int64)
    live = np.nonzero(matched)[0]
    base = 0
    while len(live) and base < cfg.ext_max:
        q = base + np.arange(min(64, cfg.ext_max - base))
        a = t[live][:, None] - 1 - q
        b = best_e[live][:, None] - 1 - q
        same = (b >= 0) & (tokens[np.maximum(a, 0)] == tokens[np.maximum(b, 0)])
        run = np.cumprod(same, axis=1).sum(axis=1)
        ext[live] += run
        live = live[run == len(q)]
        base += len(q)

    return NgramTable(
        start=np.where(matched, best_e, -1).astype(np.int64),
        length=length.astype(np.int64),
        acc_len=acc_len.astype(np.int64),
        n=best_n,
        ext=ext.astype(np.int64),
        occ=best_occ,
        in_prompt=(matched & (best_e < P)),
    )


def propose_bruteforce(context: np.ndarray, cfg: NgramConfig) -> tuple[int, int, list[int]]:
    """Reference implementation of the matching rule for one context: (n, e, proposal). Slow; for tests
    and for engines that draft one step at a time on the CPU."""
    c = list(np.asarray(context).tolist())
    t = len(c)
    for n in range(cfg.n_max, cfg.n_min - 1, -1):
        if t < n + 1:
            continue
        suffix = c[t - n :]
        for e in range(t - 1, n - 1, -1):
            if c[e - n : e] == suffix:
                return n, e, c[e : min(e + cfg.k, t)]
    return 0, -1, []
