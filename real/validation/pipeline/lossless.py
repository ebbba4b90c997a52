"""Lossless, as a reduced-precision engine can keep it: a run's outputs against the reference's, token for token.

At temperature 0 speculative decoding must reproduce plain greedy decoding. In fp32 (the torch engine, vLLM's CPU
build) it does exactly. In bf16 on a GPU the target's logits at one position depend slightly on the shape of the
forward that computed them (how many tokens were verified together, which CUDA graph ran), so where the reference's
two best tokens are nearly tied a harmless flip of the argmax is possible. The rule:

    margin(i, j) = logit_top1 - logit_top2 of the reference at request i, output position j    [nats]
                   (= logprob_top1 - logprob_top2: the softmax's normaliser cancels)
    a run's first mismatch in request i, at position j, is
        a tie flip     when margin(i, j) < epsilon (both tokens were within epsilon: a rounding-order choice);
                       the rest of that request is not compared (its context now differs legitimately)
        a mismatch     otherwise, or when no margin was recorded at j
    lossless  <=>  no mismatch (tie flips are counted and reported, and do not stop a run)

epsilon (DEFAULT_TIE_EPSILON, --tie-epsilon) is stated in every cell's record. bf16 keeps 8 bits of mantissa, so a
logit near 20 carries about 0.08 of rounding, and a different reduction order over a 4096-wide hidden state moves it
by a few of those; 0.25 nats stays above that and far below the margins of ordinary greedy choices. Without margins
(margins=None) the comparison is exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_TIE_EPSILON = 0.25  # nats (module docstring)


@dataclass(frozen=True)
class Divergence:
    """One request's first difference: request index, output position, the reference's and the run's token there
    (None past the end) and the reference's top-2 margin at it (None: not recorded)."""

    request: int
    position: int
    reference: int | None
    got: int | None
    margin: float | None

    def to_json(self) -> dict:
        return {"request": self.request, "position": self.position, "reference": self.reference, "got": self.got,
                "margin": self.margin}


@dataclass(frozen=True)
class LosslessResult:
    """The comparison of one run with the reference (module docstring)."""

    requests: int
    tokens: int
    epsilon: float | None  # None: exact comparison (no margins)
    tie_flips: tuple[Divergence, ...] = field(default_factory=tuple)
    mismatches: tuple[Divergence, ...] = field(default_factory=tuple)
    count_error: str | None = None  # the run returned another number of outputs

    @property
    def lossless(self) -> bool:
        return self.count_error is None and not self.mismatches

    @property
    def exact(self) -> bool:
        return self.lossless and not self.tie_flips

    def detail(self, reference: str = "reference", run: str = "run") -> str:
        """One line: what differs, or how much was equal."""
        if self.count_error:
            return self.count_error
        flips = (f"; {len(self.tie_flips)} tie flip(s) below the margin {self.epsilon:g}" if self.tie_flips else "")
        if not self.mismatches:
            return f"{self.requests}/{self.requests} requests equal ({self.tokens} tokens){flips}"
        d = self.mismatches[0]
        why = "no margin recorded" if d.margin is None else f"margin {d.margin:.3f}"
        return (f"{len(self.mismatches)}/{self.requests} requests differ; request {d.request} first at output token "
                f"{d.position} ({reference} {'end' if d.reference is None else d.reference}, "
                f"{run} {'end' if d.got is None else d.got}; {why}){flips}")

    def to_json(self) -> dict:
        return {"lossless": self.lossless, "exact": self.exact, "epsilon": self.epsilon, "requests": self.requests,
                "tokens": self.tokens, "tie_flips": [d.to_json() for d in self.tie_flips],
                "mismatches": [d.to_json() for d in self.mismatches], "count_error": self.count_error}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first output token where a and b differ (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(ref: list[list[int]], got: list[list[int]], margins: list[list[float]] | None = None,
                    epsilon: float = DEFAULT_TIE_EPSILON) -> LosslessResult:
    """The run's outputs `got` against the reference's `ref`, request by request (module docstring). margins:
    the reference's top-2 margin per request and output position (None: exact comparison)."""
    n_tok = int(sum(len(r) for r in ref))
    eps = None if margins is None else float(epsilon)
    if len(ref) != len(got):
        return LosslessResult(len(ref), n_tok, eps, count_error=f"{len(got)} outputs for {len(ref)} requests")
    flips, bad = [], []
    for i, (r, g) in enumerate(zip(ref, got)):
        j = first_divergence(list(r), list(g))
        if j is None:
            continue
        m = None
        if margins is not None and i < len(margins) and j < len(margins[i]):
            v = margins[i][j]
            m = float(v) if v is not None and math.isfinite(float(v)) else None
        d = Divergence(i, j, int(r[j]) if j < len(r) else None, int(g[j]) if j < len(g) else None, m)
        both_tokens = d.reference is not None and d.got is not None  # a length difference is never a tie
        (flips if eps is not None and m is not None and both_tokens and m < eps else bad).append(d)
    return LosslessResult(len(ref), n_tok, eps, tuple(flips), tuple(bad))


def top2_margins(logprobs_per_position: list[dict | None]) -> list[float | None]:
    """The top-2 margins of one request from its per-position top logprobs ({token: logprob}, as an engine returns
    with logprobs=2): logprob_1 - logprob_2, None where fewer than two were returned."""
    out: list[float | None] = []
    for lp in logprobs_per_position:
        vals = sorted((float(v) for v in (lp or {}).values()), reverse=True)
        out.append(vals[0] - vals[1] if len(vals) >= 2 else None)
    return out
